"""The table of ``benchmarks/stability_rescore.sh``: stability metrics (with 95% intervals) and relaxation cost.

    python benchmarks/stability_summary.py OUT     (OUT: the rescoring's output folder)

For each of ``OUT/crystal`` and ``OUT/csp/stability`` (reports of ``logos evaluate --stability``): structures,
relaxed, converged, stable / metastable / S.U.N. rates, mean energy above the hull, mean RMSD, and the relaxation
cost per structure (wall seconds of the relaxations that ran, over the structures; cached ones cost nothing).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _ci(m: dict, key: str, pct: bool = True) -> str:
    v, ci = m.get(key), m.get(f"{key}_ci95")
    if v is None:
        return "n/a"
    f = (lambda x: f"{100 * x:.1f}%") if pct else (lambda x: f"{x:.3f}")
    return f"{f(v)} [{f(ci[0])}, {f(ci[1])}]" if ci else f(v)


def summary(folder: Path) -> str | None:
    path = folder / "metrics.json"
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    m, rows = doc["metrics"], doc["tables"].get("stability per structure", [])
    prov = doc.get("provenance", {}).get("stability", {})
    ran = [r["seconds"] for r in rows if r.get("seconds") is not None]
    per = prov.get("seconds", 0) / max(1, len(rows))
    return (f"| {folder.name} | {len(rows)} | {m.get('relaxed')} | {_ci(m, 'converged')} | {_ci(m, 'stable')} | "
            f"{_ci(m, 'metastable')} | {_ci(m, 'sun')} | {_ci(m, 'e_hull', False)} | {_ci(m, 'rmsd', False)} | "
            f"{sum(ran) / max(1, len(ran)):.1f} | {per:.1f} | {prov.get('known_phases')} |")


def main(out: Path) -> int:
    lines = ["| set | structures | relaxed | converged | stable | metastable | S.U.N. | E_hull (eV/atom) | RMSD (A) | "
             "s per relaxation | s per structure (all, wall) | known phases |", "|" + "---|" * 12]
    for folder in (out / "crystal", out / "csp" / "stability"):
        row = summary(folder)
        if row:
            lines.append(row)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "bench_stability")))
