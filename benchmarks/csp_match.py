"""Perov-5 crystal structure prediction of a checkpoint: match rate and RMSE at n = 1 and n = 20 on a seeded test subset.

For each sampled test structure the prompt is its composition header as the encoder writes it
(``<CrystalS>`` + the conventional cell's formula, no space group: ``logos generate --task crystal
--cell-composition``, so the cell is the test structure's, not one the model chooses); ``logos generate``
draws ``--samples`` structures per prompt (grammar-constrained: the crystal system's lattice
parameters, Wyckoff letters of the group, the composition's atom counts), ranked by likelihood; then
``logos evaluate --task csp`` matches them against the test structures with pymatgen's
StructureMatcher at CrystaLLM's tolerances (stol 0.5, angle_tol 10, ltol 0.3). Match rate@1 uses
the most likely of the samples, @20 any of the first 20 (CDVAE's protocol draws n independent
samples; ranking by likelihood makes @1 an optimistic pick of one). Intervals: Wilson, 95%.

    PYTHONPATH=. python benchmarks/csp_match.py --checkpoint runs/csp/hf --items 100 --samples 20 --out csp.json
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from logos.evaluate.stats import wilson  # noqa: E402

TEST = Path(os.environ.get("DATA", "data")) / "cdvae" / "perov_5_test.csv.xz"  # $DATA: see BENCHMARKS.md, Setup


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--test", type=Path, default=TEST, help="CDVAE CSV (material_id, cif)")
    ap.add_argument("--items", type=int, default=100)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="JSON with the numbers")
    ap.add_argument("--work", type=Path, help="keep prompts, samples and the evaluation report here (default: a temporary folder)")
    args = ap.parse_args()

    from logos.cli import main as cli
    from logos.tasks.crystal_pairs import split_crystal_text
    from logos.science.materials import encode_crystal, read_cif_block
    from logos.util.records import open_text

    with open_text(args.test) as fh:
        rows = list(csv.DictReader(fh))
    picked = random.Random(args.seed).sample(rows, min(args.items, len(rows)))
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.work or Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        lines, kept = [], []
        for row in picked:
            prompt, _ = split_crystal_text(encode_crystal(read_cif_block(row["cif"]), composition=True), False)
            lines.append(f"{prompt.removeprefix('<CrystalS>')} - {row['material_id']}\n")
            kept.append(row)
        (tmp / "prompts.txt").write_text("".join(lines))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=["material_id", "cif"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(kept)
        (tmp / "reference.csv").write_text(buf.getvalue())
        t = time.perf_counter()
        rc = cli(["generate", "--task", "crystal", "--cell-composition", "--checkpoint", args.checkpoint,
                  "--input", str(tmp / "prompts.txt"), "-n", str(args.samples), "--seed", str(args.seed), "-q",
                  "-o", str(tmp / "out.cif")])
        seconds = time.perf_counter() - t
        if rc not in (0, 1):
            return rc
        cli(["evaluate", "--task", "csp", "--predictions", str(tmp / "out.samples.jsonl"), "--references",
             str(tmp / "reference.csv"), "-o", str(tmp / "eval")])
        metrics = json.loads((tmp / "eval" / "metrics.json").read_text())
    m = metrics.get("metrics", metrics)
    n = len(kept)
    report = {"checkpoint": args.checkpoint, "items": n, "samples": args.samples, "seed": args.seed,
              "generate_seconds": round(seconds, 1)}
    for k in (1, args.samples):
        rate = m.get(f"match_rate@{k}")
        report[f"match_rate@{k}"] = rate
        report[f"match_rate@{k}_ci95"] = wilson(round((rate or 0) * n), n)
        report[f"rmse@{k}"] = m.get(f"rmse@{k}")
    print(json.dumps(report, indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
