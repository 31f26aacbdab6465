"""Training throughput: the DeepSpeed step against a plain torch AdamW loop (1 or 2 processes), and the shard reader.

Same model initialisation, same batches, same precision (the recipe's, resolved), same clipping: the
DeepSpeed engine (``logos.train.Trainer``, ZeRO stage from ``--zero``) and a hand-written loop
(autocast forward, masked loss, backward, ``clip_grad_norm_``, AdamW, LambdaLR; with 2 processes
wrapped in ``DistributedDataParallel``, gloo) alternate in rounds within one run, so load from other
processes hits both alike; the median round and the spread (min-max) are reported. Then the shard
reader draws training batches as fast as it can. Targets: ZeRO-2 >= 0.95x plain with 1
and 2 processes, on the tiny preset and on a ~50M model; reader >= 100x what training consumes.

    PYTHONPATH=. .venv/bin/python benchmarks/train_bench.py --zero 2                    # tiny, 1 process
    PYTHONPATH=. .venv/bin/python benchmarks/train_bench.py --zero 2 --model 50m --processes 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
MODELS = {  # model overrides of pretrain/tiny.yaml
    "tiny": [],
    "50m": ["model.hidden_size=512", "model.num_layers=12", "model.num_heads=8", "model.num_kv_heads=8",
            "model.intermediate_size=2048"],
}


def plain_loop(trainer):
    """A torch-only training step on the trainer's own initial weights, batches and precision."""
    from logos.train import Schedule, build_model

    recipe, meta = trainer.recipe, trainer.meta
    t = recipe.train
    model = build_model(recipe, meta["vocab_size"], meta["bos_id"], meta["eos_id"], meta.get("pad_id")).train()
    model.load_state_dict(trainer.engine.module.state_dict())
    world, rank = trainer.dist.world, trainer.dist.rank
    net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=t.lr, betas=t.betas, eps=1e-8,
                            fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, Schedule.from_recipe(recipe).multiplier)
    state = {"position": 0}

    def step() -> float:
        batch = trainer.train_reader.batch(state["position"] + rank * t.micro_batch, t.micro_batch)
        state["position"] += t.micro_batch * world
        x, y = torch.from_numpy(batch.tokens[:, :-1]), torch.from_numpy(batch.tokens[:, 1:])
        mask = torch.from_numpy(batch.loss_mask).flatten().float()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=trainer.precision == "bf16-autocast"):
            logits = net(input_ids=x, use_cache=False).logits
        loss = (F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="none") * mask).sum() \
            / mask.sum().clamp(min=1.0)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def timed(step, n: int, dist) -> float:
    dist.barrier()
    start = time.perf_counter()
    for _ in range(n):
        step()
    dist.barrier()
    return time.perf_counter() - start


def worker(args, data: Path, out: Path) -> dict:
    from logos.data.shards import ShardReader
    from logos.train import Trainer
    from logos.train.recipe import load_recipe

    recipe = load_recipe(REPO / "pretrain" / "tiny.yaml", [
        f"train.data={data}", f"train.out_dir={out}", f"train.zero_stage={args.zero}", "train.max_steps=100000",
        "train.max_minutes=null"] + MODELS[args.model] + [f"train.{kv}" for kv in args.set or []])
    if args.deepspeed:
        recipe.train.deepspeed = args.deepspeed
    t = recipe.train
    trainer = Trainer(recipe, progress=False, echo=lambda line: None)
    plain = plain_loop(trainer)
    ds_step = trainer.step
    tokens_per_step = t.micro_batch * t.grad_accum * t.seq_len * trainer.dist.world
    timed(ds_step, 3, trainer.dist)
    timed(plain, 3, trainer.dist)  # warm-up: allocator, autocast caches, DeepSpeed buckets
    ds_rates, plain_rates = [], []
    for r in range(args.rounds):  # alternate which side goes first, so a load change hits both
        pair = [(ds_rates, ds_step), (plain_rates, plain)]
        for rates, step in (pair if r % 2 == 0 else pair[::-1]):
            rates.append(args.steps * tokens_per_step / timed(step, args.steps, trainer.dist))
    result = {"ds": ds_rates, "plain": plain_rates, "world": trainer.dist.world,
              "params": sum(p.numel() for p in trainer.engine.module.parameters()),
              "batch": f"{t.micro_batch} x {t.seq_len}", "threads": torch.get_num_threads(),
              "precision": trainer.precision}
    if trainer.dist.is_main and args.reader_seconds:
        reader = ShardReader(data, "train", t.seq_len, seed=t.seed)
        rows, start = 0, time.perf_counter()
        while time.perf_counter() - start < args.reader_seconds:
            reader.batch(rows, t.micro_batch)  # the training access pattern: consecutive positions, shuffled rows
            rows += t.micro_batch
        result["reader"] = rows * t.seq_len / (time.perf_counter() - start)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="shard directory (default: pack tests/assets/moses_500.smi)")
    ap.add_argument("--zero", type=int, default=2)
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument("--processes", type=int, default=1, choices=(1, 2))
    ap.add_argument("--steps", type=int, default=10, help="steps per round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--reader-seconds", type=float, default=2.0)
    ap.add_argument("--deepspeed", help="a DeepSpeed JSON merged over the recipe's config")
    ap.add_argument("--set", action="append", metavar="KEY=VALUE", help="train.KEY=VALUE override")
    ap.add_argument("--worker", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "tests"))
    if args.worker:  # one rank under torchrun
        result = worker(args, Path(args.data), Path(args.worker).with_suffix(".run"))
        if int(os.environ.get("RANK", "0")) == 0:
            Path(args.worker).write_text(json.dumps(result))
        return
    tmp = Path(tempfile.mkdtemp(prefix="train_bench_"))
    if args.data is None:
        from train_fixtures import make_shards

        args.data = str(make_shards(tmp))
    if args.processes == 1:
        result = worker(args, Path(args.data), tmp / "run")
    else:
        report = tmp / "report.json"
        cmd = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node", "2", __file__,
               "--worker", str(report)] + [a for a in sys.argv[1:]]
        if "--data" not in sys.argv:
            cmd += ["--data", args.data]
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr[-4000:])
        result = json.loads(report.read_text())
    ds, pl = statistics.median(result["ds"]), statistics.median(result["plain"])
    ratios = [d / p for d, p in zip(result["ds"], result["plain"])]
    spread = lambda xs: f"{min(xs):,.0f}-{max(xs):,.0f}"  # noqa: E731
    print(f"model: {args.model}, {result['params']:,} parameters; {result['world']} process(es), batch "
          f"{result['batch']} per process; precision {result['precision']}; torch threads {result['threads']}")
    print(f"deepspeed ZeRO-{args.zero}: {ds:,.0f} tokens/s (rounds {spread(result['ds'])})")
    print(f"plain torch AdamW{' + DDP' if result['world'] > 1 else ''}: {pl:,.0f} tokens/s "
          f"(rounds {spread(result['plain'])})")
    print(f"ratio deepspeed/plain: {ds / pl:.3f}x median of medians; per round {min(ratios):.3f}-{max(ratios):.3f}, "
          f"median {statistics.median(ratios):.3f} (target >= 0.95x)")
    if "reader" in result:
        print(f"shard reader: {result['reader']:,.0f} tokens/s = {result['reader'] / ds:,.0f}x training consumption")


if __name__ == "__main__":
    main()
