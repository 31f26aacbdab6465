"""Shared helpers for the pack/pretrain/export/generate tests: real MOSES fixture -> shards -> tiny recipe."""

from __future__ import annotations

import os
from pathlib import Path

from logos.train.recipe import load_recipe

ASSETS = Path(__file__).parent / "assets"
REPO = Path(__file__).resolve().parent.parent
MOSES_500 = ASSETS / "moses_500.smi"
TOKENIZER = REPO / "tokenizers" / "default"
FAULT_ENTRY = Path(__file__).parent / "fault_entry.py"  # ``logos`` with test-only faults (fault_injection.py)


def make_shards(tmp: Path, val_fraction: float = 0.1) -> Path:
    """Tokenize and pack the 500-molecule fixture into ``tmp/shards``."""
    from logos.cli import main
    from logos.data.pack import pack

    corpus = tmp / "moses.jsonl"
    assert main(["tokenize", str(MOSES_500), "-o", str(corpus), "-q"]) == 0
    pack([corpus], TOKENIZER, tmp / "shards", val_fraction=val_fraction, progress=False)
    return tmp / "shards"


def tiny_recipe(shards: Path, out: Path, **train):
    """The shipped tiny preset, shrunk to a few fast steps on the fixture."""
    values = dict(data=str(shards), tokenizer=str(TOKENIZER), out_dir=str(out), seq_len=64, micro_batch=8,
                  max_steps=12, warmup_steps=2, lr=3e-3, log_every=4, eval_every=0, eval_rows=8, save_every=1000,
                  max_minutes=None)
    values.update(train)
    return load_recipe(REPO / "pretrain" / "tiny.yaml", [f"train.{k}={_yaml(v)}" for k, v in values.items()])


def _yaml(v) -> str:
    return "null" if v is None else str(v).lower() if isinstance(v, bool) else str(v)


def cli_env() -> dict:
    """Environment for a child ``python -m logos.cli`` that imports this checkout, one thread per process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def random_checkpoint(path: Path) -> Path:
    """A randomly initialised tiny Llama (seed 0) with the default tokenizer's files: constraints must hold
    whatever it samples."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=2432, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2,
                                 pad_token_id=3)).save_pretrained(path)
    for f in TOKENIZER.iterdir():
        shutil.copy2(f, path / f.name)
    return path
