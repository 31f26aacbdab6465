"""Checkpoint export: a full state dict -> a self-contained Hugging Face directory, written atomically.

The directory holds ``config.json``, ``generation_config.json``, ``model.safetensors``, the
tokenizer files (copied byte for byte from the run's ``tokenizer/``: the tokenizer actually trained
with, a base LLM's extended one included) and ``logos_run.json`` (the recipe, step, tokens, grammar
version and the shard metadata of the run). It loads with plain
``AutoModelForCausalLM.from_pretrained`` / ``AutoTokenizer.from_pretrained``; weights are
safetensors only, so loading it never unpickles anything.

``export_run`` (``logos export RUN``) re-exports a saved DeepSpeed checkpoint of ZeRO stage 0-2, whose
``mp_rank_00_model_states.pt`` holds the full module: it is read with ``torch.load(weights_only=True)``
(tensors and plain containers only; no code runs), and the architecture and tokenizer come from the
run directory (``model/config.json``, ``tokenizer/``), so runs continued from a base LLM export
with the base's shape and extended tokenizer. ZeRO-3 checkpoints hold only shards, and DeepSpeed's
offline consolidation unpickles them; their consolidated weights are written at every save into
``RUN/hf`` instead (parameters gathered one module at a time).

The directory is written next to its destination and renamed into place, so a reader never sees
a half-written export (the previous one is removed only after the new one is complete).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from logos.language.grammar import GRAMMAR_VERSION  # recorded in every export
from logos.train.hf_files import make_portable

__all__ = ["export_hf", "export_run", "load_run_info", "GRAMMAR_VERSION"]

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


def export_run(run_dir: Path, out: Path, tag: str | None = None) -> Path:
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
    if recipe.train.zero_stage == 3:
        raise InputError(f"ZeRO-3 checkpoints hold shards only; the consolidated export of each save is {run_dir / 'hf'}")
    path = ckpt / tag / "mp_rank_00_model_states.pt"
    if not path.exists():
        raise InputError(f"no {path.name} in {ckpt / tag}")
    saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    state = {k: v.float() for k, v in saved["module"].items()}
    if (run_dir / "model" / "config.json").exists():  # the architecture actually trained (base models too)
        config = AutoConfig.from_pretrained(str(run_dir / "model"), trust_remote_code=False)
    else:  # run directories written before the run recorded its model config
        config = recipe.model.hf_config(state["model.embed_tokens.weight"].shape[0])
    tokenizer = run_dir / "tokenizer" if (run_dir / "tokenizer").is_dir() else resolve(recipe.train.tokenizer)
    run = {"recipe": recipe.to_dict(), "step": saved.get("step"), "tokens": saved.get("tokens"),
           "exported_from": str(path)}
    return export_hf(state, config, tokenizer, out, run, dtype=recipe.train.export_dtype)