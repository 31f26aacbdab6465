"""The shipped model's results table from a benchmarks/logos_tiny_eval.sh output folder: results.md and results.json.

Each row: the task, the set, the measured numbers (from the ``metrics.json`` of ``logos evaluate`` or the JSON of
the benchmark scripts), the target, and whether it is met. Rates carry 95% Wilson intervals where the count is
known.

    python benchmarks/logos_tiny_table.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from logos.evaluate.stats import wilson


def _metrics(out: Path, task: str) -> dict | None:
    path = out / task / "metrics.json"
    return json.loads(path.read_text())["metrics"] if path.exists() else None


def _json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _pct(x, n: int | None = None) -> str:
    if x is None:
        return "n/a"
    if n:
        lo, hi = wilson(round(x * n), n)
        return f"{100 * x:.1f}% ({100 * lo:.1f}-{100 * hi:.1f})"
    return f"{100 * x:.1f}%"


def _num(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}g}"


def rows(out: Path) -> list[dict]:
    table = []

    def add(task, dataset, measured, target, met):
        table.append({"task": task, "set": dataset, "measured": measured, "target": target,
                      "met": None if met is None else bool(met)})

    m = _metrics(out, "molecule")
    if m:
        n = m.get("n")
        add("molecules", f"{n} samples",
            f"valid {_pct(m.get('validity'), n)}, unique@1000 {_pct(m.get('unique@1000'))}, novel {_pct(m.get('novelty'))}, "
            f"FCD {_num(m.get('fcd'))}, filters {_pct(m.get('filters'))}",
            "valid >= 99%, unique >= 99%, novel >= 80%; FCD <= 5.26, filters >= 85.2% (tiny-moses)",
            (m.get("validity") or 0) >= .99 and (m.get("unique@1000") or 0) >= .99 and (m.get("novelty") or 0) >= .8
            and m.get("fcd") is not None and m["fcd"] <= 5.26 and (m.get("filters") or 0) >= .852)
    m = _metrics(out, "crystal")
    if m:
        n = m.get("n")
        add("crystals, unconditional", f"{n} samples",
            f"structurally valid {_pct(m.get('structural_validity'), n)}, SMACT-valid {_pct(m.get('compositional_validity'), n)}, "
            f"declared group found {_pct(m.get('space_group_consistency'), n)}, unique {_pct(m.get('uniqueness'))}, "
            f"novel {_pct(m.get('novelty'))}",
            "structural >= 95%, SMACT >= 80%, group >= 99%",
            (m.get("structural_validity") or 0) >= .95 and (m.get("compositional_validity") or 0) >= .8
            and (m.get("space_group_consistency") or 0) >= .99)
    r = _json(out / "csp" / "result.json")
    if r:
        n = r["items"]
        k = r["samples"]
        add("crystal structure prediction", f"Perov-5 test, seeded {n} x {k}",
            f"match@1 {_pct(r.get('match_rate@1'), n)}, match@{k} {_pct(r.get(f'match_rate@{k}'), n)}, "
            f"RMSE@1 {_num(r.get('rmse@1'))}, RMSE@{k} {_num(r.get(f'rmse@{k}'))}",
            "match@20 >= 90%", (r.get(f"match_rate@{k}") or 0) >= .9)
    m = _metrics(out, "mof")
    if m:
        n = m.get("n")
        add("MOFs", f"{n} samples", f"splits into node and RDKit-valid linkers {_pct(m.get('linkers_valid'), n)}; "
            f"stricter `logos evaluate` validity (node seen in training, >= 2 binding groups per linker) "
            f"{_pct(m.get('valid'), n)}: known node {_pct(m.get('node_known'))}, binding groups "
            f"{_pct(m.get('connections_ok'))}; unique {_pct(m.get('unique'))}, novel {_pct(m.get('novel'))}",
            ">= 80% split into node and RDKit-valid linkers", (m.get("linkers_valid") or 0) >= .8)
    m = _metrics(out, "protein")
    if m:
        add("proteins", f"{m.get('n')} samples",
            f"unique {_pct(m.get('uniqueness'))}, length mean {_num(m.get('length_mean'))} (W1 to the reference "
            f"{_num(m.get('length_w1'))}), amino-acid JS divergence {_num(m.get('aa_js_divergence'))}, "
            f"max identity to the reference {_pct(m.get('identity_max'))}", "reported", None)
    m = _metrics(out, "pocket")
    if m:
        add("pockets", f"PoseBusters complexes ({m.get('structures')})",
            f"precision {_pct(m.get('precision'))}, recall {_pct(m.get('recall'))}, DCC {_pct(m.get('dcc'))}, "
            f"DCA {_pct(m.get('dca'))}", "reported", None)
    r = _json(out / "retro" / "result.json")
    if r:
        n = r["items"]
        add("retrosynthesis", f"USPTO-50k test, seeded {n}, {r['samples']} samples each",
            ", ".join(f"top-{k} {_pct(r.get(f'top{k}'), n)}" for k in (1, 3, 5, 10))
            + f"; invalid top-1 {_pct(r.get('invalid_top1'))}", "reported", None)
    return table


def main() -> int:
    out = Path(sys.argv[1])
    table = rows(out)
    lines = ["| task | set | measured (95% interval) | target | met |", "|---|---|---|---|---|"]
    for row in table:
        met = {None: "-", True: "yes", False: "**no**"}[row["met"]]
        lines.append(f"| {row['task']} | {row['set']} | {row['measured']} | {row['target']} | {met} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(table, indent=1) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
