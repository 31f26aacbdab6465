"""Test-only fault injection for training runs: patches the trainer from a plain dict (or JSON) spec.

The library carries no fault hooks; tests patch the real trainer instead, in-process with pytest's
``monkeypatch`` or in a child process through ``tests/fault_entry.py`` (``LOGOS_TEST_FAULTS`` holds
the spec as JSON). Steps are 1-based optimizer steps, micro-batches 1-based within a step; ``rank``
(default: every rank) limits a fault to one process. Keys:

- ``nan``: ``{"step", "micro", "rank"}`` - that micro-batch's loss is NaN (once per process).
- ``corrupt``: ``{"step", "micro", "rank"}`` - that micro-batch's tokens hold an id outside the vocabulary
  (once per process), as a damaged shard would.
- ``signal``: ``{"step", "micro", "rank", "name"}`` - the process sends itself SIGTERM / SIGKILL right
  after that micro-batch's forward (between the micro-batches of a step).
- ``kill_after_step``: N - SIGKILL right after step N's log row and checkpoint (before step N + 1).
- ``kill_in_save``: N - SIGKILL during the N-th save, after DeepSpeed wrote the tag's files but before the
  manifest and ``latest``.
- ``skipped``: data positions a run leaves out from its start (a run that never sees those rows).
"""

from __future__ import annotations

import json
import os
import signal

from logos.data.shards import Batch, ShardReader
from logos.train.checkpoint import CheckpointStore
from logos.train.trainer import Trainer

ENV = "LOGOS_TEST_FAULTS"


def env(spec: dict) -> dict:
    """The environment entry that hands ``spec`` to a child process started through fault_entry.py."""
    return {ENV: json.dumps(spec)}


def _matches(fault: dict | None, trainer: Trainer, micro: int) -> bool:
    return bool(fault) and fault["step"] == trainer.step_count + 1 and fault["micro"] == micro \
        and fault.get("rank") in (None, trainer.dist.rank)


def install(spec: dict, setattr=setattr) -> None:
    """Patch :class:`Trainer` (and the checkpoint store) for the faults in ``spec``."""
    fired: set[str] = set()
    step, loss, init, commit = Trainer.step, Trainer._loss, Trainer.__init__, CheckpointStore._commit
    batch = ShardReader.batch

    def patched_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.skipped |= set(spec.get("skipped", []))

    def patched_step(self):
        if spec.get("kill_after_step") == self.step_count:
            os.kill(os.getpid(), signal.SIGKILL)
        self._test_micro = self._test_reads = 0  # micro-batches forwarded / read in this step
        self.train_reader._test_trainer = self
        return step(self)

    def patched_batch(reader, position, n):
        out = batch(reader, position, n)
        trainer = getattr(reader, "_test_trainer", None)
        if trainer is None:
            return out
        trainer._test_reads += 1
        micro = (trainer._test_reads - 1) % trainer.recipe.train.grad_accum + 1
        if "corrupt" not in fired and _matches(spec.get("corrupt"), trainer, micro):
            fired.add("corrupt")
            tokens = out.tokens.copy()
            tokens[0, 1] = trainer.vocab_size + 7
            return Batch(tokens, out.domains, out.loss_mask)
        return out

    def patched_loss(self, batch, module=None):
        result = loss(self, batch, module)
        if not self.engine.training:  # validation
            return result
        self._test_micro = getattr(self, "_test_micro", 0) + 1
        micro = self._test_micro
        if "nan" not in fired and _matches(spec.get("nan"), self, micro):
            fired.add("nan")
            result = (result[0] * float("nan"),) + tuple(result[1:])
        sig = spec.get("signal")
        if _matches(sig, self, micro) and "signal" not in fired:
            fired.add("signal")
            os.kill(os.getpid(), getattr(signal, sig["name"]))
        return result

    saves = [0]

    def patched_commit(self, tag, info):
        saves[0] += 1
        if spec.get("kill_in_save") == saves[0]:
            os.kill(os.getpid(), signal.SIGKILL)
        return commit(self, tag, info)

    setattr(Trainer, "__init__", patched_init)
    setattr(Trainer, "step", patched_step)
    setattr(Trainer, "_loss", patched_loss)
    setattr(ShardReader, "batch", patched_batch)
    setattr(CheckpointStore, "_commit", patched_commit)


def from_environment() -> None:
    """Install the faults named by ``LOGOS_TEST_FAULTS`` (JSON), if any."""
    text = os.environ.get(ENV)
    if text:
        install(json.loads(text))


__all__ = ["ENV", "env", "install", "from_environment"]
