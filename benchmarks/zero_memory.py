"""Peak resident memory per rank of ZeRO-0 against ZeRO-3: 2 processes on CPU, a ~340M-parameter Llama.

Each stage runs as ``torchrun --nproc_per_node 2`` (one thread per process) through the real
trainer (``logos.train.Trainer``): build (ZeRO-3: partitioned at construction), a few optimizer
steps, then a checkpoint save with its Hugging Face export (ZeRO-3: gathered one module at a time).
Every rank reports its resident set after each phase and its peak (``ru_maxrss``); the fixed
per-process cost is the resident set after importing torch/transformers/DeepSpeed and joining the
process group, before any model exists. Target: ZeRO-3 peak <= 0.7x ZeRO-0's.

    PYTHONPATH=. .venv/bin/python benchmarks/zero_memory.py              # layers 20, hidden 1024 (~340M)
    PYTHONPATH=. .venv/bin/python benchmarks/zero_memory.py --layers 4   # quick check of the script
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GiB = 1024**3


def rss_bytes() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def worker(args) -> None:
    """One rank: phases of a real training run, with the resident set after each."""
    from logos.train import distributed

    dist = distributed.init()
    phases = {"imports + process group": (rss_bytes(), peak_bytes())}
    from logos.train import Trainer
    from logos.train.recipe import load_recipe

    recipe = load_recipe(Path(args.recipe))
    trainer = Trainer(recipe, progress=False, echo=lambda line: None)
    n_params = sum(getattr(p, "ds_numel", p.numel()) for p in trainer.engine.module.parameters())
    phases["model + engine built"] = (rss_bytes(), peak_bytes())
    t = time.perf_counter()
    for _ in range(args.steps):
        trainer.step()
    step_s = (time.perf_counter() - t) / args.steps
    phases[f"{args.steps} optimizer steps"] = (rss_bytes(), peak_bytes())
    trainer.save()
    phases["checkpoint + HF export"] = (rss_bytes(), peak_bytes())
    report = {"rank": dist.rank, "params": n_params, "step_s": step_s,
              "phases": {k: {"rss": r, "peak": p} for k, (r, p) in phases.items()}}
    Path(args.report).with_suffix(f".rank{dist.rank}.json").write_text(json.dumps(report))


def run_stage(stage: int, shards: Path, work: Path, args) -> list[dict]:
    from logos.train.recipe import load_recipe

    import yaml

    out = work / f"run_zero{stage}"
    recipe = load_recipe(REPO / "pretrain" / "tiny.yaml", [
        f"train.data={shards}", f"train.out_dir={out}", f"train.zero_stage={stage}", "train.max_minutes=null",
        "train.max_steps=1000", "train.seq_len=64", f"train.micro_batch={args.micro_batch}", "train.keep_checkpoints=1",
        "train.eval_rows=2", f"model.hidden_size={args.hidden}", f"model.num_layers={args.layers}",
        f"model.num_heads={args.hidden // 64}", f"model.num_kv_heads={args.hidden // 64}",
        f"model.intermediate_size={4 * args.hidden}", "model.max_position=512"])
    path = work / f"zero{stage}.yaml"
    path.write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    report = work / f"zero{stage}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    torchrun = Path(sys.executable).with_name("torchrun")
    cmd = [str(torchrun), "--standalone", "--nproc_per_node", "2", __file__, "--worker", "--recipe", str(path),
           "--report", str(report), "--steps", str(args.steps)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"ZeRO-{stage} run failed:\n{proc.stderr[-4000:]}")
    print(f"ZeRO-{stage}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return [json.loads(report.with_suffix(f".rank{r}.json").read_text()) for r in range(2)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--recipe", help=argparse.SUPPRESS)
    ap.add_argument("--report", help=argparse.SUPPRESS)
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(REPO / "tests"))
    from train_fixtures import make_shards

    work = Path(tempfile.mkdtemp(prefix="zero_memory_"))
    shards = make_shards(work)
    results = {stage: run_stage(stage, shards, work, args) for stage in (0, 3)}
    params = results[0][0]["params"]
    from logos.train.engine import resolve_precision

    PRECISION = {"fp32": "fp32", "bf16": "bf16", "bf16-autocast": "fp32 weights + bf16 autocast"}.get(
        resolve_precision("auto"), resolve_precision("auto"))
    print(f"\nmodel: Llama, {args.layers} layers x hidden {args.hidden}, {params / 1e6:.0f}M parameters; 2 processes "
          f"(gloo, 1 thread each), micro-batch {args.micro_batch} x 64 tokens, {PRECISION} (precision auto), AdamW")
    print("\n| phase | ZeRO-0 rank 0 / 1 (GiB) | ZeRO-3 rank 0 / 1 (GiB) |\n|---|---:|---:|")
    for phase in results[0][0]["phases"]:
        cells = [" / ".join(f"{r['phases'][phase]['rss'] / GiB:.2f}" for r in results[s]) for s in (0, 3)]
        print(f"| {phase} (resident) | {cells[0]} | {cells[1]} |")
    peaks = {s: [r["phases"]["checkpoint + HF export"]["peak"] for r in results[s]] for s in (0, 3)}
    print(f"| **peak (ru_maxrss)** | {' / '.join(f'{p / GiB:.2f}' for p in peaks[0])} | "
          f"{' / '.join(f'{p / GiB:.2f}' for p in peaks[3])} |")
    fixed = max(r["phases"]["imports + process group"]["rss"] for s in (0, 3) for r in results[s])
    per_rank = [peaks[3][r] / peaks[0][r] for r in range(2)]
    print(f"\nZeRO-3 / ZeRO-0 peak: rank 0 {per_rank[0]:.2f}x, rank 1 {per_rank[1]:.2f}x; "
          f"max over ranks {max(peaks[3]) / max(peaks[0]):.2f}x (target <= 0.7x)")
    above = [(peaks[s][r] - fixed) for s in (0, 3) for r in range(2)]
    print(f"fixed per-process cost (imports, process group): {fixed / GiB:.2f} GiB; above it, ZeRO-3 / ZeRO-0: "
          f"{max(above[2:]) / max(above[:2]):.2f}x")
    print(f"seconds per step: ZeRO-0 {results[0][0]['step_s']:.1f}, ZeRO-3 {results[3][0]['step_s']:.1f}")


if __name__ == "__main__":
    main()
