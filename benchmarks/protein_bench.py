"""Throughput of ``logos tokenize`` on structures against a bare gemmi read of the same files, one run.

Sets: the 58 dockstring receptors (PDBQT converted to PDB by ``logos fetch dockstring-targets``)
as plain chains, then with residue contacts and 3Di; the 4 posebusters complexes with their
crystal ligand SDF (``--ligand auto``); and the 7ZTL test fixture copied ``--copies`` times, whose
hetero ligands take their bond orders from the CCD (biotite's components.bcif, loaded once per
process). The bare side is ``gemmi.read_structure`` plus a residue count per file, in-process;
``logos tokenize`` is the real CLI (process start ~0.8 s, imports, CCD load ~3 s when hetero
ligands are read, JSONL, error log included); the last column runs the same pipeline in this
process (``tokenize_files``, one worker), where the CCD stays loaded after the first repeat.
Each number is the best of ``--repeats`` alternating runs.

    PYTHONPATH=. .venv/bin/python benchmarks/protein_bench.py [--repeats 2] [--workers 1] [--copies 20]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gemmi

from logos import data

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
    from logos.encode import tokenize_files

    args = build_parser().parse_args(["tokenize", *map(str, paths), "-o", str(out), *flags])
    options = encoder_options(vars(args), strict=False)
    start = time.perf_counter()
    tokenize_files(paths, out, options, domain=args.domain, workers=1, progress=False, echo=lambda line: None)
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
        print(f"# {os.cpu_count()} CPUs; Python {platform.python_version()}; gemmi {gemmi.__version__}; "
              f"workers {args.workers}; best of {args.repeats}")
        print("| set | structures | residues | bare gemmi read (structures/s, residues/s) "
              "| logos tokenize CLI (structures/s, residues/s) | CLI / bare time "
              "| encoders in-process (structures/s, residues/s) |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for label, paths, flags in rows:
            n_res = protein_residues(paths)
            t_bare = t_logos = t_inproc = float("inf")
            for _ in range(args.repeats):
                t_bare = min(t_bare, bare(paths)[0])
                t_logos = min(t_logos, logos_cli(paths, tmp / "out.jsonl", args.workers, *flags))
                t_inproc = min(t_inproc, logos_inprocess(paths, tmp / "in.jsonl", *flags))
            n = len(paths)
            print(f"| {label} | {n} | {n_res:,} | {n / t_bare:,.1f}, {n_res / t_bare:,.0f} "
                  f"| {n / t_logos:,.1f}, {n_res / t_logos:,.0f} | {t_logos / t_bare:.1f}x "
                  f"| {n / t_inproc:,.1f}, {n_res / t_inproc:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
