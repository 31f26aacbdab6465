"""Constrained against unconstrained generation, per task, in one run: samples/s, their ratio, mask cost per step.

For each task the same model samples the same prompts twice per round - constrained (grammar +
chemistry, rejections and resampling counted) and unconstrained (task mask and budget only) -
alternating which goes first; medians over rounds. Models: the shipped tiny checkpoint (5M; a
forward pass costs about as much as the mask) and a randomly initialised ~100M Llama with the
LOGOS vocabulary (hidden 768, 14 layers), where users' models put the mask in proportion. Target
target: constrained >= 0.8x unconstrained samples/s for every task at batch 16 on the ~100M model.

    PYTHONPATH=. .venv/bin/python benchmarks/generate_bench.py --model tiny --rounds 3
    PYTHONPATH=. .venv/bin/python benchmarks/generate_bench.py --model 100m --rounds 2
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
TASKS = {  # task: (samples per input, input lines or None, budget)
    "molecule": (16, None, 64),
    "retro": (16, ["CC(=O)Oc1ccccc1C(=O)O"], 96),
    "forward": (16, ["CC(=O)O.OCC"], 64),
    "protein": (16, None, 96),
    "pocket": (16, [">p\nMKTAYIAKQRQISFVKSHFSRQ"], 0),
    "ligand": (16, None, 64),
    "mof": (16, None, 96),
}


def random_checkpoint(work: Path, hidden: int, layers: int) -> Path:
    """A random Llama with the LOGOS tokenizer: the mask's cost relative to a forward pass of this size."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = work / f"random-{hidden}x{layers}"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=2432, hidden_size=hidden, intermediate_size=4 * hidden,
                                 num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                 num_key_value_heads=hidden // 64, bos_token_id=1, eos_token_id=2,
                                 pad_token_id=3)).save_pretrained(path)
    for f in (REPO / "tokenizers" / "default").iterdir():
        shutil.copy2(f, path / f.name)
    return path


def inputs_for(task: str, work: Path) -> Path | None:
    import json

    lines = TASKS[task][1]
    if task == "ligand":
        path = work / "ligand.jsonl"
        path.write_text(json.dumps({"id": "site", "text": "<ProteinS>MK<PocketS>T<PocketE>AY<PocketS>I<PocketE>AKQ"
                                                          "RQISF<PocketS>V<PocketE>KSHF<ProteinE>"}) + "\n")
        return path
    if lines is None:
        return None
    path = work / (f"{task}.fasta" if task == "pocket" else f"{task}.smi")
    path.write_text("\n".join(lines) + "\n")
    return path


def run(checkpoint: Path, task: str, constrained: bool, work: Path, seed: int) -> tuple[float, object]:
    from logos.generate import GenerateOptions, Sampling, generate

    n, _, budget = TASKS[task]
    suffix = {"molecule": ".smi", "retro": ".rsmi", "forward": ".rsmi", "protein": ".fasta", "pocket": ".fasta",
              "ligand": ".sdf", "mof": ".json"}[task]
    options = GenerateOptions(task=task, n=n, batch_size=16, seed=seed, constrained=constrained, resamples=2,
                              sampling=Sampling(max_new_tokens=budget))
    start = time.perf_counter()
    result = generate(checkpoint, work / f"{task}_{int(constrained)}{suffix}", options, inputs=inputs_for(task, work),
                      progress=False)
    return len(result.samples) / (time.perf_counter() - start), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("tiny", "100m"), default="tiny")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tasks", default=",".join(TASKS))
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="generate_bench_"))
    checkpoint = REPO / "checkpoints" / "logos-tiny" if args.model == "tiny" else random_checkpoint(work, 768, 14)
    from transformers import AutoModelForCausalLM

    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(checkpoint).parameters())
    print(f"model: {args.model} ({params / 1e6:.1f}M parameters), batch 16, torch threads {torch.get_num_threads()}")
    print("| task | constrained samples/s | unconstrained samples/s | ratio (median of rounds) | written constrained / "
          "unconstrained | redraws, resampled |\n|---|---:|---:|---:|---|---|")
    for task in args.tasks.split(","):
        rates = {True: [], False: []}
        ratios, last = [], {}
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            got = {}
            for constrained in order:
                got[constrained], last[constrained] = run(checkpoint, task, constrained, work, seed=r)
                rates[constrained].append(got[constrained])
            ratios.append(got[True] / got[False])
        c, u = last[True], last[False]
        print(f"| {task} | {statistics.median(rates[True]):.2f} | {statistics.median(rates[False]):.2f} | "
              f"**{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}) | "
              f"{c.written}/{len(c.samples)} / {u.written}/{len(u.samples)} | {c.redraws}, {c.resampled} |", flush=True)


if __name__ == "__main__":
    main()
