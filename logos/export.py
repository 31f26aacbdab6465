"""Checkpoint export: a full state dict -> a self-contained Hugging Face directory, written atomically.

The directory holds ``config.json``, ``generation_config.json``, ``model.safetensors``, the
tokenizer files (copied byte for byte from the training tokenizer) and ``logos_run.json`` (the
recipe, step, tokens and the shard metadata of the run). It loads with plain
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``; weights are
safetensors only, so loading it never unpickles anything.

``export_run`` (``logos export RUN``) re-exports a saved DeepSpeed checkpoint of ZeRO stage 0-2, whose
``mp_rank_00_model_states.pt`` holds the full module: it is read with ``torch.load(weights_only=True)``
(tensors and plain containers only; no code runs). ZeRO-3 checkpoints hold only shards; their
consolidated weights are written at save time into ``RUN/hf`` (parameters gathered across ranks).

The directory is written next to its destination and renamed into place, so a reader never sees
a half-written export (the previous one is removed only after the new one is complete).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

__all__ = ["export_hf", "export_run", "TOKENIZER_FILES", "load_run_info"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                   "logos_tokenizer.json")
RUN_FILE = "logos_run.json"


def export_hf(state_dict: dict, config, tokenizer_dir: Path, out: Path, run: dict, dtype: str = "float32") -> Path:
    """Write ``state_dict`` (full, unsharded) with transformers ``config`` as an HF checkpoint at ``out``."""
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
    model.save_pretrained(tmp, safe_serialization=True)
    copied = 0
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.exists():
            shutil.copy2(src, tmp / name)
            copied += 1
    if not (tmp / "tokenizer.json").exists() and not (tmp / "tokenizer.model").exists():
        raise FileNotFoundError(f"no tokenizer files in {tokenizer_dir}")
    (tmp / RUN_FILE).write_text(json.dumps(run, indent=1, default=str) + "\n")
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


def export_run(run_dir: Path, out: Path, tag: str | None = None) -> Path:
    """Export checkpoint ``tag`` (default: the latest) of a ``logos pretrain`` run directory as an HF directory."""
    from logos.config import load_recipe
    from logos.records import InputError

    run_dir = Path(run_dir)
    if not (run_dir / "recipe.yaml").exists():
        raise InputError(f"{run_dir} is not a pretrain run directory (no recipe.yaml)")
    recipe = load_recipe(run_dir / "recipe.yaml")
    ckpt = run_dir / "checkpoints"
    if tag is None:
        if not (ckpt / "latest").exists():
            raise InputError(f"no checkpoint in {ckpt}")
        tag = (ckpt / "latest").read_text().strip()
    if recipe.train.zero_stage == 3:
        raise InputError(f"ZeRO-3 checkpoints hold shards only; the consolidated export of each save is {run_dir / 'hf'}")
    path = ckpt / tag / "mp_rank_00_model_states.pt"
    if not path.exists():
        raise InputError(f"no {path.name} in {ckpt / tag}")
    saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    state = {k: v.float() for k, v in saved["module"].items()}
    vocab = state["model.embed_tokens.weight"].shape[0]
    config = recipe.model.hf_config(vocab)
    run = {"recipe": recipe.to_dict(), "step": saved.get("step"), "tokens": saved.get("tokens"),
           "exported_from": str(path)}
    return export_hf(state, config, Path(recipe.train.tokenizer), out, run, dtype=recipe.train.export_dtype)
