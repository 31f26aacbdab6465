"""Checkpoint export: a full state dict -> a self-contained Hugging Face directory, written atomically.

The directory holds ``config.json``, ``generation_config.json``, the weights as safetensors
(``model.safetensors``, or shards ``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json``
when they exceed the shard size, ``SHARD_SIZE`` unless given), the tokenizer files (copied byte for byte
from the run's ``tokenizer/``: the tokenizer actually trained with, a base LLM's extended one included)
and ``logos_run.json`` (the recipe, step, tokens, grammar version and the shard metadata of the run). It
loads with plain ``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``; weights
are safetensors only, so loading it never unpickles anything.

``export_run`` (``logos export RUN``) re-exports a saved DeepSpeed checkpoint; the architecture and
tokenizer come from the run directory (``model/config.json``, ``tokenizer/``), so runs continued from a
base LLM export with the base's shape and extended tokenizer. Its files are read with
``torch.load(weights_only=True)`` (tensors and plain containers; no code runs):

- ZeRO 0-2: ``mp_rank_00_model_states.pt`` holds the full module;
- ZeRO-3: each rank's ``zero_pp_rank_R_mp_rank_00_optim_states.pt`` holds its slice of every parameter
  (fp32, in the order of ``param_shapes`` in the model-states files); :func:`zero3_state_dict` joins the
  slices one parameter at a time from memory-mapped files, converting each to the export dtype, so the
  export never holds the fp32 model. Two DeepSpeed classes in those files (the ZeRO stage enum and the
  loss scaler's plain state) are allowed to the weights-only loader by name.

The directory is written next to its destination and renamed into place, so a reader never sees
a half-written export (the previous one is removed only after the new one is complete).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import torch

from logos.language.grammar import GRAMMAR_VERSION  # recorded in every export
from logos.train.hf_files import make_portable

__all__ = ["export_hf", "export_run", "load_run_info", "zero3_state_dict", "parse_size", "GRAMMAR_VERSION",
           "SHARD_SIZE"]

RUN_FILE = "logos_run.json"
SHARD_SIZE = "1GB"  # per safetensors file; writing one costs its size in memory once more (safetensors' buffer)


def parse_size(text: str | int) -> int:
    """Bytes of a shard size: an integer, or a number with a unit (``500MB``, ``2GB``, ``1.5GiB``)."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", str(text), flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 500MB, 2GB)")
    unit = (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    value = int(float(m.group(1)) * scale)
    if value <= 0:
        raise ValueError(f"not a size: {text!r} (must be positive)")
    return value


def export_hf(state_dict: dict, config, tokenizer_dir: Path, out: Path, run: dict, dtype: str = "float32",
              shard_size: str | int = SHARD_SIZE) -> Path:
    """Write ``state_dict`` (full, unsharded) with transformers ``config`` as an HF checkpoint at ``out``; weights in
    safetensors files of at most ``shard_size`` each (one tensor larger than that gets a file of its own)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    torch_dtype = getattr(torch, dtype)
    model.load_state_dict({k: v.to(torch_dtype) for k, v in state_dict.items()}, strict=True, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.config.dtype = dtype
    model.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                                               pad_token_id=config.pad_token_id, do_sample=True, temperature=1.0,
                                               top_k=0, top_p=1.0)
    model.save_pretrained(tmp, safe_serialization=True, max_shard_size=parse_size(shard_size))
    for src in sorted(Path(tokenizer_dir).iterdir()):
        if src.is_file():
            shutil.copy2(src, tmp / src.name)
    if not (tmp / "tokenizer.json").exists() and not (tmp / "tokenizer.model").exists():
        raise FileNotFoundError(f"no tokenizer files in {tokenizer_dir}")
    make_portable(tmp)  # rope_theta, a tokenizer class transformers 4 and vLLM load (logos.hf_files)
    (tmp / RUN_FILE).write_text(json.dumps({"grammar": GRAMMAR_VERSION, **run}, indent=1, default=str) + "\n")
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.replace(old)
    tmp.replace(out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def load_run_info(checkpoint: Path) -> dict:
    """``logos_run.json`` of an exported checkpoint ({} for a plain HF directory)."""
    path = Path(checkpoint) / RUN_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def export_run(run_dir: Path, out: Path, tag: str | None = None, shard_size: str | int = SHARD_SIZE) -> Path:
    """Export checkpoint ``tag`` (default: the latest) of a training run directory as an HF directory."""
    from transformers import AutoConfig

    from logos.util.records import InputError
    from logos.util.resources import resolve
    from logos.train.recipe import load_recipe

    run_dir = Path(run_dir)
    if not (run_dir / "recipe.yaml").exists():
        raise InputError(f"{run_dir} is not a training run directory (no recipe.yaml)")
    recipe = load_recipe(run_dir / "recipe.yaml")
    ckpt = run_dir / "checkpoints"
    if tag is None:
        if not (ckpt / "latest").exists():
            raise InputError(f"no checkpoint in {ckpt}")
        tag = (ckpt / "latest").read_text().strip()
    try:
        parse_size(shard_size)
    except ValueError as e:
        raise InputError(f"--shard-size: {e}") from None
    if not (ckpt / tag).is_dir():
        raise InputError(f"no checkpoint {tag} in {ckpt}")
    dtype = getattr(torch, recipe.train.export_dtype)
    if (ckpt / tag / "mp_rank_00_model_states.pt").exists():  # ZeRO 0-2: the full module in one file
        path = ckpt / tag / "mp_rank_00_model_states.pt"
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        state = {k: v.to(dtype) for k, v in saved["module"].items()}
    elif (ckpt / tag / _zero3_file(0, "model")).exists():  # ZeRO-3: every rank's slices
        path = ckpt / tag
        state, saved = zero3_state_dict(path, dtype)
    else:
        raise InputError(f"no DeepSpeed model states in {ckpt / tag} (mp_rank_00_model_states.pt or "
                         f"{_zero3_file(0, 'model')})")
    if (run_dir / "model" / "config.json").exists():  # the architecture actually trained (base models too)
        config = AutoConfig.from_pretrained(str(run_dir / "model"), trust_remote_code=False)
    else:  # run directories written before the run recorded its model config
        config = recipe.model.hf_config(state["model.embed_tokens.weight"].shape[0])
    tokenizer = run_dir / "tokenizer" if (run_dir / "tokenizer").is_dir() else resolve(recipe.train.tokenizer)
    run = {"recipe": recipe.to_dict(), "step": saved.get("step"), "tokens": saved.get("tokens"),
           "exported_from": str(path)}
    return export_hf(state, config, tokenizer, out, run, dtype=recipe.train.export_dtype, shard_size=shard_size)


def _zero3_file(rank: int, kind: str) -> str:
    return f"zero_pp_rank_{rank}_mp_rank_00_{kind}_states.pt"


def _load_deepspeed_file(path: Path) -> dict:
    """A DeepSpeed checkpoint file, weights-only, memory-mapped; the two DeepSpeed classes its ZeRO files hold are
    allowed by name (an enum and the loss scaler, whose state is plain numbers)."""
    from logos.util.records import InputError

    safe = []
    try:
        from deepspeed.runtime.fp16.loss_scaler import LossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum

        safe = [LossScaler, ZeroStageEnum]
    except ImportError:
        pass
    try:
        with torch.serialization.safe_globals(safe):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file: one line naming it
        raise InputError(f"cannot read {path} as a weights-only DeepSpeed file: {str(e).splitlines()[0]}") from None


def zero3_state_dict(tag_dir: Path, dtype: torch.dtype = torch.float32) -> tuple[dict, dict]:
    """(full state dict in ``dtype``, rank 0's model-states file) of a ZeRO-3 checkpoint tag.

    Rank r's fp32 partition of a parameter with n elements is elements ``[r*k, (r+1)*k)`` of the flattened
    parameter, k = ceil(n / ranks) (the last rank's slice padded); each rank's flat groups hold its slices of
    every trained parameter in ``param_shapes`` order. Tied parameters (``shared_params``) and buffers are
    filled in by name.
    """
    from logos.util.records import InputError

    tag_dir = Path(tag_dir)
    model0 = _load_deepspeed_file(tag_dir / _zero3_file(0, "model"))
    world = int(model0.get("dp_world_size") or 0)
    if world < 1:
        raise InputError(f"{tag_dir / _zero3_file(0, 'model')}: no data-parallel world size")
    if model0.get("frozen_param_shapes"):
        raise InputError(f"{tag_dir}: frozen parameters (LoRA) under ZeRO-3 are not joined here; the run's hf/ "
                         f"export holds the merged weights")
    flats = []
    for rank in range(world):
        path = tag_dir / _zero3_file(rank, "optim")
        if not path.exists():
            raise InputError(f"{tag_dir}: {path.name} is missing ({world} ranks saved this checkpoint)")
        groups = _load_deepspeed_file(path)["optimizer_state_dict"]["fp32_flat_groups"]
        flats.append(_FlatReader(groups))
    shapes = {name: shape for group in model0["param_shapes"] for name, shape in group.items()}
    state: dict[str, torch.Tensor] = {}
    for name, shape in shapes.items():
        n = math.prod(shape)
        k = math.ceil(n / world)
        parts = [flat.take(k) for flat in flats]
        state[name] = torch.cat(parts)[:n].view(tuple(shape)).to(dtype)
    left = [flat.left() for flat in flats]
    if any(left):
        raise InputError(f"{tag_dir}: {max(left)} partition elements left over after {len(shapes)} parameters "
                         f"(the files do not match param_shapes)")
    for alias, target in (model0.get("shared_params") or {}).items():
        state[alias] = state[target]
    module = model0.get("module") or {}
    for name in model0.get("buffer_names") or []:
        if name in module:
            state[name] = module[name].to(dtype) if module[name].is_floating_point() else module[name]
    return state, model0


class _FlatReader:
    """Consecutive slices of a rank's flat fp32 groups (a slice may not cross groups: ZeRO-3 sub-groups hold whole
    parameters)."""

    def __init__(self, groups: list[torch.Tensor]):
        self.groups, self.group, self.offset = list(groups), 0, 0

    def take(self, k: int) -> torch.Tensor:
        from logos.util.records import InputError

        while self.group < len(self.groups) and self.offset >= self.groups[self.group].numel():
            self.group, self.offset = self.group + 1, 0
        if self.group >= len(self.groups) or self.offset + k > self.groups[self.group].numel():
            raise InputError("ZeRO-3 partition files end before the parameters they should hold")
        out = self.groups[self.group].narrow(0, self.offset, k)
        self.offset += k
        return out

    def left(self) -> int:
        return sum(g.numel() for g in self.groups[self.group:]) - self.offset if self.group < len(self.groups) else 0