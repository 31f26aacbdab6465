"""Training throughput: the DeepSpeed step against a plain torch AdamW loop, and the shard reader's speed.

One run, one process, same model initialisation, same batches, same precision: the DeepSpeed
engine (``logos.train.Trainer``, ZeRO stage from ``--zero``) and a hand-written loop (autocast
forward, loss, backward, ``clip_grad_norm_``, AdamW, LambdaLR) alternate in rounds so that load
from other processes hits both alike; the median round is reported. Then the shard reader draws
random training batches as fast as it can. Targets (issue 3): DeepSpeed >= 0.9x plain; reader
>= 100x what training consumes.

    PYTHONPATH=. python benchmarks/train_bench.py                 # packs the 500-molecule fixture
    PYTHONPATH=. python benchmarks/train_bench.py --data SHARDS/   # or any packed corpus
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from logos.config import load_recipe  # noqa: E402
from logos.pack import ShardReader  # noqa: E402
from logos.train import Trainer, build_model, lr_lambda  # noqa: E402


def plain_loop(recipe, meta, reader):
    """A torch-only training step on the same model initialisation, batches and precision."""
    t = recipe.train
    model = build_model(recipe, meta["vocab_size"], meta["bos_id"], meta["eos_id"], 3).train()
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=t.lr, betas=t.betas, eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(recipe))
    state = {"position": 0}

    def step() -> float:
        tokens, _ = reader.batch(state["position"], t.micro_batch)
        state["position"] += t.micro_batch
        x, y = torch.from_numpy(tokens[:, :-1]), torch.from_numpy(tokens[:, 1:])
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=t.precision == "bf16-autocast"):
            logits = model(input_ids=x, use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return step


def timed(step, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        step()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(REPO / "pretrain" / "tiny.yaml"))
    ap.add_argument("--data", help="shard directory (default: pack tests/assets/moses_500.smi)")
    ap.add_argument("--zero", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10, help="steps per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reader-seconds", type=float, default=3.0)
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="train_bench_"))
    if args.data:
        data = Path(args.data)
    else:
        from train_fixtures import make_shards

        data = make_shards(tmp)
    recipe = load_recipe(Path(args.config), [f"train.data={data}", f"train.out_dir={tmp / 'run'}",
                                             f"train.zero_stage={args.zero}", "train.max_steps=100000",
                                             f"train.tokenizer={REPO / 'tokenizers' / 'default'}"])
    t = recipe.train
    trainer = Trainer(recipe, progress=False, echo=lambda line: None)
    plain = plain_loop(recipe, trainer.meta, ShardReader(data, "train", t.seq_len, seed=t.seed))
    ds_step = lambda: trainer.step()  # noqa: E731
    tokens_per_step = t.micro_batch * t.grad_accum * t.seq_len
    timed(ds_step, 2)
    timed(plain, 2)  # warm-up: allocator, autocast caches
    ds_rates, plain_rates = [], []
    for _ in range(args.rounds):
        ds_rates.append(args.steps * tokens_per_step / timed(ds_step, args.steps))
        plain_rates.append(args.steps * tokens_per_step / timed(plain, args.steps))
    ds, pl = statistics.median(ds_rates), statistics.median(plain_rates)

    reader = ShardReader(data, "train", t.seq_len, seed=t.seed)
    rows = 0
    start = time.perf_counter()
    while time.perf_counter() - start < args.reader_seconds:
        reader.batch(rows, t.micro_batch)  # the training access pattern: consecutive positions, shuffled rows
        rows += t.micro_batch
    reader_rate = rows * t.seq_len / (time.perf_counter() - start)

    print(f"model: {recipe.name}, {sum(p.numel() for p in trainer.engine.module.parameters()):,} parameters; "
          f"batch {t.micro_batch} x {t.seq_len} tokens; precision {t.precision}; torch threads {torch.get_num_threads()}")
    print(f"deepspeed ZeRO-{args.zero} step: {ds:,.0f} tokens/s  (rounds: {', '.join(f'{r:,.0f}' for r in ds_rates)})")
    print(f"plain torch AdamW loop:  {pl:,.0f} tokens/s  (rounds: {', '.join(f'{r:,.0f}' for r in plain_rates)})")
    print(f"ratio deepspeed/plain:   {ds / pl:.2f}x  (target >= 0.9x)")
    print(f"shard reader:            {reader_rate:,.0f} tokens/s = {reader_rate / ds:,.0f}x training consumption "
          f"(target >= 100x)")


if __name__ == "__main__":
    main()
