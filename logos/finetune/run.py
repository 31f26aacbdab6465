"""``logos finetune``: build the task's pairs, pack them, train through the one trainer, score every checkpoint.

A finetune is data plus a recipe: the run directory gets ``data/pairs.jsonl`` (and ``data/val_pairs.jsonl``
when ``finetune.val_sources`` are given), ``data/shards`` packed with the base checkpoint's tokenizer
(loss on completion tokens only), then :class:`logos.train.Trainer` trains from ``train.init_from``
(full finetuning, or LoRA with a ``lora`` section) with the same checkpoints, exact resume and faults
handling as pretraining. After every checkpoint the task's own metric is computed on
``finetune.metric_items`` held-out items by generating from the fresh export (the same code as
``logos generate`` and ``logos evaluate``): top-1 exact match for ``retro``/``forward``, exact match of
the completion for other tasks. It is logged to ``task_metrics.csv`` and the best export is kept as
``best/``: a tie (common while a few held-out items are right) goes to the lower validation loss, when the
trainer evaluated at both steps, else keeps the earlier one.
"""

from __future__ import annotations

import csv
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from logos.tasks import build_pairs, get
from logos.tasks.pairs import PairOptions
from logos.util.records import ErrorLog, InputError, errors_path_for, read_records
from logos.train.recipe import ConfigError, Recipe

__all__ = ["finetune", "FinetuneResult", "prepare_data", "describe", "TaskMetric"]


@dataclass
class FinetuneResult:
    train: object            # logos.train.TrainResult
    pairs: int
    best_metric: float | None
    best_step: int | None


def _tokenizer_of(recipe: Recipe) -> Path:
    """The base checkpoint (a user path or a shipped name such as ``checkpoints/logos-tiny``), resolved."""
    from logos.util.resources import ResourceNotFound, resolve

    base = recipe.train.init_from
    if base is None:
        raise ConfigError("a finetune needs train.init_from (the checkpoint to start from, or --init-from)")
    try:
        return resolve(base)
    except ResourceNotFound as e:
        raise ConfigError(f"train.init_from: {e}") from None


def _parts(recipe: Recipe) -> list[dict]:
    f = recipe.finetune
    return f.parts if f.parts else [{"task": f.task, "sources": f.sources, "weight": 1.0}]


def _task(recipe: Recipe) -> str:
    """The task the metric scores: the recipe's, or a multitask recipe's first part."""
    return _parts(recipe)[0]["task"]


def _write_pairs(recipe: Recipe, out: Path, errors: ErrorLog) -> tuple[int, list[Path]]:
    """The pair builder's output in ``out``: ``pairs.jsonl`` (every part of the recipe) and, with
    ``finetune.val_sources``, ``val_pairs.jsonl``; (pairs written, the validation files)."""
    f = recipe.finetune
    if not f.sources and not f.parts:
        raise ConfigError("finetune.sources is empty: name the files to build the task's pairs from")
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    for part in _parts(recipe):
        options = PairOptions(task=part["task"], augment=part.get("augment", f.augment),
                              augment_side=part.get("augment_side", f.augment_side), seed=recipe.train.seed,
                              marker=part.get("marker", f.marker), with_space_group=f.with_space_group)
        n += build_pairs([Path(s) for s in part["sources"]], options, out / "pairs.jsonl", errors, append=bool(n))
    val_files = []
    if f.val_sources:
        val_options = PairOptions(task=_task(recipe), seed=recipe.train.seed, marker=f.marker,
                                  with_space_group=f.with_space_group)  # held-out items: canonical only
        build_pairs([Path(s) for s in f.val_sources], val_options, out / "val_pairs.jsonl", errors)
        val_files = [out / "val_pairs.jsonl"]
    if n == 0:
        raise InputError(f"no pairs built from {', '.join(str(s) for p in _parts(recipe) for s in p['sources'])} "
                         f"(see {errors.path})")
    return n, val_files


def prepare_data(recipe: Recipe, echo) -> tuple[Path, int]:
    """Pairs and shards in ``OUT/data`` (kept on resume); (shard dir, number of pairs)."""
    from logos.data.pack import pack

    f, out = recipe.finetune, Path(recipe.train.out_dir) / "data"
    shards = out / "shards"
    if (shards / "meta.json").exists():
        return shards, sum(1 for _ in open(out / "pairs.jsonl"))
    errors = ErrorLog(errors_path_for(out / "pairs.jsonl"), echo=lambda line: None)
    try:
        n, val_files = _write_pairs(recipe, out, errors)
    finally:
        errors.close()
    echo(f"finetune: {n:,} {'+'.join(p['task'] for p in _parts(recipe))} pairs"
         + (f", {errors.count} records refused (see {errors.path})" if errors.count else ""))
    pack([out / "pairs.jsonl"], _tokenizer_of(recipe), shards, val_fraction=f.val_fraction,
         val_inputs=val_files or None, seed=recipe.train.seed, progress=False)
    return shards, n


def describe(recipe: Recipe) -> str:
    """``logos finetune --dry-run``: the resolved recipe, the parameter count of the model it trains (the base
    checkpoint with the grammar symbols; with LoRA also what trains), and what the pair builder makes of the
    sources: pairs per split (the split ``logos pack`` will make) and the first pair. The pairs are built in a
    temporary folder; nothing is written to ``train.out_dir`` and nothing trains."""
    import tempfile

    from logos.data.splits import group_key, split_of
    from logos.train.model import describe as describe_model

    if recipe.finetune is None:
        raise ConfigError("not a finetune recipe: it has no finetune section (see finetune/*.yaml)")
    recipe.train.init_from = str(_tokenizer_of(recipe))
    lines = [describe_model(recipe)]
    f = recipe.finetune
    with tempfile.TemporaryDirectory(prefix="logos-finetune-dry-") as tmp:
        errors = ErrorLog(None, echo=lambda line: None)
        n, val_files = _write_pairs(recipe, Path(tmp), errors)
        records = list(read_records(Path(tmp) / "pairs.jsonl"))  # as logos pack reads them
        if val_files:
            split = {"train": n, "validation": sum(1 for _ in open(val_files[0]))}
            rule = "validation: finetune.val_sources"
        else:
            split = {"train": 0, "validation": 0}
            for r in records:
                split["validation" if split_of(group_key(r), recipe.train.seed, f.val_fraction) == "validation"
                      else "train"] += 1
            rule = f"validation: {f.val_fraction:g} of the groups by seeded hash"
    tasks = "+".join(p["task"] for p in _parts(recipe))
    lines.append(f"# pairs ({tasks}): {split['train']:,} train, {split['validation']:,} validation ({rule})"
                 + (f"; {errors.count} source records refused" if errors.count else ""))
    first = records[0]
    lines.append("# first pair: " + json.dumps({k: first[k] for k in ("id", "prompt", "completion") if k in first}))
    return "\n".join(lines)


@dataclass(frozen=True)
class Scored:
    """One scored checkpoint: the task metric (rounded as logged), its step, the validation loss there (or None)."""

    value: float
    step: int
    val_loss: float | None = None

    def beats(self, other: "Scored | None") -> bool:
        """A higher metric wins; a tie goes to the lower validation loss where both have one, else to ``other``."""
        if other is None or self.value != other.value:
            return other is None or self.value > other.value
        return self.val_loss is not None and other.val_loss is not None and self.val_loss < other.val_loss


LOG_FIELDS = ["step", "metric", "value", "items", "best_step", "val_loss"]


class TaskMetric:
    """The task's metric on held-out items, from the run's fresh export; keeps ``best/`` (see the module docstring)."""

    def __init__(self, recipe: Recipe, data: Path, echo):
        self.recipe, self.echo = recipe, echo
        self.out = Path(recipe.train.out_dir)
        self.items = self._held_out(data)
        self.best: Scored | None = None
        self.log = self.out / "task_metrics.csv"
        if self.log.exists():  # a resumed run: the best so far, in the order it was scored
            rows = list(csv.DictReader(open(self.log)))
            for r in rows:
                scored = Scored(float(r["value"]), int(r["step"]), float(r["val_loss"]) if r.get("val_loss") else None)
                self.best = scored if scored.beats(self.best) else self.best
            if rows and "val_loss" not in rows[0]:  # a log written before the column: rewritten with it, empty
                self._write(rows, mode="w")

    def _write(self, rows: list[dict], mode: str = "a") -> None:
        new = mode == "w" or not self.log.exists()
        with open(self.log, mode, newline="") as fh:
            w = csv.DictWriter(fh, LOG_FIELDS, restval="")
            if new:
                w.writeheader()
            w.writerows(rows)

    def _held_out(self, data: Path) -> list[dict]:
        f = self.recipe.finetune
        path = data / "val_pairs.jsonl" if (data / "val_pairs.jsonl").exists() else None
        records = [json.loads(line) for line in open(path)] if path else []
        if not records:  # the packed val split: its groups, canonical variants only
            from logos.data.splits import group_key, split_of

            records = [r for r in map(json.loads, open(data / "pairs.jsonl")) if "#" not in str(r.get("id", ""))
                       and r.get("domain") == _task(self.recipe)
                       and split_of(group_key(r), self.recipe.train.seed, f.val_fraction) == "validation"]
        return records[: f.metric_items]

    @property
    def name(self) -> str:
        return get(_task(self.recipe), "finetune").finetune_metric

    def score(self, checkpoint: Path) -> float:
        from logos.generate import GenerateOptions, Sampling, generate

        f = self.recipe.finetune
        task = _task(self.recipe) if self.name == "top1" else None
        work = self.out / "task_metric_work"
        work.mkdir(exist_ok=True)
        if task:
            inputs = work / "inputs.smi"
            inputs.write_text("".join(f"{_smiles_of(r['prompt'])} item{i}\n" for i, r in enumerate(self.items)))
            options = GenerateOptions(task=task, n=f.metric_samples, batch_size=8,
                                      sampling=Sampling(max_new_tokens=128), seed=0, resamples=1)
            result = generate(checkpoint, work / "out.rsmi", options, inputs=inputs, progress=False)
            top1 = {}
            for s in result.samples:  # ranked per input: the first of each input is its top-1
                top1.setdefault(s.input_id, s.key)
            hits = sum(top1.get(f"item{i}") == _answer_key(r["completion"]) for i, r in enumerate(self.items))
            return hits / max(1, len(self.items))
        return self._exact_match(checkpoint)

    def _exact_match(self, checkpoint: Path) -> float:
        """Greedy completion of each prompt equals the reference completion (grammar tasks without a scorer here)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(checkpoint))
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint)).eval()
        hits = 0
        for r in self.items:
            ids = tok(r["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"]
            if tok.bos_token_id is not None:
                ids = torch.cat([torch.tensor([[tok.bos_token_id]]), ids], dim=1)
            want = tok(r["completion"], add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                got = model.generate(ids, max_new_tokens=len(want) + 1, do_sample=False,
                                     pad_token_id=tok.pad_token_id or tok.eos_token_id)[0, ids.shape[1]:].tolist()
            hits += got[: len(want)] == want
        return hits / max(1, len(self.items))

    def __call__(self, trainer) -> None:
        if not self.items or not trainer.dist.is_main:
            trainer.dist.barrier()
            return
        step = trainer.step_count
        at = trainer.last_val
        scored = Scored(round(self.score(self.out / "hf"), 4), step, at[1] if at and at[0] == step else None)
        improved = scored.beats(self.best)
        if improved:
            tmp = self.out / "best.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(self.out / "hf", tmp)
            shutil.rmtree(self.out / "best", ignore_errors=True)
            tmp.replace(self.out / "best")
            self.best = scored
        self._write([{"step": step, "metric": self.name, "value": f"{scored.value:.4f}", "items": len(self.items),
                      "best_step": self.best.step,
                      "val_loss": "" if scored.val_loss is None else f"{scored.val_loss:.6f}"}])
        self.echo(f"finetune: step {step} {self.name} {scored.value:.3f} on {len(self.items)} held-out items"
                  + (" (best so far -> best/)" if improved else f" (best {self.best.value:.3f} at step {self.best.step})"))
        trainer.dist.barrier()


def _smiles_of(prompt: str) -> str:
    from logos.science.chemistry import molecules_in_text

    return ".".join(molecules_in_text(prompt))


def _answer_key(completion: str) -> str:
    from logos.science.chemistry import canonical_smiles, molecules_in_text, parse_smiles

    return ".".join(sorted(canonical_smiles(parse_smiles(s)) for s in molecules_in_text(completion)))


def finetune(recipe: Recipe, resume: bool = False, progress: bool | None = None, echo=None) -> FinetuneResult:
    """Build the data (once), train, score: see the module docstring."""
    from logos.train import Trainer, distributed

    echo = echo or (lambda line: print(line, file=sys.stderr))
    if recipe.finetune is None:
        raise ConfigError("not a finetune recipe: it has no finetune section (see finetune/*.yaml)")
    dist = distributed.init()
    recipe.train.init_from = str(_tokenizer_of(recipe))
    shards, n = prepare_data(recipe, echo) if dist.is_main else (Path(recipe.train.out_dir) / "data" / "shards", 0)
    dist.barrier()
    recipe.train.data = str(shards)
    if recipe.finetune.parts:  # exact per-task proportions of training rows (records' domain = task)
        weights = {p["task"]: float(p.get("weight", 1.0)) for p in recipe.finetune.parts}
        recipe.train.mixture = {k: v / sum(weights.values()) for k, v in weights.items()}
    metric = TaskMetric(recipe, shards.parent, echo) if recipe.finetune.metric_items else None
    trainer = Trainer(recipe, resume=resume, progress=progress, echo=echo, after_save=metric)
    result = trainer.train()
    best = metric.best if metric else None
    return FinetuneResult(result, n, best.value if best else None, best.step if best else None)
