"""Throughput of ``logos tokenize`` on structures against a bare gemmi read of the same files, one run.

Sets: the 58 dockstring receptors (PDBQT converted to PDB by ``logos fetch dockstring-targets``)
as plain chains, then with residue contacts and 3Di; the 4 posebusters complexes with their
crystal ligand SDF (``--ligand auto``); and the 7ZTL test fixture copied ``--copies`` times, whose
hetero ligands take their bond orders from the CCD (biotite's components.bcif, loaded once per
process). The bare side is ``gemmi.read_structure`` plus a residue count per file, in-process;
``logos tokenize`` is the real CLI (process start and imports ~1 s, an isolated worker process,
JSONL, error log included); "encoders in-process" runs the same pipeline in this process
(``tokenize_files`` with ``workers=0``: the encoders and the JSON lines, no process start, no
isolation). The CCD comes from its prebuilt index (:mod:`logos.domains.ccd_index`, built once per
machine). ``--repeats`` rounds alternate the order of the three sides; medians and the spread of
the per-round time ratios are printed. Target: plain chains in-process <= 2x bare.

    PYTHONPATH=. .venv/bin/python benchmarks/protein_bench.py [--repeats 2] [--workers 1] [--copies 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gemmi

from logos.data import datasets as data

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "assets" / "protein" / "7ztl_protein.pdb.gz"


def bare(paths: list[Path]) -> tuple[float, int]:
    start = time.perf_counter()
    residues = 0
    for p in paths:
        st = gemmi.read_structure(str(p))
        residues += sum(len(ch) for ch in st[0])
    return time.perf_counter() - start, residues


def logos_cli(paths: list[Path], out: Path, workers: int, *flags: str) -> float:
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "logos.cli", "tokenize", *map(str, paths), "-o", str(out),
                             "--workers", str(workers), "-q", *flags], stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode not in (0, 1):
        raise SystemExit(result.stderr)
    return elapsed


def logos_inprocess(paths: list[Path], out: Path, *flags: str) -> float:
    """``tokenize_files`` in this process: the encoders without interpreter start and imports."""
    from logos.cli import build_parser
    from logos.domains import encoder_options
    from logos.data.encode import tokenize_files

    args = build_parser().parse_args(["tokenize", *map(str, paths), "-o", str(out), *flags])
    options = encoder_options(vars(args), strict=False)
    start = time.perf_counter()
    tokenize_files(paths, out, options, domain=args.domain, workers=0, progress=False, echo=lambda line: None)
    return time.perf_counter() - start


def protein_residues(paths: list[Path]) -> int:
    """Residues written by logos (polymer residues of the first model), for the residues/s column."""
    from logos.domains import structure

    return sum(structure.read_structure(p).n_residues for p in paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--copies", type=int, default=20, help="copies of the 7ZTL fixture (hetero-ligand row)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        dock = sorted(data.fetch("dockstring-targets").glob("*_target.pdb"))
        pb = sorted(data.fetch("posebusters-complexes").glob("*_protein.pdb"))
        copies = []
        for i in range(args.copies):
            copies.append(tmp / f"7ztl_{i}_protein.pdb.gz")
            shutil.copy(FIXTURE, copies[-1])
        rows = [
            ("dockstring receptors, plain chains (`--domain protein`)", dock, ("--domain", "protein")),
            ("dockstring receptors + `--contacts --structure-tokens 3di`", dock,
             ("--domain", "protein", "--contacts", "--structure-tokens", "3di")),
            ("posebusters complexes, ligand SDF (`--ligand auto`)", pb, ("--ligand", "auto")),
            (f"7ZTL x{args.copies}, hetero ligands with CCD bond orders", copies, ()),
        ]
        print(f"{os.cpu_count()} CPUs; Python {platform.python_version()}; gemmi {gemmi.__version__}; CLI workers "
              f"{args.workers}; {args.repeats} alternating rounds: median rates, median per-round time ratio (min-max)")
        print("| set | structures | residues | bare gemmi read (structures/s) | encoders in-process (structures/s) "
              "| in-process / bare time | logos tokenize CLI (structures/s) | CLI / bare time |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for label, paths, flags in rows:
            n_res = protein_residues(paths)
            times: dict[str, list[float]] = {"bare": [], "inproc": [], "cli": []}
            for r in range(args.repeats):
                for side in (("bare", "inproc", "cli") if r % 2 == 0 else ("cli", "inproc", "bare")):
                    if side == "bare":
                        times[side].append(bare(paths)[0])
                    elif side == "inproc":
                        times[side].append(logos_inprocess(paths, tmp / "in.jsonl", *flags))
                    else:
                        times[side].append(logos_cli(paths, tmp / "out.jsonl", args.workers, *flags))
            n = len(paths)
            rate = {k: n / statistics.median(v) for k, v in times.items()}

            def ratio(side: str) -> str:
                rs = [a / b for a, b in zip(times[side], times["bare"])]  # noqa: B023 - called in this loop
                return f"**{statistics.median(rs):.2f}x** ({min(rs):.2f}-{max(rs):.2f})"

            print(f"| {label} | {n} | {n_res:,} | {rate['bare']:,.1f} | {rate['inproc']:,.1f} | {ratio('inproc')} "
                  f"| {rate['cli']:,.1f} | {ratio('cli')} |", flush=True)

if __name__ == "__main__":
    main()
