"""A randomly initialised model of a checkpoint's architecture with its tokenizer: the from-scratch baseline of a finetune.

    python benchmarks/scratch_init.py checkpoints/logos-tiny runs/scratch-init
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(src: Path, dst: Path, seed: int = 0) -> None:
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src)).save_pretrained(dst)
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("logos_tokenizer.json", "special_tokens_map.json",
                                                        "generation_config.json"):
            shutil.copy2(f, dst / f.name)
    run = json.loads((src / "logos_run.json").read_text())
    run.update({"note": "random initialisation (from-scratch baseline)", "step": 0})
    (dst / "logos_run.json").write_text(json.dumps(run, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
