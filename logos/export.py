"""Checkpoint export: a full state dict -> a self-contained Hugging Face directory, written atomically.

The directory holds ``config.json``, ``generation_config.json``, ``model.safetensors``, the
tokenizer files (copied byte for byte from the training tokenizer) and ``logos_run.json`` (the
recipe, step, tokens and the shard metadata of the run). It loads with plain
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``; weights are
safetensors only, so loading it never unpickles anything.

The directory is written next to its destination and renamed into place, so a reader never sees
a half-written export (the previous one is removed only after the new one is complete).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

__all__ = ["export_hf", "TOKENIZER_FILES", "load_run_info"]

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
