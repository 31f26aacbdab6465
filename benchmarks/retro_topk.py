"""USPTO-50k retrosynthesis top-k of a checkpoint on a seeded subset of the test split, with 95% intervals.

Samples ``--samples`` answers per product with ``logos generate --task retro`` (grammar and chemistry
constrained; equal canonical reactant sets merged, ranked by likelihood) and counts an item as a top-k
hit when the canonical reactant set (atom maps removed) is among its first k answers; invalid = the
share of items whose top-1 answer is not a valid reactant set. Intervals: Wilson score, 95%.

    PYTHONPATH=. python benchmarks/retro_topk.py --checkpoint runs/ft/best --items 200 --samples 10
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from logos.evaluate.stats import wilson

TEST = Path(os.environ.get("DATA", "data")) / "uspto50k" / "raw_test.csv.xz"  # $DATA: see BENCHMARKS.md, Setup
KS = (1, 3, 5, 10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--test", type=Path, default=TEST, help="USPTO-style CSV (id,class,reactants>reagents>production)")
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="JSON with the numbers")
    args = ap.parse_args()

    from logos.domains.reaction import parse_reaction
    from logos.tasks.pairs import read_reactions
    from logos.generate import GenerateOptions, Sampling, generate

    rows = list(read_reactions(args.test))
    picked = random.Random(args.seed).sample(rows, min(args.items, len(rows)))
    truth, lines = {}, []
    for i, (_ident, rxn, _) in enumerate(picked):
        reactants, _, products = parse_reaction(rxn)
        truth[f"item{i}"] = ".".join(reactants)
        lines.append(f"{'.'.join(products)} item{i}\n")
    with tempfile.TemporaryDirectory() as tmp:
        inputs = Path(tmp) / "products.smi"
        inputs.write_text("".join(lines))
        options = GenerateOptions(task="retro", n=args.samples, batch_size=16, seed=args.seed,
                                  sampling=Sampling(max_new_tokens=160))
        t = time.perf_counter()
        result = generate(Path(args.checkpoint), Path(tmp) / "out.rsmi", options, inputs=inputs)
        seconds = time.perf_counter() - t
    ranked: dict[str, list] = {}
    for s in result.samples:  # per input, best first
        ranked.setdefault(s.input_id, []).append(s.key)
    n = len(truth)
    report = {"checkpoint": args.checkpoint, "items": n, "samples": args.samples, "seed": args.seed,
              "seconds": round(seconds, 1)}
    for k in KS:
        hits = sum(truth[i] in ranked.get(i, [])[:k] for i in truth)
        report[f"top{k}"] = hits / n
        report[f"top{k}_ci95"] = wilson(hits, n)
    report["invalid_top1"] = sum(not ranked.get(i) or ranked[i][0] is None for i in truth) / n
    print(json.dumps(report, indent=1))
    print("| " + " | ".join(f"{100 * report[f'top{k}']:.1f} ({100 * report[f'top{k}_ci95'][0]:.1f}-"
                           f"{100 * report[f'top{k}_ci95'][1]:.1f})" for k in KS)
          + f" | {100 * report['invalid_top1']:.1f} |", file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
