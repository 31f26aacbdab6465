"""Evaluation speed: ``logos evaluate --task molecule`` on 10,000 molecules, and crystal stability per structure.

1. Molecules: 10,000 SMILES (a seeded sample of MOSES's scaffold-split test set, ``logos fetch
   moses-test-scaffolds --limit 10000``), every metric but FCD (SNN, Frag and Scaf against the test
   and scaffold-split test sets included), novelty against MOSES train as stored, ``--workers 2``.
   Run twice: the first fills the reference caches (canonical test set, property sample,
   fingerprints, fragments and scaffolds of both sets), the second is the measured warm run.
2. Crystal stability: ``K`` crystals the shipped model writes (``logos generate --task crystal``)
   relaxed with ``logos evaluate --task crystal --stability --workers 2`` against mp-dielectric,
   first with an empty relaxation cache (the known phases of the touched chemical systems and the
   elemental states are relaxed too), then again (everything cached).

Wall and CPU seconds (this process's children: every worker included) and the load average before
and after each run are recorded; ``--write`` rewrites the marked section of BENCHMARKS.md.

    PYTHONPATH=. python benchmarks/evaluate_speed.py --work bench_speed [--crystals 5] [--write]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARK = "evaluate speed"


def _run(cmd: list[str], env: dict | None = None) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "load": (load0, os.getloadavg()[0])}


def molecules(work: Path, env: dict) -> dict:
    logos = [sys.executable, "-m", "logos.cli"]
    smi = work / "scaffolds_10k.smi"
    if not smi.exists():
        _run(logos + ["fetch", "moses-test-scaffolds", "--limit", "10000", "-o", str(smi)], env)
    cmd = logos + ["evaluate", "--task", "molecule", "--predictions", str(smi), "--train", "moses-train",
                   "--train-as-given", "--workers", "2", "-o", str(work / "molecule_10k")]
    cold = _run(cmd, env)
    warm = _run(cmd, env)
    doc = json.loads((work / "molecule_10k" / "metrics.json").read_text())
    return {"cold": cold, "warm": warm, "seconds": doc["seconds"],
            "metrics": {k: doc["metrics"].get(k) for k in ("validity", "intdiv1", "filters", "snn_test", "frag_test",
                                                           "scaf_test", "snn_testsf", "frag_testsf", "scaf_testsf")}}


def crystals(work: Path, env: dict, k: int) -> dict:
    logos = [sys.executable, "-m", "logos.cli"]
    out = work / "crystal"
    gen = _run(logos + ["generate", "--task", "crystal", "-n", str(k), "--seed", "0", "-q",
                        "-o", str(out / "samples.cif")], env)
    # an empty relaxation cache of its own; the fetched datasets and packages are the usual cache's
    own = work / "relax_cache"
    subprocess.run(["rm", "-rf", str(own / "evaluate")], check=False)
    own.mkdir(parents=True, exist_ok=True)
    usual = Path(os.environ.get("LOGOS_CACHE", Path.home() / ".cache" / "logos"))
    for sub in ("datasets", "packages"):
        if (usual / sub).is_dir() and not (own / sub).exists():
            (own / sub).symlink_to(usual / sub)
    cache = {**env, "LOGOS_CACHE": str(own)}
    cmd = logos + ["evaluate", "--task", "crystal", "--predictions", str(out / "samples.samples.jsonl"), "--stability",
                   "--workers", "2", "-o", str(out / "eval")]
    cold = _run(cmd, cache)
    doc = json.loads((out / "eval" / "metrics.json").read_text())
    warm = _run(cmd, cache)
    rows = doc["tables"]["stability per structure"]
    prov = doc["provenance"]["stability"]
    own = [r["seconds"] for r in rows if r.get("seconds") is not None]
    return {"generate": gen, "cold": cold, "warm": warm, "structures": len(rows), "relaxed": doc["metrics"]["relaxed"],
            "converged": doc["metrics"]["converged"], "known_phases": prov["known_phases"],
            "relaxations": prov["relaxations"], "stability_seconds": prov["seconds"],
            "relax_seconds_each": own, "atoms": [r.get("atoms") for r in rows], "steps": [r.get("steps") for r in rows]}


def section(mol: dict | None, cry: dict | None, commit: str) -> str:
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [f"<!-- {MARK} -->", "### Evaluation speed: molecules (10,000) and crystal stability (per structure)", "",
             f"Written by `benchmarks/evaluate_speed.py` at commit {commit} on {stamp}, on the 2-core machine shared "
             "with other jobs (load average before and after each run given; the CPU seconds are the run's own, "
             "workers included, and say what an idle machine would take).", ""]
    if mol:
        w, c, s = mol["warm"], mol["cold"], mol["seconds"]
        lines += ["Molecules: 10,000 of MOSES's scaffold-split test set, every metric but FCD (with SNN, Frag, Scaf "
                  "against test and scaffold-split test), novelty against MOSES train as stored, `--workers 2`:", "",
                  "| run | wall (s) | CPU (s) | load before, after |", "|---|---:|---:|---|",
                  f"| first (fills the caches) | {c['wall']:.1f} | {c['cpu']:.1f} | {c['load'][0]:.1f}, {c['load'][1]:.1f} |",
                  f"| warm | {w['wall']:.1f} | {w['cpu']:.1f} | {w['load'][0]:.1f}, {w['load'][1]:.1f} |", "",
                  "Warm run's stages (wall s): " + ", ".join(f"{k} {v:.1f}" for k, v in s.items()) + ".", "",
                  "Metrics of that sample: " + ", ".join(f"{k} {v:.4f}" for k, v in mol["metrics"].items()
                                                        if isinstance(v, float)) + ".", ""]
    if cry:
        c, w = cry["cold"], cry["warm"]
        n = max(1, cry["structures"])
        each = cry["relax_seconds_each"]
        lines += [f"Crystal stability: {cry['structures']} crystals of the shipped model "
                  f"({', '.join(str(a) for a in cry['atoms'])} atoms; {', '.join(str(x) for x in cry['steps'])} "
                  f"FIRE steps), `--stability --workers 2` against mp-dielectric; {cry['known_phases']} known phases "
                  f"(reference crystals in the touched chemical systems and elemental states) relaxed with them:", "",
                  "| run | wall (s) | CPU (s) | wall s per generated structure | load before, after |",
                  "|---|---:|---:|---:|---|",
                  f"| empty relaxation cache | {c['wall']:.1f} | {c['cpu']:.1f} | {c['wall'] / n:.1f} | "
                  f"{c['load'][0]:.1f}, {c['load'][1]:.1f} |",
                  f"| cached | {w['wall']:.1f} | {w['cpu']:.1f} | {w['wall'] / n:.1f} | "
                  f"{w['load'][0]:.1f}, {w['load'][1]:.1f} |", "",
                  f"One relaxation of a generated structure took {min(each):.1f}-{max(each):.1f} s "
                  f"(mean {sum(each) / len(each):.1f} s) inside a worker; the relaxation counts were "
                  f"{cry['relaxations']}. 200 structures: about {200 * sum(each) / len(each) / 2 / 60:.0f} min on "
                  "two workers from these relaxations alone, plus the known phases of their chemical systems once.", ""]
    return "\n".join(lines + [f"<!-- /{MARK} -->"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("bench_speed"))
    ap.add_argument("--crystals", type=int, default=5, help="crystals generated and relaxed (0: skip)")
    ap.add_argument("--skip-molecules", action="store_true")
    ap.add_argument("--write", action="store_true", help="rewrite the marked section of BENCHMARKS.md")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    mol = None if args.skip_molecules else molecules(args.work.resolve(), env)
    cry = crystals(args.work.resolve(), env, args.crystals) if args.crystals else None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    text = section(mol, cry, commit)
    (args.work / "evaluate_speed.json").write_text(json.dumps({"molecules": mol, "crystals": cry}, indent=1))
    print(text)
    if args.write:
        bench = REPO / "BENCHMARKS.md"
        doc = bench.read_text()
        pattern = re.compile(rf"<!-- {re.escape(MARK)} -->.*?<!-- /{re.escape(MARK)} -->", re.S)
        doc = pattern.sub(lambda m: text, doc) if pattern.search(doc) else doc.rstrip("\n") + "\n\n" + text + "\n"
        bench.write_text(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
