"""Statistics the evaluations share: Wasserstein-1 distance, Wilson and t intervals (scipy), Jensen-Shannon divergence."""

from __future__ import annotations

import numpy as np

__all__ = ["wasserstein", "js_divergence", "wilson", "mean_interval"]


def wasserstein(a, b) -> float | None:
    """Wasserstein-1 distance of two 1-D samples (``scipy.stats.wasserstein_distance``); None if either is empty."""
    from scipy.stats import wasserstein_distance

    return float(wasserstein_distance(a, b)) if len(a) and len(b) else None


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence (base 2, in [0, 1]) of two distributions.

    Written out rather than as ``scipy.spatial.distance.jensenshannon(p, q, base=2) ** 2``, which agrees to
    about 1e-16 but not bit for bit: reports of earlier versions stay byte-identical."""
    m = (p + q) / 2

    def kl(a, b):
        mask = a > 0
        return float(np.sum(a[mask] * np.log2(a[mask] / b[mask])))
    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def wilson(hits: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of the proportion ``hits / n`` (``scipy.stats.binomtest``); (0, 0) when ``n`` is 0."""
    from scipy.stats import binomtest

    if n == 0:
        return (0.0, 0.0)
    ci = binomtest(hits, n).proportion_ci(confidence, method="wilson")
    return (float(ci.low), float(ci.high))


def mean_interval(values, confidence: float = 0.95) -> tuple[float | None, list[float] | None]:
    """The mean of ``values`` and its Student t interval ([low, high]); (None, None) when empty, the mean and
    None for a single value."""
    import math

    from scipy.stats import t

    n = len(values)
    if n == 0:
        return None, None
    mean = float(np.mean(values))
    if n == 1:
        return mean, None
    half = float(t.ppf(0.5 + confidence / 2, n - 1) * np.std(values, ddof=1) / math.sqrt(n))
    return mean, [mean - half, mean + half]
