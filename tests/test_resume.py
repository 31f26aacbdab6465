"""Exact resume: atomic checkpoints, SIGKILL mid-run and mid-save, corrupt checkpoints, retention, time budgets.

Every run is a real ``python -m logos.cli pretrain`` child process (one thread) on the 500-molecule
fixture: 8 steps, a checkpoint every 2, a metrics row every step. One uninterrupted run of the
same seed (module fixture) is the reference loss curve. Kills are real SIGKILLs at a known step
(tests/fault_injection.py, through tests/fault_entry.py), so no test polls a run's files against the clock.
"""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from logos.train import Trainer
from logos.train.checkpoint import MANIFEST, CheckpointError, checkpoint_tags, read_latest, verify_checkpoint
from logos.train.metrics import truncate_metrics
from logos.train.recipe import load_recipe
from fault_injection import env as fault_env
from train_fixtures import FAULT_ENTRY, cli_env, make_shards, tiny_recipe

STEPS, SAVE_EVERY, KEEP = 8, 2, 2


def write_recipe(shards: Path, out: Path) -> Path:
    recipe = tiny_recipe(shards, out, max_steps=STEPS, save_every=SAVE_EVERY, keep_checkpoints=KEEP,
                         log_every=1, seed=7)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    return path


def pretrain_cmd(recipe: Path, resume: bool = False) -> list[str]:
    return [sys.executable, str(FAULT_ENTRY), "pretrain", "--config", str(recipe), "-q"] + \
        (["--resume"] if resume else [])


def run(recipe: Path, resume: bool = False, **env) -> subprocess.CompletedProcess:
    proc = subprocess.run(pretrain_cmd(recipe, resume), env={**cli_env(), **env}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def rows(out: Path, column: str = "loss") -> list[tuple[int, float]]:
    with open(out / "metrics.csv", newline="") as fh:
        return [(int(r["step"]), float(r[column])) for r in csv.DictReader(fh)]


def assert_same_curve(out: Path, reference: Path) -> None:
    got, expected = rows(out), dict(rows(reference))
    assert [s for s, _ in got] == list(range(1, STEPS + 1))  # every step exactly once, in order
    assert [loss for _, loss in got] == pytest.approx([expected[s] for s, _ in got], rel=1e-5, abs=1e-6)


def assert_retention(ckpt: Path) -> None:
    tags = checkpoint_tags(ckpt)
    assert tags == [f"step{s:07d}" for s in range(STEPS, 0, -SAVE_EVERY)][:KEEP]
    assert read_latest(ckpt) == tags[0]
    assert all(verify_checkpoint(ckpt / t) is None for t in tags)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("resume"))


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    """One uninterrupted run: the loss curve every resumed run must reproduce."""
    out = tmp_path_factory.mktemp("reference") / "run"
    run(write_recipe(shards, out))
    assert [s for s, _ in rows(out)] == list(range(1, STEPS + 1))
    return out


def test_retention_keeps_exactly_k_complete_checkpoints(reference):
    ckpt = reference / "checkpoints"
    assert_retention(ckpt)
    manifest = json.loads((ckpt / read_latest(ckpt) / MANIFEST).read_text())
    assert manifest["step"] == STEPS and manifest["position"] > 0
    assert "mp_rank_00_model_states.pt" in manifest["files"]
    assert all(len(e["sha256"]) == 64 and e["size"] > 0 for e in manifest["files"].values())


def test_sigkill_mid_run_resumes_on_the_same_curve(shards, reference, tmp_path):
    out = tmp_path / "run"
    recipe = write_recipe(shards, out)
    killed = subprocess.run(pretrain_cmd(recipe), env={**cli_env(), **fault_env({"kill_after_step": 5})}, capture_output=True,
                            text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert max(s for s, _ in rows(out)) == 5 and read_latest(out / "checkpoints") == "step0000004"
    resumed = run(recipe, resume=True)
    assert "pretrain: resumed" in resumed.stderr and "step0000004" in resumed.stderr
    assert_same_curve(out, reference)  # step 5 redone, its old row replaced
    assert_retention(out / "checkpoints")


def test_sigkill_during_a_save_keeps_latest_on_the_previous_checkpoint(shards, reference, tmp_path):
    out = tmp_path / "run"
    recipe = write_recipe(shards, out)
    proc = subprocess.run(pretrain_cmd(recipe), env={**cli_env(), **fault_env({"kill_in_save": 3})}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    ckpt = out / "checkpoints"
    torn = ckpt / "step0000006"  # the 3rd save: DeepSpeed's files written, no manifest, latest not moved
    assert (torn / "mp_rank_00_model_states.pt").exists() and not (torn / MANIFEST).exists()
    assert read_latest(ckpt) == "step0000004" and verify_checkpoint(ckpt / "step0000004") is None
    assert max(s for s, _ in rows(out)) == 6  # step 6 was logged before its save; the resume redoes it
    resumed = run(recipe, resume=True)
    assert "pretrain: resumed" in resumed.stderr and "step0000004" in resumed.stderr
    assert_same_curve(out, reference)
    assert_retention(ckpt)


def test_corrupt_checkpoint_is_refused_and_the_previous_one_used(shards, reference, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    recipe = write_recipe(shards, out)
    newest = out / "checkpoints" / f"step{STEPS:07d}"
    victim = newest / "mp_rank_00_model_states.pt"
    size = victim.stat().st_size
    with open(victim, "r+b") as fh:  # truncated; the manifest stays
        fh.truncate(size // 2)
    resumed = run(recipe, resume=True)
    previous = f"step{STEPS - SAVE_EVERY:07d}"
    line = (f"pretrain: checkpoint {newest.name} is corrupt (mp_rank_00_model_states.pt: {size // 2} bytes, "
            f"the manifest says {size}); using {previous}")
    assert line in resumed.stderr.splitlines()
    assert f"resumed {out / 'checkpoints' / previous}" in resumed.stderr
    assert_same_curve(out, reference)  # steps 7-8 redone, their old rows replaced
    assert_retention(out / "checkpoints")


def test_no_usable_checkpoint(shards, reference, tmp_path):
    """Only a never-committed tag: start fresh. A damaged committed one and nothing older: refuse."""
    out = tmp_path / "run"
    recipe = write_recipe(shards, out)
    (out / "checkpoints" / "step0000002").mkdir(parents=True)
    (out / "checkpoints" / "step0000002" / "mp_rank_00_model_states.pt").write_bytes(b"torn")
    # a committed but damaged checkpoint (checked without a training run: Trainer.load only)
    ckpt_src = reference / "checkpoints" / f"step{STEPS:07d}"
    damaged = out / "checkpoints" / f"step{STEPS:07d}"
    shutil.copytree(ckpt_src, damaged)
    (out / "checkpoints" / "latest").write_text(damaged.name)
    (damaged / "mp_rank_00_model_states.pt").write_bytes(b"x")
    lines: list[str] = []
    with pytest.raises(CheckpointError, match="no usable checkpoint"):
        Trainer(load_recipe(recipe), resume=True, progress=False, echo=lines.append)
    assert lines[0] == f"pretrain: checkpoint {damaged.name} is corrupt (mp_rank_00_model_states.pt: 1 bytes, " \
                       f"the manifest says {(ckpt_src / 'mp_rank_00_model_states.pt').stat().st_size}); " \
                       "no older checkpoint to use"
    assert lines[1].startswith("pretrain: checkpoint step0000002 is incomplete (missing logos_manifest.json)")
    shutil.rmtree(damaged)
    lines.clear()
    trainer = Trainer(load_recipe(recipe), resume=True, progress=False, echo=lines.append)
    assert trainer.step_count == 0
    assert lines[-1] == f"pretrain: no complete checkpoint in {out / 'checkpoints'}; starting fresh"


def test_truncate_metrics_drops_rows_past_the_step_and_torn_lines(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step,tokens,loss\n1,10,5.0\n2,20,4.0\n3,30,3.0\n4,4")
    assert truncate_metrics(path, 2) == 2
    assert path.read_text().splitlines() == ["step,tokens,loss", "1,10,5.0", "2,20,4.0"]
    assert truncate_metrics(path, 2) == 0


def test_a_flipped_byte_of_the_same_size_is_refused(reference, tmp_path):
    tag = tmp_path / "tag"
    shutil.copytree(reference / "checkpoints" / f"step{STEPS:07d}", tag)
    assert verify_checkpoint(tag) is None
    victim = tag / "mp_rank_00_model_states.pt"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert verify_checkpoint(tag) == "corrupt (mp_rank_00_model_states.pt: sha256 differs from the manifest)"
    (tag / MANIFEST).unlink()
    assert verify_checkpoint(tag) == f"incomplete (missing {MANIFEST})"


@pytest.mark.slow
def test_a_time_budgeted_run_resumes_on_the_same_lr_and_loss_curve(shards, tmp_path):
    """Under max_minutes the schedule's length is measured at step 10 and checkpointed; killed after step 13
    (checkpoint 12) and resumed, the run follows an uninterrupted run given that length, LR for LR."""
    def recipe(out: Path, **extra) -> Path:
        r = tiny_recipe(shards, out, max_steps=16, max_minutes=10, warmup_steps=2, save_every=4, log_every=1,
                        seed=7, **extra)
        path = out.parent / f"{out.name}.yaml"
        path.write_text(yaml.safe_dump(r.to_dict(), sort_keys=False))
        return path

    budget = recipe(tmp_path / "budget")
    killed = subprocess.run(pretrain_cmd(budget), env={**cli_env(), **fault_env({"kill_after_step": 13})},
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "the LR schedule ends at step 16" in killed.stderr
    resumed = run(budget, resume=True)
    assert "step0000012" in resumed.stderr and "the LR schedule ends" not in resumed.stderr  # restored, not re-measured
    straight = recipe(tmp_path / "straight", schedule_steps=16)
    run(straight)
    for column in ("lr", "loss"):
        got, expected = rows(tmp_path / "budget", column), rows(tmp_path / "straight", column)
        assert [s for s, _ in got] == [s for s, _ in expected] == list(range(1, 17))
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-5, abs=1e-7), column
    lrs = dict(rows(tmp_path / "budget", "lr"))
    assert lrs[10] == pytest.approx(lrs[3]) and lrs[16] < lrs[11] < lrs[10]  # held at the peak, then decayed


def test_schedule_steps_given_on_resume_replans_the_rest_of_the_run(shards, tmp_path):
    """A run planned for 8 steps, killed after step 5 (checkpoint 4) and resumed with train.schedule_steps=6,
    decays over the new length: it stops at 6 at the lowest LR, with steps 1-4 as the first plan had them."""
    out = tmp_path / "run"
    recipe = write_recipe(shards, out)
    killed = subprocess.run(pretrain_cmd(recipe), env={**cli_env(), **fault_env({"kill_after_step": 5})},
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    first = dict(rows(out, "lr"))
    doc = yaml.safe_load(recipe.read_text())
    doc["train"].update(max_steps=6, schedule_steps=6)
    recipe.write_text(yaml.safe_dump(doc, sort_keys=False))
    run(recipe, resume=True)
    lrs = dict(rows(out, "lr"))
    assert sorted(lrs) == list(range(1, 7))
    assert [lrs[s] for s in range(1, 5)] == pytest.approx([first[s] for s in range(1, 5)])
    peak, ratio = doc["train"]["lr"], doc["train"]["min_lr_ratio"]
    assert lrs[5] < first[5] and lrs[6] == pytest.approx(peak * ratio, rel=1e-4)
