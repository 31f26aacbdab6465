"""``logos pretrain``: train a transformers decoder on packed shards through the DeepSpeed engine.

The only module that imports DeepSpeed. One code path for every size: the recipe
(:mod:`logos.config`) gives the ZeRO stage, precision, micro-batch, gradient accumulation, LR
schedule and clipping; the same function runs one process on a laptop (the env defaults below
stand in for a launcher) or N processes under ``torchrun`` / the ``deepspeed`` launcher.

Choices:

- Backend: gloo on CPU, nccl on GPU. A torch ``AdamW`` is handed to DeepSpeed (its fused/CPU Adam
  JIT-compiles for minutes on CPU); the LR schedule is a ``LambdaLR`` that DeepSpeed steps and
  checkpoints.
- Precision ``bf16-autocast`` keeps fp32 weights in the engine and runs the forward under
  ``torch.autocast(bfloat16)`` (2.3-2.5x faster than fp32 on CPU, NOTES.md); ``bf16`` is
  DeepSpeed's bf16 mode (bf16 weights, fp32 master copy), the GPU choice.
- The loss is computed here from the logits (per token, fp32) so the per-domain loss costs nothing
  extra; the model is called without labels.
- Data position = rows consumed; each rank reads an interleaved slice of every global batch, so a
  run's batches do not depend on the world size and a resumed run continues the same sequence.
- Every checkpoint (DeepSpeed tag ``stepNNNNNNN`` with model, optimizer, scheduler, data position)
  also refreshes ``OUT/hf``, a self-contained Hugging Face export (ZeRO-3 parameters gathered).
- Exact resume: the checkpoint also carries every rank's RNG states (torch, CUDA, python, numpy).
  Saves are atomic (``logos_manifest.json`` with each file's size and sha256, then ``latest`` moved
  by ``os.replace``); ``--resume`` refuses a tag whose files do not match its manifest and falls
  back to the previous complete one, and drops ``metrics.csv`` rows past the resumed step.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
import os
import random
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from logos.config import ConfigError, Recipe, padded_vocab
from logos.pack import MixtureReader, ShardReader, load_meta

__all__ = ["Trainer", "TrainResult", "pretrain", "describe", "ds_config", "lr_lambda"]

CKPT_DIR = "checkpoints"
HF_DIR = "hf"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _dist_env_defaults() -> None:
    """Single-process defaults for the variables a launcher would set (else DeepSpeed looks for MPI)."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


# ---------------------------------------------------------------------- atomic checkpoints
# A checkpoint tag is *complete* when its folder holds MANIFEST (every other file's relative path,
# size and sha256, plus step and data position) and every listed file matches it. The manifest is
# written only after DeepSpeed's save returned on every rank, and ``latest`` moves (temp file +
# os.replace) only after the manifest is on disk: ``latest`` always names a complete checkpoint.
MANIFEST = "logos_manifest.json"
LATEST = "latest"
# Fault injection, for tests only: with LOGOS_FAULT_KILL_IN_SAVE=N the process SIGKILLs itself during
# its N-th save(), after DeepSpeed wrote the tag's files but before the manifest and `latest`.
FAULT_KILL_IN_SAVE = "LOGOS_FAULT_KILL_IN_SAVE"


class CheckpointError(RuntimeError):
    """``--resume`` found checkpoints but none of them is usable."""


def _tag_step(name: str) -> int | None:
    return int(name[4:]) if name.startswith("step") and name[4:].isdigit() else None


def checkpoint_tags(ckpt: Path) -> list[str]:
    """Tag folders ``stepNNNNNNN`` in ``ckpt``, newest (highest step) first."""
    if not ckpt.is_dir():
        return []
    tags = [p.name for p in ckpt.iterdir() if p.is_dir() and _tag_step(p.name) is not None]
    return sorted(tags, key=_tag_step, reverse=True)


def read_latest(ckpt: Path) -> str | None:
    path = ckpt / LATEST
    return (path.read_text().strip() or None) if path.is_file() else None


def resume_candidates(ckpt: Path) -> list[str]:
    """Tags to try on resume: the one ``latest`` names, then the older tags newest-first.

    Tags newer than ``latest`` are not candidates: ``latest`` moving is the commit, so they belong to
    a save that never committed (or to a timeline abandoned by an earlier fallback).
    """
    tags = checkpoint_tags(ckpt)
    latest = read_latest(ckpt)
    if latest is None or _tag_step(latest) is None:
        return tags
    return [latest] + [t for t in tags if _tag_step(t) < _tag_step(latest)]


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` via a temp file in the same folder + fsync + ``os.replace`` (never half-written)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _file_digest(path: Path, sync: bool = False) -> tuple[int, str]:
    """(size, sha256) of a file; ``sync`` also fsyncs it (the bytes are durable before the manifest)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
        if sync:
            with contextlib.suppress(OSError):
                os.fsync(fh.fileno())
    return path.stat().st_size, h.hexdigest()


def checkpoint_files(tag_dir: Path) -> list[str]:
    """Relative paths (posix) of every file in a tag folder except the manifest, sorted."""
    return sorted(p.relative_to(tag_dir).as_posix() for p in tag_dir.rglob("*")
                  if p.is_file() and p.name != MANIFEST)


def digest_files(tag_dir: Path, files: list[str], sync: bool = False) -> dict[str, dict]:
    return {f: dict(zip(("size", "sha256"), _file_digest(tag_dir / f, sync))) for f in files}


def write_manifest(tag_dir: Path, entries: dict[str, dict], **info) -> None:
    body = {"format": 1, **info, "files": {f: entries[f] for f in sorted(entries)}}
    atomic_write_text(tag_dir / MANIFEST, json.dumps(body, indent=1) + "\n")


def read_manifest(tag_dir: Path) -> tuple[dict | None, str | None]:
    """(manifest, None) or (None, why the tag is incomplete)."""
    if not tag_dir.is_dir():
        return None, "missing (no such folder)"
    path = tag_dir / MANIFEST
    if not path.is_file():
        return None, f"incomplete (missing {MANIFEST})"
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        assert isinstance(files, dict) and files
        return manifest, None
    except Exception:  # noqa: BLE001 - any unreadable manifest means the same thing
        return None, f"corrupt (unreadable {MANIFEST})"


def verify_files(tag_dir: Path, manifest: dict, files: list[str]) -> str | None:
    """Why the listed ``files`` of a tag do not match its manifest (None when they all match)."""
    for f in files:
        try:
            want = {"size": int(manifest["files"][f]["size"]), "sha256": str(manifest["files"][f]["sha256"])}
        except (KeyError, TypeError, ValueError):
            return f"corrupt (unreadable {MANIFEST})"
        path = tag_dir / f
        if not path.is_file():
            return f"incomplete ({f} is missing)"
        size = path.stat().st_size
        if size != want["size"]:
            return f"corrupt ({f}: {size} bytes, the manifest says {want['size']})"
        if _file_digest(path)[1] != want["sha256"]:
            return f"corrupt ({f}: sha256 differs from the manifest)"
    return None


def verify_checkpoint(tag_dir: Path) -> str | None:
    """Why a tag folder is not a complete checkpoint (None when it is): manifest present, files match."""
    manifest, why = read_manifest(tag_dir)
    return why or verify_files(tag_dir, manifest, sorted(manifest["files"]))


def rng_state() -> dict:
    """RNG states of this process as tensors and plain values (loadable with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(),
             "python": [version, list(internal), gauss],
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def truncate_metrics(path: Path, step: int) -> int:
    """Drop the rows of ``metrics.csv`` after ``step`` (and any torn last line); atomic rewrite.

    Returns the number of rows dropped. A resumed run then appends from ``step + 1``: no step is
    repeated or skipped.
    """
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        return 0
    header, body = rows[0], rows[1:]

    def keep(r):
        return len(r) == len(header) and r[0].isdigit() and int(r[0]) <= step

    kept = [r for r in body if keep(r)]
    if len(kept) != len(body):
        import io

        buf = io.StringIO()
        csv.writer(buf).writerows([header] + kept)
        atomic_write_text(path, buf.getvalue())
    return len(body) - len(kept)


def lr_lambda(recipe: Recipe, clock=None):
    """LR multiplier of step ``s``: linear warm-up, then cosine/linear decay to ``min_lr_ratio``.

    With ``train.max_minutes`` and a ``clock`` (seconds trained so far), the decay runs over whichever
    budget is spent first: progress = max(steps done / max_steps, time used / max_minutes), so a
    time-limited run still ends its schedule at the floor.
    """
    t = recipe.train
    warm, total, floor = t.warmup_steps, t.max_steps, t.min_lr_ratio
    budget = t.max_minutes * 60 if t.max_minutes else None

    def f(step: int) -> float:
        if warm and step < warm:
            return (step + 1) / warm
        if t.schedule == "constant":
            return 1.0
        frac = min(1.0, (step - warm) / max(1, total - warm))
        if budget and clock is not None:
            frac = max(frac, min(1.0, clock() / budget))
        decay = 0.5 * (1 + math.cos(math.pi * frac)) if t.schedule == "cosine" else 1 - frac
        return floor + (1 - floor) * decay

    return f


def ds_config(recipe: Recipe, world_size: int) -> dict:
    """The DeepSpeed config dict for a recipe (written to ``OUT/ds_config.json`` for the record)."""
    t = recipe.train
    cfg = {
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": t.grad_accum,
        "train_batch_size": t.micro_batch * t.grad_accum * world_size,
        "gradient_clipping": t.grad_clip,
        "zero_optimization": {"stage": t.zero_stage},
        "bf16": {"enabled": t.precision == "bf16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if t.zero_stage == 3:
        cfg["zero_optimization"].update({"stage3_gather_16bit_weights_on_model_save": False})
    if t.deepspeed:
        extra = _read_ds_json(Path(t.deepspeed))
        stage = extra.get("zero_optimization", {}).get("stage", t.zero_stage)
        if stage != t.zero_stage:
            raise ConfigError(f"{t.deepspeed}: zero_optimization.stage {stage} but the recipe's train.zero_stage "
                              f"is {t.zero_stage}")
        for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
                    "gradient_clipping", "bf16", "fp16"):
            extra.pop(key, None)  # the recipe owns these
        _merge(cfg, extra)
    return cfg


def _read_ds_json(path: Path) -> dict:
    if not path.is_absolute() and not path.exists():  # shipped JSONs resolve from any working directory
        path = Path(__file__).resolve().parent.parent / path
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"train.deepspeed: cannot read {path}: {e}") from None


def _merge(base: dict, extra: dict) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def build_model(recipe: Recipe, vocab: int, bos: int, eos: int, pad: int):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(recipe.train.seed)
    cfg = recipe.model.hf_config(padded_vocab(vocab), bos, eos, pad)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if recipe.train.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def describe(recipe: Recipe) -> str:
    """Resolved config and parameter count (``--dry-run``); builds the model on the meta device."""
    from transformers import AutoModelForCausalLM

    vocab, source = vocab_of(recipe)
    cfg = recipe.model.hf_config(padded_vocab(vocab))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    n = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    import yaml

    lines = [yaml.safe_dump(recipe.to_dict(), sort_keys=False).rstrip(),
             f"# vocabulary: {vocab} from {source}, padded to {padded_vocab(vocab)}",
             f"# architecture: {type(model).__name__}",
             f"# parameters: {n:,} ({n / 1e6:.2f}M; {n - emb:,} without the embedding)",
             f"# deepspeed (1 process): {json.dumps(ds_config(recipe, 1))}"]
    return "\n".join(lines)


def vocab_of(recipe: Recipe) -> tuple[int, str]:
    data = Path(recipe.train.data)
    if (data / "meta.json").exists():
        return int(load_meta(data)["vocab_size"]), str(data)
    tok = Path(recipe.train.tokenizer)
    if (tok / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        return len(AutoTokenizer.from_pretrained(str(tok))), str(tok)
    return 2394, "the default tokenizer's size (neither data nor tokenizer found)"


@dataclass
class TrainResult:
    steps: int
    tokens: int
    seconds: float
    first_loss: float
    last_loss: float
    val_loss: float | None
    out_dir: Path


class Trainer:
    """One pretraining run: DeepSpeed engine, shard readers, logging, checkpoints and export."""

    def __init__(self, recipe: Recipe, resume: bool = False, progress: bool | None = None, echo=None):
        import deepspeed

        self.recipe = recipe
        t = recipe.train
        self.out = Path(t.out_dir)
        _dist_env_defaults()
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend, verbose=False)
        self.rank, self.world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        self.is_main = self.rank == 0
        self.progress = progress
        self._echo = echo or (lambda line: print(line, file=sys.stderr))

        self.meta = load_meta(Path(t.data))
        self.domains: list[str] = self.meta["domains"]
        self.train_reader = ShardReader(Path(t.data), "train", t.seq_len, seed=t.seed)
        if t.mixture:  # exact per-domain proportions of training rows
            self.train_reader = MixtureReader(self.train_reader, t.mixture)
        self.val_reader = (ShardReader(Path(t.data), "val", t.seq_len, seed=t.seed)
                           if self.meta["tokens"]["val"] > t.seq_len else None)
        self.tokenizer_dir = Path(t.tokenizer)
        if t.init_from:  # continued pretraining: the base model and tokenizer plus the grammar symbols
            self.model, self.tokenizer_dir = self._init_from(Path(t.init_from))
        else:
            self.model = build_model(recipe, self.meta["vocab_size"], self.meta["bos_id"], self.meta["eos_id"],
                                     self.meta.get("pad_id", 3))
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=t.lr, betas=t.betas, eps=1e-8)
        fn = lr_lambda(recipe, clock=self.elapsed_total)
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=self.model, optimizer=optimizer, config=ds_config(recipe, self.world),
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, fn))
        self.device = self.engine.device
        self.val_by_domain: dict[str, float | None] = {}
        self.step_count = 0
        self.position = 0  # global rows consumed
        self.tokens_seen = 0
        self.elapsed = 0.0  # training seconds before this process (resumed runs)
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "ds_config.json").write_text(json.dumps(ds_config(recipe, self.world), indent=1) + "\n")
            import yaml

            (self.out / "recipe.yaml").write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
        if resume:
            self.load()

    def _init_from(self, base: Path):
        """Base checkpoint + grammar (logos.extend); its tokenizer must be the one the shards were packed with."""
        from logos.extend import load_extended

        torch.manual_seed(self.recipe.train.seed)
        model, tokenizer = load_extended(base)
        if len(tokenizer) != self.meta["vocab_size"]:
            raise ConfigError(f"the shards in {self.recipe.train.data} hold {self.meta['vocab_size']} token ids but "
                              f"{base}'s tokenizer with the grammar has {len(tokenizer)}: pack the corpus with "
                              f"`logos pack --tokenizer {base}`")
        if self.recipe.train.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        tokenizer_dir = self.out / "tokenizer"
        if self.is_main:
            tokenizer.save_pretrained(str(tokenizer_dir))
        if torch.distributed.is_initialized() and self.world > 1:
            torch.distributed.barrier()
        return model, tokenizer_dir

    # ------------------------------------------------------------------ steps
    def _autocast(self):
        if self.recipe.train.precision == "bf16-autocast":
            return torch.autocast(self.device.type if hasattr(self.device, "type") else "cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _loss(self, tokens: np.ndarray, domains: np.ndarray, module=None):
        """Mean loss and per-domain (sum, count) of a batch of rows ``tokens [B, L+1]``."""
        x = torch.from_numpy(tokens[:, :-1]).to(self.device)                       # [B, L]
        y = torch.from_numpy(tokens[:, 1:]).to(self.device)                        # [B, L]
        with self._autocast():
            logits = (module or self.engine)(input_ids=x, use_cache=False).logits   # [B, L, V]
        per_tok = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none")  # [B*L]
        d = torch.from_numpy(domains).to(self.device).flatten()
        n_dom = len(self.domains)
        sums = torch.zeros(n_dom, device=self.device).index_add_(0, d, per_tok.detach())
        counts = torch.bincount(d, minlength=n_dom).float()
        return per_tok.mean(), sums, counts

    def _micro_rows(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        mb = self.recipe.train.micro_batch
        start = self.position + (k * self.world + self.rank) * mb
        return self.train_reader.batch(start, mb)

    def step(self) -> tuple[float, torch.Tensor, torch.Tensor]:
        """One optimizer step (``grad_accum`` micro-batches); returns this rank's mean loss and domain sums."""
        t = self.recipe.train
        self.engine.train()
        total = 0.0
        sums = torch.zeros(len(self.domains))
        counts = torch.zeros(len(self.domains))
        for k in range(t.grad_accum):
            tokens, domains = self._micro_rows(k)
            loss, s, c = self._loss(tokens, domains)
            self.engine.backward(loss)
            self.engine.step()
            total += loss.item() / t.grad_accum
            sums += s.cpu()
            counts += c.cpu()
        self.step_count += 1
        self.position += t.micro_batch * t.grad_accum * self.world
        self.tokens_seen += t.micro_batch * t.grad_accum * self.world * t.seq_len
        return total, sums, counts

    @torch.no_grad()
    def eval_loss(self) -> float | None:
        """Mean validation loss over ``eval_rows`` rows spread over the split (also per domain, in ``val_by_domain``)."""
        if self.val_reader is None:
            return None
        self.engine.eval()
        n = min(self.recipe.train.eval_rows, self.val_reader.rows)
        # rows spread evenly over the split, so every domain of a multi-domain corpus is represented
        spread = np.unique(np.linspace(0, self.val_reader.rows - 1, n).round().astype(np.int64))
        rows = spread[self.rank::self.world][: len(spread) // self.world] if len(spread) >= self.world else spread
        nd = len(self.domains)
        total = torch.zeros(2 + 2 * nd)  # loss sum, token count, then per-domain sums and counts
        mb = self.recipe.train.micro_batch
        for i in range(0, len(rows), mb):
            tokens, domains = self.val_reader.rows_at(rows[i:i + mb])
            loss, sums, counts = self._loss(tokens, domains)
            total += torch.cat([torch.tensor([loss.item() * counts.sum().item(), counts.sum().item()]),
                                sums.cpu(), counts.cpu()])
        total = self._all_sum(total)
        self.val_by_domain = {d: (total[2 + k] / total[2 + nd + k]).item() if total[2 + nd + k] else None
                              for k, d in enumerate(self.domains)}
        return (total[0] / total[1]).item() if total[1] else None

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """fp32 logits of the training-time model (no autocast) — the reference for export parity."""
        self.engine.eval()
        return self.engine(input_ids=input_ids.to(self.device), use_cache=False).logits.float()

    def _all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            t = t.clone()
            torch.distributed.all_reduce(t)
        return t

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path:
        """Atomic DeepSpeed checkpoint (all ranks) + refreshed ``hf/`` export; keeps the newest ``keep_checkpoints``.

        Order: DeepSpeed writes the tag without touching ``latest``; after a barrier the ranks hash the
        files (each a slice), rank 0 writes ``logos_manifest.json`` and then moves ``latest`` with a
        temp file + ``os.replace``. Retention runs only after that, and never removes the new tag
        (the one ``latest`` names). A kill at any point leaves ``latest`` on a complete checkpoint.
        """
        ckpt = self.out / CKPT_DIR
        tag = f"step{self.step_count:07d}"
        self._saves = getattr(self, "_saves", 0) + 1
        if self.is_main and (ckpt / tag).exists():  # left by a run abandoned past this step: start clean
            shutil.rmtree(ckpt / tag)
        self._barrier()
        rng = [rng_state()]
        if self.world > 1:
            rng = [None] * self.world
            torch.distributed.all_gather_object(rng, rng_state())
        state = {"step": self.step_count, "position": self.position, "tokens": self.tokens_seen,
                 "elapsed": self.elapsed_total(), "recipe": self.recipe.to_dict(), "rng": rng}
        self.engine.save_checkpoint(str(ckpt), tag=tag, client_state=state, save_latest=False)
        self._barrier()  # every rank's files are written
        fault = os.environ.get(FAULT_KILL_IN_SAVE)
        if fault and int(fault) == self._saves:  # tests only (see FAULT_KILL_IN_SAVE)
            os.kill(os.getpid(), signal.SIGKILL)
        self._commit(ckpt, tag)
        self.export(self.out / HF_DIR)
        self._barrier()
        return ckpt / tag

    def _barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()

    def _commit(self, ckpt: Path, tag: str) -> None:
        """Manifest (files hashed by all ranks, a slice each), then ``latest``, then retention (rank 0)."""
        tag_dir = ckpt / tag
        files = [checkpoint_files(tag_dir)] if self.is_main else [None]
        if self.world > 1:
            torch.distributed.broadcast_object_list(files, src=0)
        files = files[0]
        mine = digest_files(tag_dir, files[self.rank::self.world], sync=True)
        parts = [mine]
        if self.world > 1:
            parts = [None] * self.world
            torch.distributed.all_gather_object(parts, mine)
        if self.is_main:
            entries = {k: v for part in parts for k, v in part.items()}
            write_manifest(tag_dir, entries, tag=tag, step=self.step_count, position=self.position,
                           tokens=self.tokens_seen, world_size=self.world)
            atomic_write_text(ckpt / LATEST, tag)
            self._retain(ckpt, tag)
        self._barrier()

    def _retain(self, ckpt: Path, tag: str) -> None:
        """Keep the newest ``keep_checkpoints`` complete tags up to ``tag`` (always ``tag``); drop the rest.

        Incomplete tags (no manifest: a killed save) and tags past ``tag`` (a timeline this run
        abandoned by resuming from an earlier checkpoint) are removed too.
        """
        step, keep = _tag_step(tag), self.recipe.train.keep_checkpoints
        complete = [t for t in checkpoint_tags(ckpt) if _tag_step(t) <= step and (ckpt / t / MANIFEST).is_file()]
        kept = {tag} | set(complete[:keep])
        for old in checkpoint_tags(ckpt):
            if old not in kept:
                shutil.rmtree(ckpt / old, ignore_errors=True)

    def _usable(self, tag_dir: Path) -> str | None:
        """Why a tag is not a complete checkpoint (None when it is); the ranks share the hashing."""
        manifest, why = read_manifest(tag_dir)
        if why is None:
            why = verify_files(tag_dir, manifest, sorted(manifest["files"])[self.rank::self.world])
        if self.world > 1:
            whys = [None] * self.world
            torch.distributed.all_gather_object(whys, why)
            why = next((w for w in whys if w), None)
        return why

    def load(self) -> bool:
        """Resume from the newest complete checkpoint in ``OUT/checkpoints`` (False when starting fresh).

        Tries the tag ``latest`` names, then older tags newest-first; a tag whose manifest is missing
        or whose files do not match it is refused with one line on stderr. With no tag folders at all,
        or only never-committed ones (no manifest), the run starts fresh: nothing usable existed.
        When a committed checkpoint (manifest present) is damaged and nothing older is usable,
        :class:`CheckpointError`: a restart from step 0 would overwrite ``metrics.csv`` and, at its
        first save, delete the damaged checkpoints a person may still want to recover.
        """
        ckpt = self.out / CKPT_DIR
        refused, chosen = [], None
        for tag in resume_candidates(ckpt):
            why = self._usable(ckpt / tag)
            if why is None:
                chosen = tag
                break
            refused.append((tag, why))
        if self.is_main:
            for tag, why in refused:
                self._echo(f"pretrain: checkpoint {tag} is {why}; "
                           + (f"using {chosen}" if chosen else "no older checkpoint to use"))
        if chosen is None:
            if any((ckpt / tag / MANIFEST).is_file() for tag, _ in refused):
                raise CheckpointError(f"no usable checkpoint in {ckpt} (see above); move it away to start "
                                      f"fresh, or run without --resume")
            if self.is_main:
                self._echo(f"pretrain: no complete checkpoint in {ckpt}; starting fresh")
            return False
        path, state = self.engine.load_checkpoint(str(ckpt), tag=chosen)
        if path is None:
            raise CheckpointError(f"cannot load the DeepSpeed checkpoint {ckpt / chosen}")
        self.step_count, self.position = int(state["step"]), int(state["position"])
        self.tokens_seen, self.elapsed = int(state["tokens"]), float(state.get("elapsed", 0.0))
        rng = state.get("rng")
        if rng and len(rng) == self.world:
            set_rng_state(rng[self.rank])
        elif self.is_main:
            self._echo(f"pretrain: RNG states not restored ({len(rng) if rng else 'no'} saved, "
                       f"{self.world} processes now)")
        if self.is_main:
            self._echo(f"pretrain: resumed {path} at step {self.step_count}")
        return True

    def state_dict_fp32(self) -> dict | None:
        """The full model state dict on rank 0 (ZeRO-3 shards gathered; collective), ``None`` elsewhere."""
        module = self.engine.module
        if self.recipe.train.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
                sd = {k: v.detach().float().clone() for k, v in module.state_dict().items()} if self.is_main else None
            return sd
        return {k: v.detach().float().clone() for k, v in module.state_dict().items()} if self.is_main else None

    def export(self, out: Path) -> Path | None:
        from logos.export import export_hf

        sd = self.state_dict_fp32()
        if not self.is_main:
            return None
        cfg = self.engine.module.config
        run = {"recipe": self.recipe.to_dict(), "step": self.step_count, "tokens": self.tokens_seen,
               "shards": self.meta, "world_size": self.world}
        return export_hf(sd, cfg, self.tokenizer_dir, out, run, dtype=self.recipe.train.export_dtype)

    def elapsed_total(self) -> float:
        return self.elapsed + (time.perf_counter() - self._t0 if hasattr(self, "_t0") else 0.0)

    # ------------------------------------------------------------------ the run
    def train(self) -> TrainResult:
        t = self.recipe.train
        metrics = self.out / "metrics.csv"
        columns = ["step", "tokens", "elapsed_s", "lr", "loss", "tokens_per_s", "val_loss"] + \
                  [f"loss_{d}" for d in self.domains] + [f"val_loss_{d}" for d in self.domains]
        fh = None
        if self.is_main:
            new = not metrics.exists() or self.step_count == 0
            if not new:  # resumed: rows past the checkpoint were logged by the killed run; drop them
                truncate_metrics(metrics, self.step_count)
            fh = open(metrics, "w" if new else "a", newline="")
            writer = csv.writer(fh)
            if new:
                writer.writerow(columns)
        bar = tqdm(total=t.max_steps, initial=self.step_count, unit="step", desc=f"pretrain {self.recipe.name}",
                   disable=(not self.is_main) or (None if self.progress is None else not self.progress),
                   file=sys.stderr, dynamic_ncols=True, mininterval=1.0)
        self._t0 = time.perf_counter()
        budget = t.max_minutes * 60 if t.max_minutes else None
        first = last = float("nan")
        val = None
        acc_loss, acc_n = 0.0, 0
        acc_sums = torch.zeros(len(self.domains))
        acc_counts = torch.zeros(len(self.domains))
        window_t, window_tokens = time.perf_counter(), self.tokens_seen
        tokens_at_start = self.tokens_seen
        try:
            while self.step_count < t.max_steps:
                loss, sums, counts = self.step()
                acc_loss, acc_n = acc_loss + loss, acc_n + 1
                acc_sums += sums
                acc_counts += counts
                bar.update(1)
                out_of_time = budget is not None and self.elapsed_total() >= budget
                if self.world > 1 and budget is not None:  # every rank must stop at the same step
                    flag = self._all_sum(torch.tensor([float(out_of_time)]))
                    out_of_time = bool(flag.item() > 0)
                done = out_of_time or self.step_count >= t.max_steps
                if self.step_count % t.log_every == 0 or done or self.step_count == 1:
                    packed = self._all_sum(torch.cat([torch.tensor([acc_loss, float(acc_n)]), acc_sums, acc_counts]))
                    mean = packed[0].item() / packed[1].item()
                    nd = len(self.domains)
                    dom = [(packed[2 + i] / packed[2 + nd + i]).item() if packed[2 + nd + i] else float("nan")
                           for i in range(nd)]
                    now = time.perf_counter()
                    tps = (self.tokens_seen - window_tokens) / max(1e-9, now - window_t)
                    window_t, window_tokens = now, self.tokens_seen
                    if math.isnan(first):
                        first = mean
                    last = mean
                    if (t.eval_every and self.step_count % t.eval_every == 0) or done:
                        val = self.eval_loss()
                    lr = self.scheduler.get_last_lr()[0]
                    if self.is_main:
                        row = [self.step_count, self.tokens_seen, f"{self.elapsed_total():.2f}", f"{lr:.6g}",
                               f"{mean:.5f}", f"{tps:.1f}",
                               "" if val is None or not ((t.eval_every and self.step_count % t.eval_every == 0) or done)
                               else f"{val:.5f}"] + [f"{v:.5f}" for v in dom]
                        row += [f"{self.val_by_domain.get(d):.5f}" if row[6] and self.val_by_domain.get(d) is not None
                                else "" for d in self.domains]
                        writer.writerow(row)
                        fh.flush()
                        bar.set_postfix(loss=f"{mean:.3f}", lr=f"{lr:.2e}", tok_s=f"{tps:,.0f}", refresh=False)
                        if self.progress is False or not sys.stderr.isatty():
                            self._echo(f"step {self.step_count} loss {mean:.4f} lr {lr:.3g} tokens/s {tps:,.0f}"
                                       + (f" val {val:.4f}" if row[6] else "")
                                       + "".join(f" {d} {v:.4f}" for d, v in zip(self.domains, dom)))
                    acc_loss, acc_n = 0.0, 0
                    acc_sums.zero_()
                    acc_counts.zero_()
                if self.step_count % t.save_every == 0 or done:
                    self.save()
                if done:
                    break
        finally:
            bar.close()
            if fh is not None:
                fh.close()
        seconds = time.perf_counter() - self._t0
        self.elapsed += seconds
        del self._t0
        if self.is_main:
            plot_losses(metrics, self.out / "loss.png", self.recipe.name)
        return TrainResult(self.step_count, self.tokens_seen - tokens_at_start, seconds, first, last, val, self.out)


def plot_losses(metrics: Path, png: Path, title: str) -> None:
    """Training (and validation) loss against tokens, from ``metrics.csv``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(metrics, newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        return
    tokens = [int(r["tokens"]) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    ax.plot(tokens, [float(r["loss"]) for r in rows], label="train")
    val = [(int(r["tokens"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
    if val:
        ax.plot(*zip(*val), "o-", label="validation")
    ax.set_xlabel("tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(f"pretrain {title}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)


def pretrain(recipe: Recipe, resume: bool = False, progress: bool | None = None) -> TrainResult:
    trainer = Trainer(recipe, resume=resume, progress=progress)
    return trainer.train()
