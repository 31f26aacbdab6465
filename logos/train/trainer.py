"""The training loop: one DeepSpeed engine, packed shards with a loss mask, logging, checkpoints, export.

One code path for every size and for pretraining and finetuning alike (finetuning is data whose
loss mask covers only completions). The same loop runs one process on a laptop or N processes under
``torchrun`` / the ``deepspeed`` launcher; the ZeRO stage, precision and batch come from the recipe.

- Data position = rows consumed; each rank reads an interleaved slice of every global batch, so a
  run's batches do not depend on the world size and a resumed run continues the same sequence.
- The loss is computed here from the logits (per token, fp32, masked), so the per-domain loss
  costs nothing extra; the model is called without labels.
- Every checkpoint (:mod:`logos.train.checkpoint`) also refreshes ``OUT/hf``, a self-contained
  Hugging Face export (ZeRO-3 parameters gathered one module at a time).
- The run directory is self-contained: ``recipe.yaml``, ``ds_config.json``, ``model/config.json``
  (the architecture actually trained, base models included) and ``tokenizer/`` (the tokenizer
  actually used), so ``logos export RUN`` needs nothing else.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from logos.data.shards import Batch, MixtureReader, ShardReader, load_meta
from logos.train import distributed
from logos.train.checkpoint import CheckpointSaveError, CheckpointStore
from logos.train.engine import build_engine, ds_config, resolve_precision
from logos.train.weights import full_state_dict
from logos.train.faults import BadBatch, NonFiniteLoss, StopSignal, check_batch, respond
from logos.train.metrics import MetricsLog, plot_domain_losses, plot_losses
from logos.train.model import build_model, load_base
from logos.train.recipe import Recipe
from logos.train.schedule import Schedule

__all__ = ["Trainer", "TrainResult", "pretrain"]

CKPT_DIR, HF_DIR, TOKENIZER_DIR, MODEL_DIR = "checkpoints", "hf", "tokenizer", "model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "logos_tokenizer.json", "chat_template.jinja")


@dataclass
class TrainResult:
    steps: int
    tokens: int
    seconds: float
    first_loss: float
    last_loss: float
    val_loss: float | None
    out_dir: Path
    stopped_by: str | None = None  # a scheduler's signal ended the run after a checkpoint (resume continues)


class LossMeter:
    """Sums of the loss and of the per-domain token losses over a logging window (packed for one all-reduce)."""

    def __init__(self, domains: int):
        self.domains = domains
        self.sums = torch.zeros(2 + 2 * domains, dtype=torch.float64)  # loss sum, steps, domain sums, counts

    def add(self, loss: float, by_domain: torch.Tensor, counts: torch.Tensor) -> None:
        self.sums += torch.cat([torch.tensor([loss, 1.0]), by_domain.double(), counts.double()])

    def means(self, dist) -> tuple[float, list[float]]:
        """(mean loss, mean loss per domain) over every rank; resets the window."""
        total, n = dist.all_sum(self.sums), self.domains
        self.sums = torch.zeros_like(self.sums)
        per_domain = [(total[2 + i] / total[2 + n + i]).item() if total[2 + n + i] else math.nan for i in range(n)]
        return (total[0] / total[1]).item() if total[1] else math.nan, per_domain


class Trainer:
    """One training run: DeepSpeed engine, shard readers, logging, checkpoints and export."""

    def __init__(self, recipe: Recipe, resume: bool = False, progress: bool | None = None, echo=None,
                 after_save=None):
        t = recipe.train
        self.after_save = after_save  # called on every rank with the step after each checkpoint + export
        self.recipe, self.progress = recipe, progress
        self.out = Path(t.out_dir)
        self.echo = echo or (lambda line: print(line, file=sys.stderr))
        self.dist = distributed.init()
        self.meta = load_meta(Path(t.data))
        self.domains: list[str] = self.meta["domains"]
        self.vocab_size = int(self.meta["vocab_size"])
        self.train_reader = ShardReader(Path(t.data), "train", t.seq_len, seed=t.seed)
        if t.mixture:  # exact per-domain proportions of training rows
            self.train_reader = MixtureReader(self.train_reader, t.mixture)
        self.val_reader = (ShardReader(Path(t.data), "val", t.seq_len, seed=t.seed)
                           if self.meta["tokens"]["val"] > t.seq_len else None)
        self.config = ds_config(recipe, self.dist.world)
        self.precision = resolve_precision(t.precision)
        if self.config["zero_optimization"]["stage"] != t.zero_stage and self.dist.is_main:
            self.echo(f"train: ZeRO-{t.zero_stage} in one process partitions nothing; running stage 0 "
                      f"(ds_config.json records it)")
        self.schedule = Schedule.from_recipe(recipe)
        self.engine, self.scheduler = build_engine(self._build_model(), recipe, self.schedule, self.config)
        self.device = self.engine.device
        self.store = CheckpointStore(self.out / CKPT_DIR, self.dist, t.keep_checkpoints, self.echo)
        self.step_count = self.position = self.tokens_seen = 0
        self.domain_tokens = torch.zeros(len(self.domains), dtype=torch.float64)  # this rank's loss tokens per domain
        self.elapsed = 0.0  # training seconds before this process (resumed runs)
        self.cpu_elapsed = 0.0  # CPU seconds (all threads of this process) before this process
        self.val_by_domain: dict[str, float | None] = {}
        self.last_val: tuple[int, float] | None = None  # (step, validation loss) of the latest evaluation
        self.skipped: set[int] = set()  # data positions of batches left out (faults.py), carried by checkpoints
        self.skips = 0                  # ... of them, left out by this process
        self.stopped_by: str | None = None
        self._t0: float | None = None
        self._rate_mark: tuple[int, float] | None = None
        if resume:
            self.load()

    # ------------------------------------------------------------------ set-up
    def _build_model(self, record: bool = True):
        """The model; with ``record``, also the run directory's record of what is trained (recipe, configs,
        tokenizer)."""
        t = self.recipe.train
        tokenizer_dir = self.out / TOKENIZER_DIR
        if self.dist.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
        record = record and self.dist.is_main
        if t.init_from:  # continued pretraining: the base model and tokenizer plus the grammar symbols
            model, tokenizer = load_base(self.recipe, Path(t.init_from), self.meta["vocab_size"], self.config)
            if record:
                tokenizer.save_pretrained(str(tokenizer_dir))
        else:
            model = build_model(self.recipe, self.meta["vocab_size"], self.meta["bos_id"], self.meta["eos_id"],
                                self.meta.get("pad_id"), self.config)
            if record:
                _copy_tokenizer(t.tokenizer, tokenizer_dir)
        if self.recipe.lora is not None:
            model = self._with_lora(model)
        if record:
            import yaml

            (self.out / "recipe.yaml").write_text(yaml.safe_dump(self.recipe.to_dict(), sort_keys=False))
            (self.out / "ds_config.json").write_text(json.dumps(self.config, indent=1) + "\n")
            model.config.save_pretrained(str(self.out / MODEL_DIR))
        self.dist.barrier()
        return model

    def _with_lora(self, model):
        from logos.train.lora import lora_for_run

        self.dist.barrier()  # rank 0 has written the run's tokenizer
        return lora_for_run(model, self.recipe, self.out / TOKENIZER_DIR)

    # ------------------------------------------------------------------ steps
    def _autocast(self):
        if self.precision == "bf16-autocast":
            return torch.autocast(self.device.type if hasattr(self.device, "type") else "cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _loss(self, batch: Batch, module=None):
        """Masked mean loss of a batch, and its per-domain (loss sums, token counts)."""
        x = torch.from_numpy(batch.tokens[:, :-1]).to(self.device)                  # [B, L]
        y = torch.from_numpy(batch.tokens[:, 1:]).to(self.device)                   # [B, L]
        mask = torch.from_numpy(batch.loss_mask).to(self.device).flatten().float()  # [B*L]
        with self._autocast():
            logits = (module or self.engine)(input_ids=x, use_cache=False).logits    # [B, L, V]
        per_tok = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none") * mask  # [B*L]
        d = torch.from_numpy(batch.domains).to(self.device).flatten()
        sums = torch.zeros(len(self.domains), device=self.device).index_add_(0, d, per_tok.detach())
        counts = torch.zeros(len(self.domains), device=self.device).index_add_(0, d, mask)
        return per_tok.sum() / mask.sum().clamp(min=1.0), sums.cpu(), counts.cpu()

    def step(self) -> tuple[float, torch.Tensor, torch.Tensor]:
        """One optimizer step (``grad_accum`` micro-batches): this rank's mean loss, domain loss sums and counts.

        Faults are raised on every rank at once. Every micro-batch of the step is read and checked for
        corrupt ids before the first backward (:class:`BadBatch`: nothing of the step was computed). A
        non-finite loss is found only by the forward pass, so it is checked before each backward
        (:class:`NonFiniteLoss`); found at micro-batch k > 1, the gradients of micro-batches 1..k-1 are
        already in DeepSpeed's buffers and its micro-step counter has moved, which is why a skip rolls
        back with :meth:`rollback` (a new engine, as a fresh ``--resume`` builds) rather than in place.
        """
        t = self.recipe.train
        rows = t.micro_batch * t.grad_accum * self.dist.world
        while self.position in self.skipped:
            self.position += rows
        starts = [self.position + (k * self.dist.world + self.dist.rank) * t.micro_batch for k in range(t.grad_accum)]
        batches = [self.train_reader.batch(start, t.micro_batch) for start in starts]
        why = None
        for start, batch in zip(starts, batches):
            try:
                check_batch(batch.tokens, self.vocab_size, f"{t.data} train rows {start}..{start + t.micro_batch - 1}")
            except BadBatch as e:
                why = str(e)
                break
        if self.dist.all_max(float(why is not None)) > 0:
            raise BadBatch(why or f"{t.data}: a corrupt batch on another rank at data position {self.position}")
        self.engine.train()
        total, sums, counts = 0.0, torch.zeros(len(self.domains)), torch.zeros(len(self.domains))
        for k, batch in enumerate(batches):
            loss, s, c = self._loss(batch)
            value = loss.item()
            if self.dist.all_max(float(not math.isfinite(value))) > 0:
                raise NonFiniteLoss(f"step {self.step_count + 1}: loss {value} at data position {self.position}"
                                    + (f" (micro-batch {k + 1} of {t.grad_accum})" if t.grad_accum > 1 else ""),
                                    after_backward=k > 0)
            self.engine.backward(loss)
            self.engine.step()
            total, sums, counts = total + value / t.grad_accum, sums + s, counts + c
        self.domain_tokens += counts.double()
        self.step_count, self.position, self.tokens_seen = (self.step_count + 1, self.position + rows,
                                                            self.tokens_seen + rows * t.seq_len)
        return total, sums, counts

    @torch.no_grad()
    def eval_loss(self) -> float | None:
        """Mean validation loss over ``eval_rows`` rows spread over the split (per domain in ``val_by_domain``)."""
        if self.val_reader is None:
            return None
        self.engine.eval()
        n = min(self.recipe.train.eval_rows, self.val_reader.rows)
        # rows spread evenly over the split, so every domain of a multi-domain corpus is represented
        spread = np.unique(np.linspace(0, self.val_reader.rows - 1, n).round().astype(np.int64))
        world, rank = self.dist.world, self.dist.rank
        rows = spread[rank::world][: len(spread) // world] if len(spread) >= world else spread
        meter, mb = LossMeter(len(self.domains)), self.recipe.train.micro_batch
        for i in range(0, len(rows), mb):
            loss, sums, counts = self._loss(self.val_reader.rows_at(rows[i:i + mb]))
            meter.sums += torch.cat([torch.tensor([loss.item() * counts.sum().item(), counts.sum().item()]),
                                     sums.double(), counts.double()])
        mean, by_domain = meter.means(self.dist)
        self.val_by_domain = {d: (None if math.isnan(v) else v) for d, v in zip(self.domains, by_domain)}
        return None if math.isnan(mean) else mean

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """fp32 logits of the training-time model (no autocast) - the reference for export parity."""
        self.engine.eval()
        return self.engine(input_ids=input_ids.to(self.device), use_cache=False).logits.float()

    # ------------------------------------------------------------------ the run
    def train(self) -> TrainResult:
        t = self.recipe.train
        meter, first, last, val = LossMeter(len(self.domains)), math.nan, math.nan, None
        tokens_at_start, self._t0, self._cpu0 = self.tokens_seen, time.perf_counter(), time.process_time()
        window = (self._t0, self.tokens_seen)
        with self._metrics() as log, self._bar() as bar, StopSignal() as signals:
            while self.step_count < self.schedule.steps:
                try:
                    meter.add(*self.step())
                except (BadBatch, NonFiniteLoss) as fault:
                    respond(self, fault)
                    bar.n = self.step_count
                    continue
                bar.update(1)
                self._fix_schedule_length(bar)
                done = self.step_count >= self.schedule.steps or self._out_of_time()
                if self.step_count % t.log_every == 0 or done or self.step_count == 1:
                    evaluate = bool(t.eval_every and self.step_count % t.eval_every == 0) or done
                    last, val, window = self._log(meter, log, bar, window, evaluate)
                    first = last if math.isnan(first) else first
                if self.dist.all_max(float(signals.received is not None)) > 0:  # a scheduler's notice
                    self.stopped_by, done = signals.received or "a signal on another rank", True
                if self.step_count % t.save_every == 0 or done:
                    self.save()
                if done:
                    break
        seconds = time.perf_counter() - self._t0
        self.elapsed, self._t0 = self.elapsed + seconds, None
        self.cpu_elapsed += time.process_time() - self._cpu0
        if self.dist.is_main:
            plot_losses(self.out / "metrics.csv", self.out / "loss.png", f"{self.recipe.name}")
            if self.recipe.train.mixture:
                plot_domain_losses(self.out / "metrics.csv", self.out, f"{self.recipe.name}")
        return TrainResult(self.step_count, self.tokens_seen - tokens_at_start, seconds, first, last, val, self.out,
                           self.stopped_by)

    def _log(self, meter: LossMeter, log, bar, window, evaluate: bool):
        """Reduce the window's losses over ranks, evaluate when due, write a metrics row; (loss, val, window)."""
        mean, by_domain = meter.means(self.dist)
        domain_tokens = self.dist.all_sum(self.domain_tokens).tolist()
        now = time.perf_counter()
        tps = (self.tokens_seen - window[1]) / max(1e-9, now - window[0])
        val = self.eval_loss() if evaluate else None
        if val is not None:
            self.last_val = (self.step_count, val)
        lr = self.scheduler.get_last_lr()[0]
        if log is not None:
            row = {"step": self.step_count, "tokens": self.tokens_seen, "elapsed_s": round(self.elapsed_total(), 2),
                   "cpu_s": round(self.cpu_total(), 2),
                   "lr": lr, "loss": mean, "tokens_per_s": round(tps, 1), "val_loss": val}
            row.update({f"loss_{d}": v for d, v in zip(self.domains, by_domain)})
            row.update({f"tokens_{d}": int(v) for d, v in zip(self.domains, domain_tokens)})
            if val is not None:
                row.update({f"val_loss_{d}": v for d, v in self.val_by_domain.items()})
            log.write(row)
            bar.set_postfix(loss=f"{mean:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}", refresh=False)
            if self.progress is False or not sys.stderr.isatty():
                self.echo(f"step {self.step_count} loss {mean:.4f} lr {lr:.3g} tokens/s {tps:,.0f}"
                          + (f" val {val:.4f}" if val is not None else "")
                          + "".join(f" {d} {v:.4f}" for d, v in zip(self.domains, by_domain)))
        return mean, val, (now, self.tokens_seen)

    def _metrics(self):
        return MetricsLog(self.out / "metrics.csv", self.domains, self.step_count) if self.dist.is_main \
            else contextlib.nullcontext()

    def _bar(self):
        disable = (not self.dist.is_main) or (None if self.progress is None else not self.progress)
        return tqdm(total=self.schedule.steps, initial=self.step_count, unit="step", disable=disable,
                    desc=f"train {self.recipe.name}", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)

    def elapsed_total(self) -> float:
        """Training seconds of this run, earlier processes included (eval, save and export time too)."""
        return self.elapsed + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)

    def cpu_total(self) -> float:
        """CPU seconds of this run's processes on this rank, earlier processes included (the cost on a shared machine)."""
        return self.cpu_elapsed + (time.process_time() - self._cpu0 if self._t0 is not None else 0.0)

    def _out_of_time(self) -> bool:
        budget = self.schedule.budget_seconds
        if budget is None:
            return False
        return self.dist.all_max(float(self.elapsed_total() >= budget)) > 0  # every rank stops at one step

    def _fix_schedule_length(self, bar) -> None:
        """Under a time budget: once, at the end of the hold, fix the LR schedule's length from throughput."""
        now = time.perf_counter()
        if self._rate_mark is None:
            self._rate_mark = (self.step_count, now)  # the first step of this process (start-up cost excluded)
        if not self.schedule.measuring or self.step_count < self.schedule.decay_start:
            return
        mark_step, mark_t = self._rate_mark
        per_step = (now - mark_t) / (self.step_count - mark_step) if self.step_count > mark_step else now - self._t0
        per_step = self.dist.all_max(per_step)
        total = self.schedule.fix_length(self.step_count, self.elapsed_total(), per_step)
        bar.total = total
        if self.dist.is_main:
            self.echo(f"train: {per_step:.3f} s/step; the LR schedule ends at step {total} "
                      f"(time budget {self.schedule.budget_seconds / 60:g} min)")

    # ------------------------------------------------------------------ checkpoints and export
    def save(self) -> Path | None:
        """Atomic DeepSpeed checkpoint (all ranks), then a refreshed ``hf/`` export."""
        state = {"position": self.position, "tokens": self.tokens_seen, "elapsed": self.elapsed_total(),
                 "cpu_elapsed": self.cpu_total(),
                 "domain_tokens": self.dist.gather_objects(self.domain_tokens.tolist()),
                 "schedule_steps": self.schedule.total, "recipe": self.recipe.to_dict(),
                 "skipped": sorted(self.skipped)}
        try:
            path = self.store.save(self.engine, self.step_count, state)
            self._export_or_fail()
        except CheckpointSaveError as e:
            if self.recipe.train.on_save_error == "stop":
                raise
            if self.dist.is_main:
                self.echo(f"train: {e}; training on (train.on_save_error=continue)")
            return None
        self.dist.barrier()
        if self.after_save is not None:
            self.after_save(self)
        return path

    def _export_or_fail(self) -> None:
        why = None
        try:
            self.export(self.out / HF_DIR)
        except OSError as e:
            why = f"{e.strerror or e} ({e.filename or self.out / HF_DIR})"
            shutil.rmtree(self.out / (HF_DIR + ".tmp"), ignore_errors=True)
        why = next((w for w in self.dist.gather_objects(why) if w), None)
        if why:
            raise CheckpointSaveError(f"export {self.out / HF_DIR} not refreshed: {why}; the previous export is intact")

    def rollback(self) -> bool:
        """Back to the newest complete checkpoint exactly as a fresh ``--resume`` gets there (False: none).

        The engine is rebuilt, not reloaded in place: a step cut short after some micro-batches' backward
        leaves their gradients in DeepSpeed's buffers (per ZeRO stage: ``param.grad``, reduced partitions,
        buckets) and its micro-step counter off the accumulation boundary; a new engine has neither.
        """
        if self.store.latest_complete() is None:
            return False
        old, self.engine, self.scheduler = self.engine, None, None
        old.destroy()
        del old
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.engine, self.scheduler = build_engine(self._build_model(record=False), self.recipe, self.schedule,
                                                   self.config)
        return self.load()

    def load(self) -> bool:
        """Resume from the newest complete checkpoint (False when starting fresh)."""
        state = self.store.load(self.engine)
        if state is None:
            return False
        self.step_count, self.position = int(state["step"]), int(state["position"])
        self.tokens_seen, self.elapsed = int(state["tokens"]), float(state.get("elapsed", 0.0))
        self.cpu_elapsed = float(state.get("cpu_elapsed", 0.0))
        saved = state.get("domain_tokens") or []
        if len(saved) == self.dist.world:  # each rank's own counts; another world size: rank 0 takes the sum
            self.domain_tokens = torch.tensor(saved[self.dist.rank], dtype=torch.float64)
        elif saved and self.dist.is_main:
            self.domain_tokens = torch.tensor(saved, dtype=torch.float64).sum(0)
        if state.get("schedule_steps") is not None and self.recipe.train.schedule_steps is None:
            self.schedule.total = int(state["schedule_steps"])  # an explicit train.schedule_steps re-plans the rest
        self.skipped |= {int(p) for p in state.get("skipped", [])}
        return True

    def state_dict_for_export(self, dtype: torch.dtype) -> dict | None:
        """The full model state dict on rank 0 (``None`` elsewhere); collective under ZeRO-3."""
        return full_state_dict(self.engine.module, self.dist, dtype, zero3=self.recipe.train.zero_stage == 3,
                               lora=self.recipe.lora is not None)

    def export(self, out: Path) -> Path | None:
        """A self-contained Hugging Face directory of the current weights (rank 0 writes it)."""
        from logos.train.export import export_hf

        dtype = getattr(torch, self.recipe.train.export_dtype)
        sd = self.state_dict_for_export(dtype)
        if not self.dist.is_main:
            return None
        run = {"recipe": self.recipe.to_dict(), "step": self.step_count, "tokens": self.tokens_seen,
               "precision": self.precision, "shards": self.meta, "world_size": self.dist.world}
        if self.recipe.lora is not None:
            self.engine.module.save_pretrained(str(self.out / "adapter"))  # peft's format, beside the merged export
        return export_hf(sd, self.engine.module.config, self.out / TOKENIZER_DIR, out, run,
                         dtype=self.recipe.train.export_dtype)


def _copy_tokenizer(name: str, dest: Path) -> None:
    """The tokenizer files of a tokenizer directory (user path or shipped name) into the run directory."""
    from logos.util.resources import resolve

    src = resolve(name)
    dest.mkdir(parents=True, exist_ok=True)
    for f in TOKENIZER_FILES:
        if (src / f).exists():
            shutil.copy2(src / f, dest / f)


def pretrain(recipe: Recipe, resume: bool = False, progress: bool | None = None) -> TrainResult:
    return Trainer(recipe, resume=resume, progress=progress).train()
