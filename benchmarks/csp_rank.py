"""CSP candidates ranked by the ML potential's energy against the model's likelihood: match rate@1 and stability.

Reads a ``benchmarks/csp_match.py --work DIR`` folder (``out.samples.jsonl``: the samples of each composition,
ranked by likelihood; ``reference.csv``: the picked test structures; and, when ``benchmarks/stability_rescore.sh``
made it, ``stability/``: the likelihood pick relaxed). Every candidate gets CHGNet's energy per atom after
``--steps`` FIRE steps (1: the energy of the structure as written, one force call more), in isolated workers
and cached like ``logos evaluate --stability``; the candidates of each composition are re-ranked by that energy
(structures the potential cannot take last) and written as ``energy.samples.jsonl``; ``logos evaluate --task
csp`` scores both rankings (match rate@1 is the first candidate's), and with ``--stability`` relaxes the
energy pick as the rescoring relaxed the likelihood pick. Prints one table and the cost.

    PYTHONPATH=. python benchmarks/csp_rank.py bench_stability/csp --steps 1 --stability
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def logos(*args) -> None:
    code = subprocess.run([sys.executable, "-m", "logos.cli", *map(str, args)], cwd=REPO).returncode
    if code not in (0, 1):  # 1: some structures failed (each listed), the others are scored
        raise SystemExit(f"csp_rank: logos {args[0]} exited with status {code}")


def rerank(work: Path, steps: int, workers: int) -> tuple[Path, dict]:
    """Write ``energy.samples.jsonl`` (each composition's candidates ordered by energy); returns it and the cost."""
    from logos.evaluate.crystals import read_items
    from logos.evaluate.stability import RelaxOptions, relax_items

    samples = work / "out.samples.jsonl"
    records = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    items = read_items(samples)
    if len(items) != len(records):
        raise SystemExit(f"csp_rank: {samples}: {len(records)} lines but {len(items)} structures read")
    t = time.perf_counter()
    results, counts = relax_items(items, RelaxOptions(steps=steps, workers=workers))
    seconds = time.perf_counter() - t
    key = "e_initial" if steps == 1 else "e_relaxed"
    groups: dict[str, list[tuple[float, int, dict]]] = defaultdict(list)
    for rec, res in zip(records, results):
        energy = res.get(key, float("inf")) if "error" not in res else float("inf")
        groups[str(rec["id"])].append((energy, int(rec["rank"]), rec))
    out = work / "energy.samples.jsonl"
    moved = 0
    with open(out, "w") as fh:
        for group in groups.values():
            for new_rank, (_, old_rank, rec) in enumerate(sorted(group, key=lambda g: (g[0], g[1])), 1):
                moved += new_rank == 1 and old_rank != 1
                fh.write(json.dumps({**rec, "rank": new_rank}) + "\n")
    return out, {"seconds": round(seconds, 1), "structures": len(items), "counts": counts,
                 "compositions": len(groups), "top_changed": moved}


def metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())["metrics"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work", type=Path, help="a csp_match.py --work folder")
    ap.add_argument("--steps", type=int, default=1, help="FIRE steps before the energy is read (1: as written)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--stability", action="store_true", help="also relax the energy pick (logos evaluate --stability)")
    ap.add_argument("--out", type=Path, help="JSON with the numbers")
    args = ap.parse_args()

    ranked, cost = rerank(args.work, args.steps, args.workers)
    reference = args.work / "reference.csv"
    rows = {}
    for name, predictions in (("likelihood", args.work / "out.samples.jsonl"), ("energy", ranked)):
        folder = args.work / f"rank_{name}"
        logos("evaluate", "--task", "csp", "--predictions", predictions, "--references", reference, "-o", folder)
        rows[name] = {k: v for k, v in metrics(folder).items() if k.startswith(("match_rate", "rmse"))}
    if args.stability:
        folder = args.work / "rank_energy" / "stability"
        logos("evaluate", "--task", "csp", "--predictions", ranked, "--references", reference, "--stability",
              "--workers", args.workers, "-o", folder)
        rows["energy"].update(metrics(folder))
        if (args.work / "stability" / "metrics.json").is_file():
            rows["likelihood"].update(metrics(args.work / "stability"))
    keys = ["match_rate@1", "rmse@1", "stable", "metastable", "e_hull", "rmsd"]
    print("| pick | " + " | ".join(keys) + " |\n|---|" + "---:|" * len(keys))
    for name, m in rows.items():
        print(f"| {name} | " + " | ".join("n/a" if m.get(k) is None else f"{m[k]:.4g}" for k in keys) + " |")
    print(f"energies: {cost['structures']} candidates of {cost['compositions']} compositions in {cost['seconds']} s "
          f"({cost['counts']}); the energy pick differs from the likelihood pick for {cost['top_changed']}")
    if args.out:
        args.out.write_text(json.dumps({"steps": args.steps, "cost": cost, "picks": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
