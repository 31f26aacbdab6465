"""Training faults: a NaN loss, a corrupt shard, a full disk during a save, SIGTERM from a scheduler."""

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

from logos.train import Trainer
from logos.train.checkpoint import CheckpointSaveError, read_latest, verify_checkpoint
from logos.train.faults import EXIT_SIGNALLED, FAULT_NAN_AT_STEP, TrainingFault
from train_fixtures import cli_env, make_shards, tiny_recipe


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


def test_nan_loss_stops_with_the_last_checkpoint_intact_and_resume_continues(shards, tmp_path, monkeypatch):
    out = tmp_path / "run"
    recipe = tiny_recipe(shards, out, max_steps=6, save_every=2, log_every=1)
    monkeypatch.setenv(FAULT_NAN_AT_STEP, "5")
    with pytest.raises(TrainingFault) as err:
        _quiet(recipe).train()
    message = str(err.value)
    assert "step 5: loss nan" in message and "step0000004" in message and "\n" not in message
    ckpt = out / "checkpoints"
    assert read_latest(ckpt) == "step0000004" and verify_checkpoint(ckpt / "step0000004") is None
    monkeypatch.delenv(FAULT_NAN_AT_STEP)
    done = _resume(out)
    assert done.returncode == 0, done.stderr
    assert max(_losses(out)) == 6 and all(np.isfinite(list(_losses(out).values())))


def test_nan_loss_skip_rolls_back_and_replays_without_the_batch(shards, tmp_path, monkeypatch):
    straight = tiny_recipe(shards, tmp_path / "straight", max_steps=6, save_every=2, log_every=1)
    _quiet(straight).train()
    recipe = tiny_recipe(shards, tmp_path / "skip", max_steps=6, save_every=2, log_every=1, on_nonfinite="skip")
    monkeypatch.setenv(FAULT_NAN_AT_STEP, "5")
    lines: list[str] = []
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
