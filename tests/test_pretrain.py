"""logos pretrain: recipes, the DeepSpeed engine (ZeRO 0/2/3, 1 and 2 processes), checkpoints and resume."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from logos.train import Schedule, Trainer
from logos.train.recipe import ConfigError, load_recipe, padded_vocab, recipe_from_dict
from train_fixtures import FAULT_ENTRY, REPO, cli_env, make_shards, tiny_recipe

RECIPES = sorted(p for p in (REPO / "pretrain").glob("*.yaml") if not p.name.startswith("corpus"))  # corpus*.yaml: test_corpus


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("pretrain"))


# ---------------------------------------------------------------- recipes
def test_every_recipe_is_covered():
    assert {p.stem for p in RECIPES} >= {"tiny", "1b", "3b", "8b"}


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_parses_and_builds_its_config(path):
    recipe = load_recipe(path)
    assert recipe.name == path.stem
    cfg = recipe.model.hf_config(padded_vocab(2394))
    assert cfg.vocab_size == 2432 and cfg.vocab_size % 64 == 0
    m = recipe.model
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.tie_word_embeddings) == \
        (m.hidden_size, m.num_layers, m.num_heads, m.num_kv_heads, m.head_dim, m.intermediate_size, m.tie_embeddings)
    assert type(cfg).__name__ == {"llama": "LlamaConfig", "qwen3": "Qwen3Config"}[m.arch]


def test_recipe_shapes_match_their_models():
    one, three, eight = (load_recipe(REPO / "pretrain" / f"{n}.yaml").model for n in ("1b", "3b", "8b"))
    assert (one.hidden_size, one.num_layers, one.num_heads, one.num_kv_heads, one.intermediate_size) == \
        (2048, 16, 32, 8, 8192)
    assert (three.hidden_size, three.num_layers, three.num_heads, three.num_kv_heads) == (3072, 28, 24, 8)
    assert eight.arch == "qwen3" and (eight.hidden_size, eight.num_layers, eight.intermediate_size) == \
        (4096, 36, 12288)


def test_recipe_errors_name_the_field():
    with pytest.raises(ConfigError, match="lrr"):
        recipe_from_dict({"train": {"lrr": 1}})
    with pytest.raises(ConfigError, match="zero_stage"):
        recipe_from_dict({"train": {"zero_stage": 4}})
    with pytest.raises(ConfigError, match="override"):
        load_recipe(REPO / "pretrain" / "tiny.yaml", ["max_steps=3"])
    r = load_recipe(REPO / "pretrain" / "tiny.yaml", ["train.max_steps=3", "model.num_layers=2"])
    assert r.train.max_steps == 3 and r.model.num_layers == 2


def test_lr_schedule_warms_up_and_decays():
    r = load_recipe(REPO / "pretrain" / "tiny.yaml", ["train.max_steps=100", "train.warmup_steps=10",
                                                      "train.max_minutes=null"])
    f = Schedule.from_recipe(r).multiplier
    floor = r.train.min_lr_ratio
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(55) == pytest.approx(floor + (1 - floor) * 0.5)  # the middle of the cosine
    assert f(100) == pytest.approx(floor) and f(200) == pytest.approx(floor)


def test_time_budget_fixes_the_schedule_length_once_and_never_reads_the_clock():
    timed = load_recipe(REPO / "pretrain" / "tiny.yaml", ["train.max_steps=100000", "train.warmup_steps=4",
                                                          "train.max_minutes=10"])
    s = Schedule.from_recipe(timed)
    floor = timed.train.min_lr_ratio
    assert s.measuring and s.decay_start == 10  # max(warm-up, CALIBRATION_STEPS)
    assert s.multiplier(1) == pytest.approx(0.5) and s.multiplier(500) == 1.0  # holds its peak until measured
    # 60 s used after 10 steps at 0.1 s/step: 540 s left = 5,400 more steps
    assert s.fix_length(10, seconds_used=60.0, seconds_per_step=0.1) == 5410 and not s.measuring
    assert s.multiplier(10) == pytest.approx(1.0) and s.multiplier(5410) == pytest.approx(floor)
    assert s.multiplier(2710) == pytest.approx(floor + (1 - floor) * 0.5)
    capped = Schedule.from_recipe(load_recipe(REPO / "pretrain" / "tiny.yaml", ["train.max_steps=300",
                                                                                "train.max_minutes=10"]))
    assert capped.fix_length(10, 1.0, 0.01) == 300  # the step cap wins over a generous budget
    short = Schedule.from_recipe(load_recipe(REPO / "pretrain" / "tiny.yaml", ["train.max_steps=6",
                                                                               "train.warmup_steps=0",
                                                                               "train.max_minutes=10"]))
    assert not short.measuring and short.total == 6  # too short to measure: the cap is the length
    given = Schedule.from_recipe(load_recipe(REPO / "pretrain" / "tiny.yaml", ["train.schedule_steps=500",
                                                                               "train.max_minutes=10"]))
    assert given.total == 500 and given.decay_start == 100  # tiny's warm-up (100) exceeds the calibration


def test_zero_warmup_with_a_time_budget_trains_through_the_cli(shards, tmp_path, run_cli):
    """warmup_steps 0 with max_minutes crashed at engine start on the old main (the schedule read a clock)."""
    code, err = run_cli("pretrain", "--config", REPO / "pretrain" / "tiny.yaml", "-q",
                        "--set", f"train.data={shards}", "--set", f"train.out_dir={tmp_path / 'run'}",
                        "--set", "train.warmup_steps=0", "--set", "train.max_minutes=10", "--set", "train.max_steps=12",
                        "--set", "train.seq_len=64", "--set", "train.save_every=100000", "--set", "train.log_every=5")
    assert code == 0, err
    assert "the LR schedule ends at step 12" in err  # measured at step 10; the step cap is shorter than the budget
    rows = {int(r["step"]): r for r in csv.DictReader(open(tmp_path / "run" / "metrics.csv"))}
    assert float(rows[1]["lr"]) == pytest.approx(1e-3) and float(rows[10]["lr"]) == pytest.approx(1e-3)  # held
    assert float(rows[12]["lr"]) == pytest.approx(1e-4)  # the floor at the schedule's end


def test_dry_run_prints_config_and_parameter_count(capsys):
    from logos.cli import main

    assert main(["pretrain", "--config", str(REPO / "pretrain" / "tiny.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "parameters: 5,049,600" in out and "LlamaForCausalLM" in out and "zero_stage: 0" in out


# ---------------------------------------------------------------- training through DeepSpeed
@pytest.mark.parametrize("stage", [0, 3])
def test_loss_falls_single_process(shards, tmp_path, stage):
    trainer = Trainer(tiny_recipe(shards, tmp_path / "run", zero_stage=stage, max_steps=10), progress=False,
                      echo=lambda line: None)
    losses = [trainer.step()[0] for _ in range(10)]
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses


def test_run_writes_metrics_plot_checkpoint_and_export(shards, tmp_path):
    out = tmp_path / "run"
    result = Trainer(tiny_recipe(shards, out, max_steps=8, save_every=4, log_every=2), progress=False,
                     echo=lambda line: None).train()
    assert result.steps == 8 and result.last_loss < result.first_loss
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [1, 2, 4, 6, 8]
    assert {"lr", "tokens_per_s", "loss_molecule", "val_loss"} <= set(rows[0])
    assert rows[-1]["val_loss"]  # evaluated at the end
    assert (out / "loss.png").stat().st_size > 1000
    assert (out / "checkpoints" / "latest").read_text().strip() == "step0000008"
    assert (out / "hf" / "model.safetensors").exists() and (out / "hf" / "tokenizer.json").exists()


def test_zero3_fp32_keeps_one_copy_of_the_weights(shards, tmp_path):
    """ZeRO-3 in fp32: the optimizer's master partition is the weight partition (same storage, no clone), small
    optimizer sub-groups, and training through it still lowers the loss and logs it exactly."""
    out = tmp_path / "run"
    trainer = Trainer(tiny_recipe(shards, out, zero_stage=3, max_steps=6, log_every=1), progress=False,
                      echo=lambda line: None)
    opt = trainer.engine.optimizer
    assert trainer.config["zero_optimization"]["sub_group_size"] == 50_000_000
    assert len(opt.fp32_partitioned_groups_flat) == len(opt.fp16_partitioned_groups_flat) > 0
    for low, high in zip(opt.fp16_partitioned_groups_flat, opt.fp32_partitioned_groups_flat):
        assert high.data_ptr() == low.data_ptr() and high.numel() == low.numel()
    result = trainer.train()
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert float(rows[0]["loss"]) == result.first_loss and float(rows[-1]["loss"]) == result.last_loss  # in full
    assert result.last_loss < result.first_loss - 0.5


@pytest.mark.parametrize("stage", [0, 3])
def test_save_load_gives_the_same_next_step_loss(shards, tmp_path, stage):
    recipe = tiny_recipe(shards, tmp_path / "run", zero_stage=stage, max_steps=20)
    a = Trainer(recipe, progress=False, echo=lambda line: None)
    for _ in range(3):
        a.step()
    a.save()
    expected = [a.step()[0] for _ in range(2)]
    b = Trainer(recipe, resume=True, progress=False, echo=lambda line: None)
    assert (b.step_count, b.position) == (3, 3 * recipe.train.micro_batch)
    got = [b.step()[0] for _ in range(2)]
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-6)


LAUNCHERS = {
    "torchrun": ["torchrun", "--standalone", "--nproc_per_node", "2", str(FAULT_ENTRY)],
    "deepspeed": ["deepspeed", "--num_gpus", "2", "--master_port", "{port}", str(FAULT_ENTRY)],
}


def _launch(launcher: str, shards: Path, out: Path, resume: bool = False, **env) -> subprocess.CompletedProcess:
    """``logos pretrain`` in 2 processes under a launcher: ZeRO-2, 10 steps, a checkpoint every 4."""
    from logos.train.distributed import free_port

    argv = [a.format(port=free_port()) for a in LAUNCHERS[launcher]]
    cmd = [str(Path(sys.executable).with_name(argv[0]))] + argv[1:] + [
        "pretrain", "--config", str(REPO / "pretrain" / "tiny.yaml"), "-q"] + (["--resume"] if resume else [])
    recipe = tiny_recipe(shards, out, zero_stage=2, max_steps=10, micro_batch=4, log_every=1, save_every=4, seed=3)
    for key, value in recipe.to_dict()["train"].items():
        if key in ("data", "tokenizer", "out_dir", "seq_len", "micro_batch", "max_steps", "max_minutes", "warmup_steps",
                   "lr", "log_every", "save_every", "zero_stage", "eval_rows", "seed"):
            cmd += ["--set", f"train.{key}={'null' if value is None else value}"]
    return subprocess.run(cmd, env={**cli_env(), **env}, capture_output=True, text=True, timeout=600, cwd=REPO)


@pytest.mark.slow
def test_two_processes_zero2_under_both_launchers_resume_exactly(shards, tmp_path):
    """torchrun, uninterrupted; the deepspeed launcher, SIGKILLed after step 6 and resumed: the same curve."""
    from fault_injection import env as fault_env

    straight, broken = tmp_path / "torchrun", tmp_path / "deepspeed"
    proc = _launch("torchrun", shards, straight)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "partitions nothing" not in proc.stderr  # two processes: a real ZeRO-2 engine
    assert json.loads((straight / "ds_config.json").read_text())["zero_optimization"]["stage"] == 2
    rows = list(csv.DictReader(open(straight / "metrics.csv")))
    assert int(rows[-1]["step"]) == 10 and float(rows[-1]["loss"]) < float(rows[0]["loss"]) - 1.0
    assert int(rows[-1]["tokens"]) == 10 * 2 * 4 * 64  # both ranks' rows counted
    assert (straight / "hf" / "model.safetensors").exists()

    killed = _launch("deepspeed", shards, broken, **fault_env({"kill_after_step": 6}))
    assert killed.returncode != 0 and (broken / "checkpoints" / "latest").read_text().strip() == "step0000004"
    resumed = _launch("deepspeed", shards, broken, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed" in resumed.stderr
    losses = [{int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(out / "metrics.csv"))}
              for out in (straight, broken)]
    assert sorted(losses[1]) == list(range(1, 11))
    assert [losses[1][s] for s in range(1, 11)] == pytest.approx([losses[0][s] for s in range(1, 11)], rel=1e-5)


def test_zero_1_and_2_in_one_process_run_stage_0(shards, tmp_path):
    lines = []
    trainer = Trainer(tiny_recipe(shards, tmp_path / "run", zero_stage=2), progress=False, echo=lines.append)
    assert trainer.config["zero_optimization"]["stage"] == 0 and "partitions nothing" in lines[0]
    from logos.train.engine import ds_config

    plain = tiny_recipe(shards, tmp_path / "run", zero_stage=2, deepspeed="pretrain/ds_zero2.json")
    assert ds_config(plain, 1)["zero_optimization"]["stage"] == 0
    assert ds_config(plain, 2)["zero_optimization"]["stage"] == 2
    offload = tiny_recipe(shards, tmp_path / "run", zero_stage=2, deepspeed="pretrain/ds_zero2_offload.json")
    assert ds_config(offload, 1)["zero_optimization"]["stage"] == 2  # CPU offload is real in one process


def test_killed_run_resumes_to_the_same_loss_curve(shards, tmp_path):
    def losses(out):
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(out / "metrics.csv"))}

    straight = tiny_recipe(shards, tmp_path / "straight", max_steps=6, log_every=1)
    Trainer(straight, progress=False, echo=lambda line: None).train()
    broken = tiny_recipe(shards, tmp_path / "broken", max_steps=6, log_every=1)
    first = Trainer(broken, progress=False, echo=lambda line: None)
    for _ in range(4):
        first.step()
    first.save()  # then the process "dies"
    from logos.cli import main

    args = ["pretrain", "--config", str(tmp_path / "broken" / "recipe.yaml"), "--resume", "-q"]
    assert main(args) == 0
    got, expected = losses(tmp_path / "broken"), losses(tmp_path / "straight")
    assert sorted(got) == [5, 6]  # the resumed process appends its own rows
    assert [got[5], got[6]] == pytest.approx([expected[5], expected[6]], rel=1e-6)
