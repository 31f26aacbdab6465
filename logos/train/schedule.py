"""The learning-rate schedule: linear warm-up, then cosine or linear decay to a floor over a fixed step count.

The schedule is a pure function of the step once its length is known, and it never reads the
clock, so a resumed run follows exactly the LR of an uninterrupted one:

- with ``max_steps`` (or an explicit ``schedule_steps``) the length is known from the start;
- with a time budget (``max_minutes``) the length is *measured once*: the LR holds its peak from the
  end of warm-up until step ``decay_start = max(warmup_steps, CALIBRATION_STEPS)``; there the run
  divides the budget left by the seconds per step it measured and fixes the length
  (:meth:`Schedule.fix_length`). The length is saved in every checkpoint and restored on resume.
  The budget stays a hard stop; when evaluation and checkpoints cost more time than measured, the
  run stops a little before the LR reaches its floor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from logos.train.recipe import Recipe

__all__ = ["Schedule", "CALIBRATION_STEPS"]

CALIBRATION_STEPS = 10
"""Under a time budget, the length is measured over the first steps, at least this many."""


@dataclass
class Schedule:
    """LR multiplier per step; ``total`` is None until a time-budgeted run has measured its length."""

    warmup: int
    decay_start: int
    total: int | None
    kind: str = "cosine"
    floor: float = 0.1
    budget_seconds: float | None = None
    max_steps: int = 1

    @classmethod
    def from_recipe(cls, recipe: Recipe) -> "Schedule":
        t = recipe.train
        budget = t.max_minutes * 60 if t.max_minutes else None
        measured = budget is not None and t.schedule_steps is None
        total = t.schedule_steps or (None if measured else t.max_steps)
        decay_start = max(t.warmup_steps, CALIBRATION_STEPS) if budget is not None else t.warmup_steps
        if total is not None:
            decay_start = min(decay_start, max(t.warmup_steps, total - 1))
        if measured and t.max_steps <= decay_start:  # too short to measure: the step cap is the length
            total = t.max_steps
            decay_start = min(t.warmup_steps, t.max_steps - 1)
        return cls(t.warmup_steps, decay_start, total, t.schedule, t.min_lr_ratio, budget, t.max_steps)

    @property
    def measuring(self) -> bool:
        return self.total is None

    @property
    def steps(self) -> int:
        """Steps the run will take (the step cap while the length is still being measured)."""
        return min(self.total, self.max_steps) if self.total is not None else self.max_steps

    def multiplier(self, step: int) -> float:
        """LR / peak LR for optimizer step ``step`` (0-based)."""
        if self.warmup and step < self.warmup:
            return (step + 1) / self.warmup
        if self.kind == "constant" or self.total is None or step < self.decay_start:
            return 1.0
        frac = min(1.0, (step - self.decay_start) / max(1, self.total - self.decay_start))
        decay = 0.5 * (1 + math.cos(math.pi * frac)) if self.kind == "cosine" else 1 - frac
        return self.floor + (1 - self.floor) * decay

    def fix_length(self, steps_done: int, seconds_used: float, seconds_per_step: float) -> int:
        """Fix ``total`` from measured throughput: the steps that fit in the budget left (at least one more)."""
        left = max(0.0, (self.budget_seconds or 0.0) - seconds_used)
        fits = int(left / max(seconds_per_step, 1e-9))
        self.total = int(min(self.max_steps, max(steps_done + 1, steps_done + fits)))
        return self.total
