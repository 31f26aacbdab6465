"""What a training run does when something goes wrong: a non-finite loss, a corrupt batch, a stop signal.

Each fault is detected on every rank at the same step (one scalar all-reduce) and reported in one line;
the run then stops or skips as the recipe says (``train.on_nonfinite``, ``train.on_bad_batch``):

- **Non-finite loss** (NaN/inf), detected before the backward of the micro-batch that produced it;
  under gradient accumulation the step's earlier micro-batches may already have been backpropagated,
  but no optimizer step has applied them. ``stop`` ends the run with the last complete checkpoint
  intact (``--resume`` continues from it). ``skip`` does what large runs do after a loss spike: roll
  back to the last complete checkpoint with a freshly built engine (so no gradient of the faulty step
  survives in DeepSpeed's buffers, whatever the ZeRO stage) and replay the data from there, leaving
  out the whole optimizer step that produced the fault (its data position joins the run's skip list,
  which later checkpoints carry), at most ``train.max_skips`` times per run.
- **Corrupt batch** (token ids outside the vocabulary: a damaged or foreign shard). Every micro-batch
  of a step is checked before the step's first backward, so ``stop`` or ``skip`` (the whole step's
  rows) needs no rollback: nothing was computed from them.
- **SIGTERM / SIGUSR1** (a cluster scheduler's notice): the current step finishes, a checkpoint is
  written, and the run ends with status 143 so a requeue ``--resume``\\s from exactly there. The bound
  is one step plus one save.
- A failed checkpoint write (ENOSPC, EIO) is the store's (:mod:`logos.train.checkpoint`): the partial
  tag is removed, the previous checkpoint stays the one ``--resume`` uses, and the run stops
  (``train.on_save_error: stop``) or trains on to the next save (``continue``).
"""

from __future__ import annotations

import signal

import numpy as np

__all__ = ["TrainingFault", "NonFiniteLoss", "BadBatch", "StopSignal", "check_batch", "respond", "EXIT_SIGNALLED"]

EXIT_SIGNALLED = 143  # 128 + SIGTERM: the status schedulers expect from a job that stopped on their notice


class TrainingFault(RuntimeError):
    """A fault that ends the run; its message is the one line the CLI prints."""


class NonFiniteLoss(TrainingFault):
    """The loss of a micro-batch is NaN or infinite on some rank (raised before that micro-batch's backward).

    ``after_backward``: earlier micro-batches of the same optimizer step were already backpropagated.
    """

    def __init__(self, message: str, after_backward: bool = False):
        super().__init__(message)
        self.after_backward = after_backward


class BadBatch(TrainingFault):
    """A batch that cannot be trained on (token ids outside the vocabulary)."""


def check_batch(tokens: np.ndarray, vocab_size: int, where: str) -> None:
    """Raise :class:`BadBatch` when ``tokens`` hold ids outside ``[0, vocab_size)``."""
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= vocab_size:
        raise BadBatch(f"{where}: token id {high if high >= vocab_size else low} outside the vocabulary "
                       f"(0..{vocab_size - 1}): the shard is corrupt or from another tokenizer")


class StopSignal:
    """Context manager: while active, SIGTERM/SIGUSR1 set :attr:`received` instead of killing the process."""

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self):
        self.received: str | None = None
        self._old: dict = {}

    def _handler(self, signum, frame) -> None:
        self.received = signal.Signals(signum).name

    def __enter__(self) -> "StopSignal":
        import threading

        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._old[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old.clear()


def respond(trainer, fault: TrainingFault) -> None:
    """Stop (raise, one line) or leave the batch out, as the recipe says (see :mod:`logos.train.faults`)."""
    t = trainer.recipe.train
    policy, key = ((t.on_nonfinite, "on_nonfinite") if isinstance(fault, NonFiniteLoss)
                   else (t.on_bad_batch, "on_bad_batch"))
    resume_point = trainer.store.latest_complete()
    where = (f"the last complete checkpoint is {resume_point} (continue with --resume)" if resume_point
             else "no checkpoint written yet")
    if policy == "stop":
        raise TrainingFault(f"{fault}; stopped (train.{key}=stop): {where}")
    trainer.skips += 1
    if trainer.skips > t.max_skips:
        raise TrainingFault(f"{fault}; stopped: {t.max_skips} batches already skipped (train.max_skips); {where}")
    bad = trainer.position
    trainer.skipped.add(bad)
    if isinstance(fault, NonFiniteLoss):  # the optimizer steps since the checkpoint are replayed without
        if not trainer.rollback():         # this step's rows, as if they never existed
            raise TrainingFault(f"{fault}; cannot skip: no checkpoint to roll back to")
    if trainer.dist.is_main:
        trainer.echo(f"train: {fault}; skipped the batch at data position {bad} ({trainer.skips}/{t.max_skips})"
                     + (f", rolled back to step {trainer.step_count}" if isinstance(fault, NonFiniteLoss) else ""))
