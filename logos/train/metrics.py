"""Training metrics: ``metrics.csv`` (one named row per log step, trimmed on resume) and the loss-curve PNG.

Columns: ``step``, ``tokens``, ``elapsed_s``, ``cpu_s`` (CPU seconds of the process), ``lr``, ``loss``,
``tokens_per_s``, ``val_loss``, then per domain of the corpus ``loss_<domain>``, ``val_loss_<domain>`` and ``tokens_<domain>`` (target tokens of
that domain counted in the loss so far: the mixture actually trained on). Rows are written by name
(``csv.DictWriter``), floats in full (a resumed run's losses compare exactly), and flushed as they are logged; a resumed run first drops the rows past its
checkpoint (and a torn last line), so every step appears once.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from logos.train.checkpoint import atomic_write_text

__all__ = ["MetricsLog", "truncate_metrics", "plot_losses", "plot_domain_losses"]

BASE_COLUMNS = ("step", "tokens", "elapsed_s", "cpu_s", "lr", "loss", "tokens_per_s", "val_loss")


def truncate_metrics(path: Path, step: int) -> int:
    """Drop the rows of a metrics CSV after ``step`` (and any torn last line); atomic rewrite; rows dropped."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        return 0
    header, body = rows[0], rows[1:]
    kept = [r for r in body if len(r) == len(header) and r[0].isdigit() and int(r[0]) <= step]
    if len(kept) != len(body):
        buf = io.StringIO()
        csv.writer(buf).writerows([header] + kept)
        atomic_write_text(path, buf.getvalue())
    return len(body) - len(kept)


class MetricsLog:
    """Appends named rows to ``metrics.csv`` (rank 0 only); a context manager."""

    def __init__(self, path: Path, domains: list[str], resumed_at: int):
        self.path = Path(path)
        self.columns = list(BASE_COLUMNS) + [f"{kind}_{d}" for kind in ("loss", "val_loss", "tokens") for d in domains]
        fresh = resumed_at == 0 or not self.path.exists()
        if not fresh:  # rows past the checkpoint were logged by the killed run
            truncate_metrics(self.path, resumed_at)
        self._fh = open(self.path, "w" if fresh else "a", newline="")
        self._writer = csv.DictWriter(self._fh, fieldnames=self.columns, restval="")
        if fresh:
            self._writer.writeheader()

    def write(self, row: dict) -> None:
        self._writer.writerow({k: _fmt(v) for k, v in row.items()})
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "MetricsLog":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return "" if v != v else repr(float(v))  # NaN: not measured; else the shortest text that reads back exactly
    return str(v)


def plot_losses(metrics: Path, png: Path, title: str) -> None:
    """Training (and validation) loss against tokens, from ``metrics.csv``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(metrics, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        return
    tokens = [int(r["tokens"]) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    ax.plot(tokens, [float(r["loss"]) for r in rows], label="train")
    val = [(int(r["tokens"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
    if val:
        ax.plot(*zip(*val), "o-", label="validation")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def plot_domain_losses(metrics: Path, out_dir: Path, title: str) -> list[Path]:
    """One ``loss_DOMAIN.png`` per domain of a mixture run: that domain's training and validation loss against the
    tokens of it seen so far (``tokens_DOMAIN``); the written files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(metrics, newline="") as fh:
        rows = list(csv.DictReader(fh))
    domains = [k.removeprefix("loss_") for k in (rows[0] if rows else {}) if k.startswith("loss_")]
    written = []
    for d in domains:
        train = [(int(r[f"tokens_{d}"]), float(r[f"loss_{d}"])) for r in rows if r.get(f"loss_{d}") and r.get(f"tokens_{d}")]
        val = [(int(r[f"tokens_{d}"]), float(r[f"val_loss_{d}"])) for r in rows
               if r.get(f"val_loss_{d}") and r.get(f"tokens_{d}")]
        if not train and not val:
            continue
        fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
        if train:
            ax.plot(*zip(*train), lw=0.8, alpha=0.8, label="train")
        if val:
            ax.plot(*zip(*val), "o-", ms=3, label="validation")
        ax.set_xlabel(f"{d} tokens seen")
        ax.set_ylabel("loss (nats/token)")
        ax.set_title(f"{title}: {d}")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        png = Path(out_dir) / f"loss_{d}.png"
        fig.savefig(png)
        plt.close(fig)
        written.append(png)
    return written
