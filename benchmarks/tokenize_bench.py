"""Throughput of ``logos tokenize`` against a bare RDKit parse-and-canonicalize loop, same molecules, one run.

Both sides read the same .smi file of N MOSES training molecules (seeded sample) and, with W
workers, split the work over W processes. The bare loop is `MolToSmiles(MolFromSmiles(s))` per
line; ``logos tokenize`` is the real CLI (process start, imports, JSONL and error log included).
``--repeats`` rounds alternate which side goes first; the table gives median rates and the median
per-round time ratio with its spread (min-max). Target: logos/bare <= 1.3.

    .venv/bin/python benchmarks/tokenize_bench.py [--n 100000] [--workers 1 2] [--repeats 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from logos.data import datasets as data


def _bare_chunk(lines: list[str]) -> int:
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    n = 0
    for line in lines:
        mol = Chem.MolFromSmiles(line.split(maxsplit=1)[0])
        if mol is not None:
            Chem.MolToSmiles(mol)
            n += 1
    return n


def bare(path: Path, workers: int) -> float:
    start = time.perf_counter()
    with open(path) as fh:
        lines = fh.readlines()
    if workers == 1:
        _bare_chunk(lines)
    else:
        chunks = [lines[i:i + 1024] for i in range(0, len(lines), 1024)]
        with mp.get_context("fork").Pool(workers) as pool:
            sum(pool.imap(_bare_chunk, chunks))
    return time.perf_counter() - start


def logos_cli(path: Path, workers: int, out: Path) -> float:
    exe = Path(sys.executable).with_name("logos")
    start = time.perf_counter()
    subprocess.run([str(exe), "tokenize", str(path), "-o", str(out), "--workers", str(workers), "-q"], check=True,
                   stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = data.fetch("moses-train", Path(tmp) / "moses.smi", limit=args.n, seed=0)
        print(f"{args.n:,} MOSES training molecules (seed 0); {os.cpu_count()} CPUs; "
              f"Python {platform.python_version()}; {args.repeats} alternating rounds, medians, spread min-max")
        print("| workers | bare RDKit loop (mol/s) | logos tokenize (mol/s) | logos / bare time (spread) |")
        print("|---:|---:|---:|---:|")
        for w in args.workers:
            t_bare, t_logos = [], []
            for r in range(args.repeats):
                order = (0, 1) if r % 2 == 0 else (1, 0)
                for side in order:
                    if side == 0:
                        t_bare.append(bare(path, w))
                    else:
                        t_logos.append(logos_cli(path, w, Path(tmp) / "out.jsonl"))
            ratios = [b / a for a, b in zip(t_bare, t_logos)]
            print(f"| {w} | {args.n / statistics.median(t_bare):,.0f} | {args.n / statistics.median(t_logos):,.0f} "
                  f"| **{statistics.median(ratios):.2f}x** ({min(ratios):.2f}-{max(ratios):.2f}) |", flush=True)

if __name__ == "__main__":
    main()
