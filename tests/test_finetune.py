"""logos finetune: pairs from real reactions, the completion-only loss mask, full and LoRA finetuning, merged
export parity, exact resume."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from logos.tasks import build_pairs
from logos.tasks.pairs import PairOptions
from logos.util.records import ErrorLog
from logos.train.recipe import load_recipe
from train_fixtures import REPO, cli_env

ASSET = Path(__file__).parent / "assets" / "reactions" / "uspto50k_val_120.csv"


@pytest.fixture(scope="module")
def reactions() -> Path:
    """120 atom-mapped USPTO-50k validation reactions (the first rows of the shared benchmark file)."""
    return ASSET


def _errors(tmp_path):
    return ErrorLog(tmp_path / "errors.jsonl", echo=lambda line: None)


def test_reaction_pairs_drop_atom_maps_and_keep_variants_in_one_group(reactions, tmp_path):
    from rdkit import Chem

    out = tmp_path / "pairs.jsonl"
    n = build_pairs([reactions], PairOptions(task="retro", augment=2, seed=1), out, _errors(tmp_path))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert n == len(rows) == 3 * 120
    first = [r for r in rows if r["id"].startswith("US20090105259A1")]
    assert len(first) == 3 and len({r["group"] for r in first}) == 1  # one reaction, one split side
    assert first[0]["prompt"].endswith("<ReverseReact>") and ":" not in first[0]["prompt"]  # maps removed
    canon = lambda text: sorted(Chem.CanonSmiles(s) for s in text.replace("<MoleculeS>", " ").replace(  # noqa: E731
        "<MoleculeE>", " ").replace("<ReverseReact>", " ").split())
    assert canon(first[1]["completion"]) == canon(first[0]["completion"])  # a randomized spelling ...
    assert first[1]["completion"] != first[0]["completion"]                  # ... of the same reactants
    assert canon(first[0]["prompt"]) == [Chem.CanonSmiles(
        "CC(C)C[C@H](NC(=O)c1cc2ccccc2s1)C(=O)NCCCCNC(=O)OC(C)(C)C")]


def test_prompt_side_augmentation_keeps_one_canonical_answer_per_reaction(reactions, tmp_path):
    from rdkit import Chem

    out = tmp_path / "pairs.jsonl"
    build_pairs([reactions], PairOptions(task="retro", augment=3, augment_side="prompt", seed=1), out,
                _errors(tmp_path))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    by_group: dict[str, list[dict]] = {}
    for r in rows:
        by_group.setdefault(r["group"], []).append(r)
    for variants in by_group.values():
        assert len({r["completion"] for r in variants}) == 1  # the answer is written one way
    first = by_group[rows[0]["group"]]
    assert len({r["prompt"] for r in first}) > 1  # ... while the product is spelled several ways
    products = {Chem.CanonSmiles(r["prompt"].split("<MoleculeS>")[1].split("<MoleculeE>")[0]) for r in first}
    assert len(products) == 1


def test_xz_compressed_benchmark_files_read_like_plain_ones(reactions, tmp_path):
    import lzma

    packed = tmp_path / "raw_valid.csv.xz"
    packed.write_bytes(lzma.compress(reactions.read_bytes()))
    plain, xz = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    build_pairs([reactions], PairOptions(task="forward"), plain, _errors(tmp_path))
    build_pairs([packed], PairOptions(task="forward"), xz, _errors(tmp_path))
    assert xz.read_text() == plain.read_text() and len(plain.read_text().splitlines()) == 120


def test_split_and_jsonl_pairs_cut_at_the_marker_and_refuse_bad_rows(tmp_path):
    src = tmp_path / "pockets.jsonl"
    src.write_text(json.dumps({"id": "p1", "text": "<ProteinS>MKT<ProteinE><Search><ProteinS>M<PocketS>K<PocketE>T"
                                                     "<ProteinE>"}) + "\n" + json.dumps({"id": "p2", "text": "<ProteinS>MK<ProteinE>"}) + "\n")
    out, errors = tmp_path / "pairs.jsonl", _errors(tmp_path)
    assert build_pairs([src], PairOptions(task="pocket"), out, errors) == 1
    pair = json.loads(out.read_text())
    assert pair["prompt"] == "<ProteinS>MKT<ProteinE><Search>" and pair["completion"].startswith("<ProteinS>M<PocketS>")
    assert errors.count == 1
    bad = tmp_path / "sft.jsonl"
    bad.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "a"}\n')
    assert build_pairs([bad], PairOptions(task="pairs"), tmp_path / "p2.jsonl", errors) == 1


def test_loss_mask_covers_exactly_the_completion_and_its_end(tmp_path):
    from logos.data.pack import pack
    from logos.data.shards import ShardReader
    from transformers import AutoTokenizer

    tok_dir = REPO / "checkpoints" / "logos-tiny"
    pairs = tmp_path / "pairs.jsonl"
    prompt, completion = "<MoleculeS>CC(=O)OCC<MoleculeE><ReverseReact>", "<MoleculeS>CC(=O)O<MoleculeE><MoleculeS>CCO<MoleculeE>"
    pairs.write_text(json.dumps({"prompt": prompt, "completion": completion, "domain": "retro"}) + "\n")
    pack([pairs], tok_dir, tmp_path / "shards", val_fraction=0.0, progress=False)
    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    p_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    c_ids = tok(completion, add_special_tokens=False)["input_ids"]
    doc = [tok.bos_token_id] + p_ids + c_ids + [tok.eos_token_id]
    reader = ShardReader(tmp_path / "shards", "train", seq_len=len(doc) - 1)
    batch = reader.rows_at([0])
    assert batch.tokens[0].tolist() == doc
    targets = batch.tokens[0, 1:]
    trained = targets[batch.loss_mask[0].astype(bool)].tolist()
    assert trained == c_ids + [tok.eos_token_id]  # the completion's tokens and the end; no prompt token


def _recipe(tmp_path: Path, reactions: Path, name: str, *extra: str):
    return load_recipe(REPO / "finetune" / "retro.yaml", [
        f"finetune.sources=[{reactions}]", f"train.out_dir={tmp_path / name}", "train.max_minutes=null",
        "train.max_steps=12", "train.warmup_steps=2", "train.save_every=6", "train.log_every=1", "train.seq_len=128",
        "train.micro_batch=4", "train.eval_every=0", "train.eval_rows=8", "train.lr=1e-3", "finetune.metric_items=0",
        "finetune.augment=0", "finetune.val_fraction=0.1", *extra])


def _losses(out: Path) -> dict[int, float]:
    return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(out / "metrics.csv"))}


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_full_and_lora_finetuning_lower_the_completion_loss(reactions, tmp_path, lora):
    from logos.finetune import finetune

    extra = ["lora.rank=8", "train.lr=3e-3"] if lora else []
    result = finetune(_recipe(tmp_path, reactions, "run", *extra), progress=False, echo=lambda line: None)
    losses = _losses(tmp_path / "run")
    first, last = np.mean([losses[s] for s in (1, 2, 3)]), np.mean([losses[s] for s in (10, 11, 12)])
    assert last < first - 0.3, losses
    assert result.train.steps == 12
    if lora:
        assert (tmp_path / "run" / "adapter" / "adapter_config.json").exists()


def test_lora_merged_export_reproduces_the_live_model(reactions, tmp_path):
    from transformers import AutoModelForCausalLM

    from logos.finetune.run import prepare_data
    from logos.train import Trainer

    recipe = _recipe(tmp_path, reactions, "run", "lora.rank=8", "train.lr=3e-2")
    recipe.train.init_from = str(REPO / "checkpoints" / "logos-tiny")
    shards, _ = prepare_data(recipe, echo=lambda line: None)
    recipe.train.data = str(shards)
    trainer = Trainer(recipe, progress=False, echo=lambda line: None)
    for _ in range(4):
        trainer.step()
    trainer.save()
    x = torch.tensor([trainer.train_reader.batch(0, 1).tokens[0, :48].tolist()])
    live = trainer.logits(x)
    base = AutoModelForCausalLM.from_pretrained(REPO / "checkpoints" / "logos-tiny").eval()
    with torch.no_grad():
        assert not torch.allclose(base(x).logits, live, atol=1e-3)  # the adapters changed the model ...
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf").eval()(x).logits
    torch.testing.assert_close(merged, live, rtol=1e-4, atol=1e-4)  # ... and the merged export is that model


def test_best_checkpoint_ties_go_to_the_lower_validation_loss():
    from logos.finetune.run import Scored

    first = Scored(0.0, 500, 2.0)
    assert Scored(0.0, 1000, 1.5).beats(first)            # a tie: the lower validation loss
    assert not Scored(0.0, 1000, 2.5).beats(first)
    assert not Scored(0.0, 1000, None).beats(first)       # no loss at that step: the earlier stays
    assert Scored(0.005, 1000, 9.0).beats(first)          # a higher metric wins whatever the loss
    assert not Scored(0.0, 1000, 0.1).beats(Scored(0.005, 500, 2.0))
    assert Scored(0.0, 500, None).beats(None)


def test_finetune_keeps_the_best_scored_export_as_best(reactions, tmp_path):
    """Every checkpoint is scored on held-out products (top-1) with the validation loss beside it; best/ is the
    export the rule picks from that log, and the log survives a resume."""
    from logos.finetune import finetune
    from logos.finetune.run import Scored

    recipe = _recipe(tmp_path, reactions, "run", "train.save_every=4", "train.eval_every=4",
                     "finetune.metric_items=4", "finetune.metric_samples=2")
    result = finetune(recipe, progress=False, echo=lambda line: None)
    rows = list(csv.DictReader(open(tmp_path / "run" / "task_metrics.csv")))
    assert [int(r["step"]) for r in rows] == [4, 8, 12] and all(r["val_loss"] for r in rows)
    best = None
    for r in rows:
        scored = Scored(float(r["value"]), int(r["step"]), float(r["val_loss"]))
        best = scored if scored.beats(best) else best
    if len({r["value"] for r in rows}) == 1:  # all tied: the lowest validation loss
        assert best.step == int(min(rows, key=lambda r: float(r["val_loss"]))["step"])
    assert result.best_step == best.step == int(rows[-1]["best_step"])
    assert json.loads((tmp_path / "run" / "best" / "logos_run.json").read_text())["step"] == best.step


@pytest.mark.slow
def test_killed_finetune_resumes_exactly(reactions, tmp_path):
    from fault_injection import env as fault_env
    from train_fixtures import FAULT_ENTRY

    def run(name: str, env_extra: dict, *args: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(FAULT_ENTRY), "finetune", "--config", str(REPO / "finetune" / "retro.yaml"), "-q",
               "--set", f"finetune.sources=[{reactions}]", "--set", f"train.out_dir={tmp_path / name}",
               "--set", "train.max_minutes=null", "--set", "train.max_steps=8", "--set", "train.save_every=4",
               "--set", "train.log_every=1", "--set", "train.seq_len=128", "--set", "train.micro_batch=4",
               "--set", "train.eval_every=0", "--set", "finetune.metric_items=0", "--set", "finetune.augment=1", *args]
        return subprocess.run(cmd, env={**cli_env(), **env_extra}, capture_output=True, text=True, timeout=900)

    straight = run("straight", {})
    assert straight.returncode == 0, straight.stderr
    killed = run("broken", fault_env({"kill_after_step": 4}))
    assert killed.returncode == -9
    resumed = run("broken", {}, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    got, expected = _losses(tmp_path / "broken"), _losses(tmp_path / "straight")
    assert [got[s] for s in (5, 6, 7, 8)] == pytest.approx([expected[s] for s in (5, 6, 7, 8)], rel=1e-6)


def test_multitask_mixes_tasks_in_exact_proportions(reactions, tmp_path, monkeypatch):
    from logos.finetune.run import finetune
    from logos.train import Trainer

    recipe = load_recipe(REPO / "finetune" / "multitask.yaml", [
        f"finetune.parts=[{{task: retro, sources: [{reactions}], weight: 3}}, "
        f"{{task: forward, sources: [{reactions}], weight: 1}}]",
        f"train.out_dir={tmp_path / 'multi'}", "train.max_minutes=null", "train.max_steps=1", "train.seq_len=128",
        "train.micro_batch=4", "train.eval_every=0", "finetune.metric_items=0", "train.save_every=1000"])
    seen = {}

    class Spy(Trainer):  # the run's own reader: which task each of the first 400 training rows comes from
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            for p in range(400):
                d = self.train_reader.domain_of(p)
                seen[d] = seen.get(d, 0) + 1

    import logos.train

    monkeypatch.setattr(logos.train, "Trainer", Spy)  # finetune() imports it from logos.train at call time
    finetune(recipe, progress=False, echo=lambda line: None)
    assert abs(seen["retro"] - 300) <= 2 and abs(seen["forward"] - 100) <= 2, seen


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_dry_run_prints_recipe_parameters_and_the_pairs_pack_would_split(reactions, tmp_path, capsys, lora):
    from logos.cli import main
    from logos.finetune.run import prepare_data

    extra = ["--set", "lora.rank=8"] if lora else []
    sets = [f"finetune.sources=[{reactions}]", f"train.out_dir={tmp_path / 'dry'}", "finetune.augment=2",
            "finetune.val_fraction=0.2"]
    argv = ["finetune", "--config", str(REPO / "finetune" / "retro.yaml"), "--dry-run", *extra]
    for s in sets:
        argv += ["--set", s]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "dry").exists()  # nothing written, nothing trained
    assert "task: retro" in out and "augment: 2" in out and "LlamaForCausalLM" in out
    assert "# parameters: 5,049,600" in out  # the shipped tiny checkpoint with the grammar symbols
    trainable = [line for line in out.splitlines() if line.startswith("# trainable with LoRA rank 8:")]
    if lora:
        n = int(trainable[0].split(":")[1].split()[0].replace(",", ""))
        assert 0 < n < 5_049_600
    else:
        assert not trainable
    pairs = next(line for line in out.splitlines() if line.startswith("# pairs (retro):"))
    train, val = (int(x.replace(",", "")) for x in re.findall(r"([\d,]+) (?:train|validation)", pairs))
    first = json.loads(next(line for line in out.splitlines() if line.startswith("# first pair: "))[14:])
    assert first["prompt"].endswith("<ReverseReact>") and first["completion"].startswith("<MoleculeS>")

    # the same recipe's real data preparation packs exactly those splits
    recipe = _recipe(tmp_path, reactions, "run", "finetune.augment=2", "finetune.val_fraction=0.2")
    recipe.train.init_from = str(REPO / "checkpoints" / "logos-tiny")
    shards, n = prepare_data(recipe, echo=lambda line: None)
    docs = json.loads((shards / "meta.json").read_text())["docs"]
    assert (train, val) == (docs["train"], docs["val"]) and train + val == n and val > 0
