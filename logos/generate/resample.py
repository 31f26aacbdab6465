"""The resample queue of both engines' front ends: which sample to draw next, and what a finished draw becomes.

Each entry (:class:`Attempt`) is one sample asked for - a job, whatever the engine samples from (a prompt, an index
into its requests) - with how often it was drawn again. A draw that failed (a dead end, a budget run out, a constraint's
refusal once it ended) is drawn again up to ``resamples`` times. For tasks whose completion is a whole record, a
finished draw the model would not end the document after (rejection sampling of whole records) is drawn again up to
``whole_draws`` times; the last such draw is kept when every later one fails. Entries drawn again go to the back of the
queue.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Iterable

__all__ = ["Attempt", "ResampleQueue"]


@dataclass(frozen=True)
class Attempt:
    job: Any            # what the engine samples
    resamples: int = 0  # failed draws before this one
    draws: int = 0      # finished draws before this one that were not a whole record
    kept: Any = None    # the last of those, kept if this and every later draw fail


class ResampleQueue:
    """The samples still to draw, in order; :meth:`settle` decides what each finished draw becomes."""

    def __init__(self, jobs: Iterable, resamples: int, whole_draws: int = 0):
        self._queue = deque(Attempt(job) for job in jobs)
        self.resamples, self.whole_draws = resamples, whole_draws
        self.resampled = 0  # draws that failed and were drawn again
        self.not_whole = 0  # finished draws drawn again because the model would not end the record after them

    def __len__(self) -> int:
        return len(self._queue)

    def take(self, n: int | None = None) -> list[Attempt]:
        """The next ``n`` entries (all, without ``n``), out of the queue."""
        n = len(self._queue) if n is None else min(n, len(self._queue))
        return [self._queue.popleft() for _ in range(n)]

    def settle(self, attempt: Attempt, result: Any, ok: bool, whole: bool = True) -> Any:
        """What ``attempt``'s draw ``result`` becomes (``ok``: it finished validly; ``whole``: the model would end the
        record after it): the result to keep - this one, or the kept whole-record draw it failed to replace - or None
        when it is drawn again (queued)."""
        if ok and not whole and attempt.draws < self.whole_draws:
            self._queue.append(replace(attempt, draws=attempt.draws + 1, kept=result))
            self.not_whole += 1
            return None
        if not ok and attempt.resamples < self.resamples:
            self._queue.append(replace(attempt, resamples=attempt.resamples + 1))
            self.resampled += 1
            return None
        if not ok and attempt.kept is not None:
            return attempt.kept
        return result
