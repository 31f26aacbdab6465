"""What the built-in sampling loop itself costs per row and step: no model, no grammar, constraints that accept all.

A scripted model (its next-token logits a fixed random table's row for the last token; the stop token never likely)
and 16 rows of 64 tokens each, without row constraints and with ones that accept every token (the loop then runs its
whole per-row path: the proposal, the check, the decision, the commit). CPU seconds of the process per row-step, the
minimum and the median over ``--runs`` seeds. Run it on each tree to compare, alternating:

    PYTHONPATH=. .venv/bin/python benchmarks/loop_overhead.py
    PYTHONPATH=/path/to/other/tree .venv/bin/python benchmarks/loop_overhead.py --label before
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch

VOCAB, STOP, ROWS, TOKENS = 2432, 2, 16, 64


class Scripted(torch.nn.Module):
    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=True, past_key_values=None):
        return SimpleNamespace(logits=self.table[input_ids[:, -1]][:, None, :], past_key_values=None)


def per_row_step(model, constrained: bool, seed: int) -> float:
    from logos.decoding.rows import RowConstraint
    from logos.decoding.sampler import Sampling, StepStats, sample_batch

    rows = [RowConstraint() for _ in range(ROWS)] if constrained else None
    banned = torch.zeros(VOCAB, dtype=torch.bool)
    start = time.process_time()
    sample_batch(model, [[1, 5]] * ROWS, 0, STOP, banned, Sampling(max_new_tokens=TOKENS, closing_slack=0),
                 torch.Generator().manual_seed(seed), None, rows, StepStats())
    return (time.process_time() - start) / (ROWS * TOKENS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--label", default="this tree")
    args = ap.parse_args()
    torch.set_num_threads(1)
    table = torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(0)) * 2
    table[:, STOP] = -1e9
    model = Scripted(table)
    for constrained in (False, True):
        runs = sorted(per_row_step(model, constrained, seed) for seed in range(args.runs))
        print(f"{args.label}: rows {'with constraints that accept all' if constrained else 'without constraints'}: "
              f"{1e6 * runs[0]:.1f} us CPU per row-step (min), {1e6 * statistics.median(runs):.1f} (median)",
              flush=True)


if __name__ == "__main__":
    main()
