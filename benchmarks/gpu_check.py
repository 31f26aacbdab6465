"""One prepared GPU check: the 1B preset's throughput and MFU, ZeRO-3 memory against `logos plan`, CUDA generation.

Run on the GPU machine by ``benchmarks/gpu_check.sh`` (which installs the carried wheels first); at most
~5 minutes on one H200. Every part writes into one JSON (``--out``), and a part that fails records its
error instead of ending the check (an out-of-memory is a result, not a crash).

(a) ``train``: the 1B preset (bf16, ZeRO-2, sequence 2048, micro-batch ``--micro-batch``) for
    ``--steps`` optimizer steps, gradient checkpointing on and off; tokens/s over the steps after
    ``--warmup`` and model FLOPs utilisation::

        FLOPs/token = 6 * N + 12 * L * H * Q * T      (PaLM, appendix B; nanoGPT's estimate_mfu)
        MFU         = tokens/s * FLOPs/token / peak

    N = all parameters (tied embeddings once), L layers, H attention heads, Q head dim, T sequence
    length; the 12·L·H·Q·T term is causal attention's score and value matmuls, forward and backward,
    counted in full as the convention does. Recomputation under gradient checkpointing is *not*
    counted (that would be hardware FLOPs utilisation). Peaks: the H200's dense bf16 spec, 989
    TFLOP/s, and beside it the ~790 TFLOP/s a large bf16 matmul reaches on that machine (measured by
    this script too, ``matmul_tflops``).
(b) ``zero3``: the 3B preset and the 8B shape under ZeRO-3 (micro-batch 1, checkpointing, no
    offload) for a few steps; peak GPU memory (``torch.cuda.max_memory_allocated``) against
    ``logos plan``'s model states plus its activation estimate.
(c) ``generate``: 256 molecules and 64 crystals with the shipped tiny model on CUDA, constrained and
    unconstrained; samples/s; the texts are written beside the JSON and scored for validity on a
    machine with RDKit and pymatgen (``--score DIR``, see below).

CPU parts (arguments, the FLOPs formula, the JSON layout) are tested in ``tests/test_gpu_check.py``.

    python benchmarks/gpu_check.py --out $OUT/gpu_check.json --shards gpu_shards      # on the GPU machine
    python benchmarks/gpu_check.py --score FILES_DIR                                   # back here: validity
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
H200_BF16_DENSE = 989e12      # NVIDIA H200 SXM datasheet, dense BF16 tensor-core peak
H200_BF16_MATMUL = 790e12     # what a large bf16 GEMM reaches on an H200; measured below too
PARTS = ("train", "zero3", "generate")


def flops_per_token(n_params: int, layers: int, heads: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token: 6·N for the weights' matmuls plus 12·L·H·Q·T for attention (forward + backward)."""
    return 6.0 * n_params + 12.0 * layers * heads * head_dim * seq_len


def mfu(tokens_per_s: float, per_token: float, peak: float) -> float:
    return tokens_per_s * per_token / peak


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON with every result")
    ap.add_argument("--shards", type=Path, default=REPO / "gpu_shards", help="token shards (make gpu-wheels)")
    ap.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {PARTS}")
    ap.add_argument("--steps", type=int, default=24, help="optimizer steps per training measurement")
    ap.add_argument("--warmup", type=int, default=4, help="steps left out of the tokens/s figure")
    ap.add_argument("--micro-batch", type=int, default=4, help="1B preset micro-batch (sequence 2048)")
    ap.add_argument("--zero3-steps", type=int, default=3)
    ap.add_argument("--molecules", type=int, default=256)
    ap.add_argument("--crystals", type=int, default=64)
    ap.add_argument("--score", type=Path, default=None, help="score the texts a GPU run wrote (needs RDKit, pymatgen)")
    args = ap.parse_args(argv)
    unknown = set(args.parts.split(",")) - set(PARTS)
    if unknown:
        ap.error(f"unknown parts {sorted(unknown)} (known: {', '.join(PARTS)})")
    if args.warmup >= args.steps:
        ap.error("--warmup must be below --steps")
    return args


def _recipe(preset: str, shards: Path, out: Path, **train):
    from logos.train.recipe import load_recipe

    values = {"data": shards, "tokenizer": "tokenizers/default", "out_dir": out, "max_minutes": None,
              "save_every": 10**9, "eval_every": 0, "log_every": 10**9, "warmup_steps": 2, **train}
    return load_recipe(REPO / "pretrain" / f"{preset}.yaml", [f"train.{k}={v}" for k, v in values.items()])


def _trainer_steps(recipe, steps: int, warmup: int) -> dict:
    """Build the real trainer, take ``steps`` steps; tokens/s after ``warmup``, peak memory."""
    import torch

    from logos.train import Trainer

    torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(recipe, progress=False, echo=lambda line: None)
    model = trainer.engine.module
    n = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        trainer.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    tokens_per_step = recipe.train.micro_batch * recipe.train.grad_accum * recipe.train.seq_len
    measured = times[warmup:] or times
    out = {"params": n, "step_s": measured, "tokens_per_s": tokens_per_step * len(measured) / sum(measured),
           "peak_gib": torch.cuda.max_memory_allocated() / 2**30, "config": model.config.to_dict()}
    del trainer, model
    torch.cuda.empty_cache()
    return out


def matmul_tflops() -> float:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t, reps = time.perf_counter(), 50
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * 8192**3 * reps / (time.perf_counter() - t) / 1e12


def part_train(args, work: Path) -> dict:
    results = {"matmul_tflops": matmul_tflops()}
    for ckpt in (False, True):
        recipe = _recipe("1b", args.shards, work / f"1b_ckpt{int(ckpt)}", micro_batch=args.micro_batch, grad_accum=1,
                         max_steps=args.steps, gradient_checkpointing=str(ckpt).lower(), zero_stage=2,
                         precision="bf16")
        r = _trainer_steps(recipe, args.steps, args.warmup)
        c = r.pop("config")
        per_token = flops_per_token(r["params"], c["num_hidden_layers"], c["num_attention_heads"],
                                    c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                                    recipe.train.seq_len)
        r.update(flops_per_token=per_token, mfu_spec=mfu(r["tokens_per_s"], per_token, H200_BF16_DENSE),
                 mfu_matmul=mfu(r["tokens_per_s"], per_token, H200_BF16_MATMUL))
        results["checkpointing" if ckpt else "no_checkpointing"] = r
    return results


def _planned_gib(recipe) -> dict:
    from logos.train.plan import activation_bytes, model_size, zero_memory
    from logos.train.model import vocab_of
    from logos.train.recipe import padded_vocab

    cfg = recipe.model.hf_config(padded_vocab(vocab_of(recipe)[0]))
    size = model_size(cfg)
    states, _ = zero_memory(size, 3, 1, 1)
    act = activation_bytes(cfg, recipe.train.micro_batch, recipe.train.seq_len, True)
    return {"model_states_gib": states / 2**30, "activations_gib": act / 2**30, "total_gib": (states + act) / 2**30}


def part_zero3(args, work: Path) -> dict:
    import torch

    results = {}
    for preset in ("3b", "8b"):
        recipe = _recipe(preset, args.shards, work / f"{preset}_zero3", micro_batch=1, grad_accum=1,
                         max_steps=args.zero3_steps, gradient_checkpointing="true", zero_stage=3, precision="bf16",
                         deepspeed="pretrain/ds_zero3.json")
        entry = {"planned": _planned_gib(recipe)}
        try:
            entry.update(_trainer_steps(recipe, args.zero3_steps, 1))
            entry.pop("config", None)
        except torch.cuda.OutOfMemoryError as e:
            entry["oom"] = str(e).splitlines()[0]
            entry["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.empty_cache()
        results[preset] = entry
    return results


def part_generate(args, work: Path) -> dict:
    from logos.generate import GenerateOptions, Sampling, generate

    results = {}
    for task, n in (("molecule", args.molecules), ("crystal", args.crystals)):
        for constrained in (True, False):
            name = f"{task}_{'constrained' if constrained else 'unconstrained'}"
            out = work / "texts" / f"{name}.{'smi' if task == 'molecule' else 'cif'}"
            options = GenerateOptions(task=task, n=n, batch_size=64, constrained=constrained, device="cuda",
                                      sampling=Sampling(max_new_tokens=128 if task == "molecule" else 256))
            t = time.perf_counter()
            result = generate(REPO / "checkpoints" / "logos-tiny", out, options, progress=False)
            seconds = time.perf_counter() - t
            results[name] = {"samples": len(result.samples), "seconds": seconds,
                             "samples_per_s": len(result.samples) / seconds,
                             "texts": str(out.with_name(out.name + ".samples.jsonl").relative_to(work))}
    return results


def score(folder: Path) -> dict:
    """Validity of the texts a GPU run wrote (run here: RDKit and pymatgen)."""
    from logos.language.grammar import is_valid

    out = {}
    for path in sorted(folder.rglob("*.samples.jsonl")):
        texts = [json.loads(line)["text"] for line in path.read_text().splitlines() if line.strip()]
        out[path.name] = {"samples": len(texts), "grammar_valid": sum(map(is_valid, texts))}
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.score:
        print(json.dumps(score(args.score), indent=1))
        return 0
    import torch

    report = {"host": platform.node(), "python": platform.python_version(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
              "peaks_tflops": {"spec_bf16_dense": H200_BF16_DENSE / 1e12, "matmul_bf16": H200_BF16_MATMUL / 1e12},
              "formula": "MFU = tokens/s * (6*N + 12*L*H*Q*T) / peak", "parts": {}}
    if report["gpu"] is None:
        print("gpu_check: no CUDA device", file=sys.stderr)
        return 2
    work = args.out.parent
    work.mkdir(parents=True, exist_ok=True)
    runners = {"train": part_train, "zero3": part_zero3, "generate": part_generate}
    for part in args.parts.split(","):
        t = time.perf_counter()
        try:
            report["parts"][part] = runners[part](args, work)
        except Exception as e:  # one part's failure is a result; the others still run
            report["parts"][part] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        report["parts"][part]["seconds"] = time.perf_counter() - t
        args.out.write_text(json.dumps(report, indent=1, default=str))  # after every part: a timeout keeps the rest
        print(f"gpu_check: {part} done in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
