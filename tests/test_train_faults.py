"""Training faults: a NaN loss, a corrupt shard, a full disk during a save, SIGTERM from a scheduler.

Faults are injected by patching the real trainer (tests/fault_injection.py): in-process with
``monkeypatch``, in child processes through tests/fault_entry.py. Under gradient accumulation (the
1B-8B presets' setting) a fault may strike any micro-batch on any rank; the tests check that nothing of
that optimizer step reaches the weights, comparing exported weights with a run that never saw the step.
"""

from __future__ import annotations

import csv
import errno
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from safetensors.torch import load_file

from fault_injection import env as fault_env
from fault_injection import install
from logos.train import Trainer
from logos.train.checkpoint import CheckpointSaveError, read_latest, verify_checkpoint
from logos.train.distributed import free_port
from logos.train.faults import EXIT_SIGNALLED, TrainingFault
from train_fixtures import FAULT_ENTRY, REPO, cli_env, make_shards, tiny_recipe


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("faults"))


def _quiet(recipe, lines=None):
    return Trainer(recipe, progress=False, echo=(lines.append if lines is not None else lambda line: None))


def _losses(out: Path) -> dict[int, float]:
    return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(out / "metrics.csv"))}


def _resume(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "logos.cli", "pretrain", "--config", str(out / "recipe.yaml"),
                           "--resume", "-q", *extra], env=cli_env(), capture_output=True, text=True, timeout=600)


def _train(recipe, monkeypatch, faults: dict | None = None, lines=None):
    """Train ``recipe`` in this process with ``faults`` injected (undone afterwards)."""
    with monkeypatch.context() as patch:
        install(faults or {}, patch.setattr)
        return _quiet(recipe, lines).train()


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "hf" / "model.safetensors")


def assert_same_weights(out: Path, reference: Path) -> None:
    got, expected = _weights(out), _weights(reference)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)


def test_nan_loss_stops_with_the_last_checkpoint_intact_and_resume_continues(shards, tmp_path, monkeypatch):
    out = tmp_path / "run"
    recipe = tiny_recipe(shards, out, max_steps=6, save_every=2, log_every=1)
    with pytest.raises(TrainingFault) as err:
        _train(recipe, monkeypatch, {"nan": {"step": 5, "micro": 1}})
    message = str(err.value)
    assert "step 5: loss nan" in message and "step0000004" in message and "\n" not in message
    ckpt = out / "checkpoints"
    assert read_latest(ckpt) == "step0000004" and verify_checkpoint(ckpt / "step0000004") is None
    done = _resume(out)
    assert done.returncode == 0, done.stderr
    assert max(_losses(out)) == 6 and all(np.isfinite(list(_losses(out).values())))


def test_nan_loss_skip_rolls_back_and_replays_without_the_batch(shards, tmp_path, monkeypatch):
    straight = tiny_recipe(shards, tmp_path / "straight", max_steps=6, save_every=2, log_every=1)
    _quiet(straight).train()
    recipe = tiny_recipe(shards, tmp_path / "skip", max_steps=6, save_every=2, log_every=1, on_nonfinite="skip")
    lines: list[str] = []
    with monkeypatch.context() as patch:
        install({"nan": {"step": 5, "micro": 1}}, patch.setattr)
        trainer = _quiet(recipe, lines)
        result = trainer.train()
    rows = 8  # micro_batch 8, one process
    assert result.steps == 6 and trainer.skipped == {4 * rows}
    assert any("rolled back to step 4" in line and "data position 32" in line for line in lines), lines
    got, expected = _losses(tmp_path / "skip"), _losses(tmp_path / "straight")
    assert got[4] == pytest.approx(expected[4], rel=1e-6)  # the same run up to the checkpoint ...
    assert got[5] != pytest.approx(expected[5], rel=1e-6)  # ... then step 5 trains on the next batch
    state = torch.load(tmp_path / "skip" / "checkpoints" / "step0000006" / "mp_rank_00_model_states.pt",
                       weights_only=False)  # written by this test's own run
    assert state["skipped"] == [32]


def test_a_corrupt_shard_stops_in_one_line_or_is_skipped_up_to_the_limit(shards, tmp_path):
    broken = tmp_path / "shards"
    shutil.copytree(shards, broken)
    tokens = np.memmap(broken / "train.bin", dtype=np.uint16, mode="r+")
    tokens[::40] = 65535  # ids beyond any vocabulary, in every row
    tokens.flush()
    del tokens
    with pytest.raises(TrainingFault) as err:
        _quiet(tiny_recipe(broken, tmp_path / "stop", max_steps=4)).train()
    assert "token id 65535 outside the vocabulary" in str(err.value) and str(broken) in str(err.value)
    with pytest.raises(TrainingFault) as err:
        _quiet(tiny_recipe(broken, tmp_path / "skip", max_steps=4, on_bad_batch="skip", max_skips=2)).train()
    assert "2 batches already skipped" in str(err.value)


def _fail_saves_of(tag: str, monkeypatch) -> None:
    real = torch.save

    def save(obj, f, *args, **kwargs):
        if tag in str(f):
            raise OSError(errno.ENOSPC, "No space left on device", str(f))
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def test_disk_full_during_a_save_keeps_the_previous_checkpoint(shards, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _fail_saves_of("step0000004", monkeypatch)
    with pytest.raises(CheckpointSaveError) as err:
        _quiet(tiny_recipe(shards, out, max_steps=6, save_every=2)).train()
    assert "No space left on device" in str(err.value) and "step0000002 stays the resume point" in str(err.value)
    ckpt = out / "checkpoints"
    assert not (ckpt / "step0000004").exists() and read_latest(ckpt) == "step0000002"
    assert verify_checkpoint(ckpt / "step0000002") is None
    monkeypatch.undo()
    done = _resume(out)
    assert done.returncode == 0, done.stderr
    assert read_latest(ckpt) == "step0000006"


def test_disk_full_with_continue_trains_on_to_the_next_save(shards, tmp_path, monkeypatch):
    out = tmp_path / "run"
    _fail_saves_of("step0000004", monkeypatch)
    lines: list[str] = []
    result = _quiet(tiny_recipe(shards, out, max_steps=6, save_every=2, on_save_error="continue"), lines).train()
    assert result.steps == 6 and any("training on" in line for line in lines)
    assert read_latest(out / "checkpoints") == "step0000006" and not (out / "checkpoints" / "step0000004").exists()


def test_sigterm_writes_a_checkpoint_and_exits_143_then_resume_continues(shards, tmp_path):
    out = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    import yaml

    recipe.write_text(yaml.safe_dump(tiny_recipe(shards, out, max_steps=100000, save_every=100000,
                                                 log_every=1).to_dict()))
    proc = subprocess.Popen([sys.executable, "-m", "logos.cli", "pretrain", "--config", str(recipe), "-q"],
                            env=cli_env(), stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.csv"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (metrics.exists() and len(metrics.read_text().splitlines()) > 3):
        time.sleep(0.2)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_SIGNALLED, err
    assert time.monotonic() - sent < 60
    step = max(_losses(out))
    tag = f"step{step:07d}"
    assert f"SIGTERM at step {step}" in err and read_latest(out / "checkpoints") == tag
    assert verify_checkpoint(out / "checkpoints" / tag) is None
    done = _resume(out, "--set", f"train.max_steps={step + 2}")
    assert done.returncode == 0, done.stderr
    assert max(_losses(out)) == step + 2


# ---------------------------------------------------------------------------------------------------
# Gradient accumulation: a fault at the second micro-batch of step 5, after the first one's backward.

def _accum(shards, out: Path, grad_accum: int, **train):
    values = dict(max_steps=6, save_every=2, log_every=1, grad_accum=grad_accum, micro_batch=4)
    return tiny_recipe(shards, out, **{**values, **train})


@pytest.fixture(scope="module")
def never_saw_step_5(shards, tmp_path_factory):
    """Per grad_accum: a clean run whose data stream leaves out step 5's rows (what a skip must equal)."""
    runs = {}

    def run(grad_accum: int) -> Path:
        if grad_accum not in runs:
            out = tmp_path_factory.mktemp(f"never{grad_accum}") / "run"
            recipe = _accum(shards, out, grad_accum)
            patch = pytest.MonkeyPatch()
            try:
                install({"skipped": [4 * 4 * grad_accum]}, patch.setattr)  # step 5 starts at row 4 * rows per step
                _quiet(recipe).train()
            finally:
                patch.undo()
            runs[grad_accum] = out
        return runs[grad_accum]

    return run


@pytest.mark.parametrize("grad_accum", [2, 4])
@pytest.mark.parametrize("kind", ["nan", "corrupt"])
def test_a_fault_mid_step_under_skip_leaves_no_gradient_of_that_step(shards, tmp_path, monkeypatch, never_saw_step_5,
                                                                     grad_accum, kind):
    policy = {"nan": "on_nonfinite", "corrupt": "on_bad_batch"}[kind]
    out = tmp_path / "run"
    lines: list[str] = []
    result = _train(_accum(shards, out, grad_accum, **{policy: "skip"}), monkeypatch,
                    {kind: {"step": 5, "micro": 2}}, lines)
    assert result.steps == 6
    assert any(f"skipped the batch at data position {4 * 4 * grad_accum}" in line for line in lines), lines
    if kind == "nan":
        assert any(f"micro-batch 2 of {grad_accum}" in line and "rolled back to step 4" in line for line in lines)
    assert_same_weights(out, never_saw_step_5(grad_accum))


@pytest.mark.parametrize("kind", ["nan", "corrupt"])
def test_a_fault_mid_step_under_stop_keeps_the_checkpoint_and_resume_is_exact(shards, tmp_path, monkeypatch, kind):
    straight = tmp_path / "straight"
    _train(_accum(shards, straight, 2), monkeypatch)
    out = tmp_path / "run"
    with pytest.raises(TrainingFault) as err:
        _train(_accum(shards, out, 2), monkeypatch, {kind: {"step": 5, "micro": 2}})
    assert "step0000004 (continue with --resume)" in str(err.value)
    ckpt = out / "checkpoints"
    assert read_latest(ckpt) == "step0000004" and verify_checkpoint(ckpt / "step0000004") is None
    assert max(_losses(out)) == 4  # step 5 never logged
    done = _resume(out)
    assert done.returncode == 0, done.stderr
    got, expected = _losses(out), _losses(straight)
    assert [got[s] for s in range(1, 7)] == pytest.approx([expected[s] for s in range(1, 7)], rel=1e-6)
    assert_same_weights(out, straight)


def _child(recipe, faults: dict | None = None, resume: bool = False, procs: int = 1) -> subprocess.CompletedProcess:
    """``logos pretrain`` in a child process (``procs`` > 1: under torchrun) with ``faults`` injected."""
    import yaml

    path = Path(recipe.train.out_dir).with_suffix(".yaml")
    path.write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    launcher = ([str(Path(sys.executable).with_name("torchrun")), "--nproc_per_node", str(procs),
                 "--master_port", str(free_port())] if procs > 1 else [sys.executable])
    cmd = launcher + [str(FAULT_ENTRY), "pretrain", "--config", str(path), "-q"] + (["--resume"] if resume else [])
    return subprocess.run(cmd, env={**cli_env(), **fault_env(faults or {})}, capture_output=True, text=True,
                          timeout=600, cwd=REPO)


@pytest.fixture(scope="module")
def accumulated(shards, tmp_path_factory):
    """An uninterrupted grad_accum=2 run in one child process: the curve and weights to come back to."""
    out = tmp_path_factory.mktemp("accumulated") / "run"
    done = _child(_accum(shards, out, 2))
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_killed_between_micro_batches_resumes_to_the_same_run(shards, tmp_path, accumulated):
    out = tmp_path / "run"
    recipe = _accum(shards, out, 2)
    killed = _child(recipe, {"signal": {"step": 5, "micro": 1, "name": "SIGKILL"}})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert read_latest(out / "checkpoints") == "step0000004" and max(_losses(out)) == 4
    done = _child(recipe, resume=True)
    assert done.returncode == 0, done.stderr[-3000:]
    got, expected = _losses(out), _losses(accumulated)
    assert [got[s] for s in range(1, 7)] == pytest.approx([expected[s] for s in range(1, 7)], rel=1e-6)
    assert_same_weights(out, accumulated)


def test_sigterm_between_micro_batches_finishes_the_step_and_resumes_exactly(shards, tmp_path, accumulated):
    out = tmp_path / "run"
    recipe = _accum(shards, out, 2, save_every=100)
    stopped = _child(recipe, {"signal": {"step": 3, "micro": 1, "name": "SIGTERM"}})
    assert stopped.returncode == EXIT_SIGNALLED, stopped.stderr[-3000:]
    assert "SIGTERM at step 3" in stopped.stderr and read_latest(out / "checkpoints") == "step0000003"
    assert verify_checkpoint(out / "checkpoints" / "step0000003") is None
    done = _child(recipe, resume=True)
    assert done.returncode == 0, done.stderr[-3000:]
    got, expected = _losses(out), _losses(accumulated)
    assert [got[s] for s in range(1, 7)] == pytest.approx([expected[s] for s in range(1, 7)], rel=1e-6)
    assert_same_weights(out, accumulated)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 2])
def test_two_processes_a_fault_on_one_rank_mid_step_is_skipped_cleanly(shards, tmp_path, stage):
    """Rank 1 meets the fault at its second micro-batch of step 3 (ZeRO-0 and a real ZeRO-2 engine)."""
    def recipe(name: str, **train):
        return _accum(shards, tmp_path / name, 2, micro_batch=2, max_steps=4, zero_stage=stage, **train)

    rows = 2 * 2 * 2  # micro_batch x grad_accum x processes
    reference = _child(recipe("never"), {"skipped": [2 * rows]}, procs=2)
    assert reference.returncode == 0, reference.stderr[-3000:]
    nan = _child(recipe("nan", on_nonfinite="skip"), {"nan": {"step": 3, "micro": 2, "rank": 1}}, procs=2)
    assert nan.returncode == 0, nan.stderr[-3000:]
    assert "micro-batch 2 of 2" in nan.stderr and "rolled back to step 2" in nan.stderr
    corrupt = _child(recipe("corrupt", on_bad_batch="skip"), {"corrupt": {"step": 3, "micro": 2, "rank": 1}},
                     procs=2)
    assert corrupt.returncode == 0, corrupt.stderr[-3000:]
    assert f"skipped the batch at data position {2 * rows}" in corrupt.stderr
    for name in ("nan", "corrupt"):
        assert_same_weights(tmp_path / name, tmp_path / "never")


@pytest.mark.slow
def test_two_processes_zero2_sigterm_mid_step_on_one_rank_resumes_exactly(shards, tmp_path):
    def recipe(name: str):
        return _accum(shards, tmp_path / name, 2, micro_batch=2, max_steps=4, zero_stage=2, save_every=100)

    straight = _child(recipe("straight"), procs=2)
    assert straight.returncode == 0, straight.stderr[-3000:]
    stopped = _child(recipe("run"), {"signal": {"step": 2, "micro": 1, "rank": 1, "name": "SIGTERM"}}, procs=2)
    assert stopped.returncode != 0 and read_latest(tmp_path / "run" / "checkpoints") == "step0000002"
    resumed = _child(recipe("run"), resume=True, procs=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, expected = _losses(tmp_path / "run"), _losses(tmp_path / "straight")
    assert [got[s] for s in range(1, 5)] == pytest.approx([expected[s] for s in range(1, 5)], rel=1e-6)
    assert_same_weights(tmp_path / "run", tmp_path / "straight")
