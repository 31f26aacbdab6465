"""Evaluation reports: ``metrics.json``, ``report.md`` and PNG figures, with versions, definitions and digests.

Every report carries what is needed to compare it with another one: the package version and the
evaluator schema version of the task (bumped whenever a metric's definition changes), each metric's
definition and tolerances, and the sha256 digest of every input file (a folder's digest is that of
its files' names and digests, in sorted order). Figures are drawn with matplotlib's Agg backend.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Report", "sha256_of", "write_report", "histograms", "format_value"]


def sha256_of(path: Path) -> str:
    """sha256 of a file, or of a folder (names and digests of its files, sorted)."""
    path = Path(path)
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(f"{f.relative_to(path)}\0{sha256_of(f)}\n".encode())
        return h.hexdigest()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Report:
    """One evaluation: task, metrics (flat name -> number or None), definitions, inputs, extra tables."""

    task: str
    schema_version: int
    metrics: dict[str, Any]
    definitions: dict[str, str]
    inputs: dict[str, str] = field(default_factory=dict)  # role -> path (digests computed on writing)
    tables: dict[str, list[dict]] = field(default_factory=dict)  # e.g. per reaction class
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)  # what produced derived numbers (a potential, a cache)

    def as_dict(self) -> dict:
        from logos.util.version import VERSION as __version__

        return {
            "task": self.task,
            "evaluator": {"logos_version": __version__, "schema_version": self.schema_version,
                          "module": f"logos.evaluate ({self.task})"},
            "metrics": self.metrics,
            "definitions": self.definitions,
            "inputs": {role: {"path": str(p), "sha256": sha256_of(Path(p))} for role, p in self.inputs.items()},
            "tables": self.tables,
            "notes": self.notes,
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            **({"provenance": self.provenance} if self.provenance else {}),
        }


def format_value(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4f}"
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return "[" + ", ".join(format_value(v) for v in value) + "]"  # an interval
    return str(value)


def _markdown(doc: dict) -> str:
    ev = doc["evaluator"]
    lines = [f"# Evaluation: {doc['task']}", "",
             f"logos {ev['logos_version']}, evaluator schema {ev['schema_version']}", "",
             "| metric | value | definition |", "|---|---:|---|"]
    for name, value in doc["metrics"].items():
        lines.append(f"| {name} | {format_value(value)} | {doc['definitions'].get(name, '')} |")
    for title, rows in doc["tables"].items():
        if not rows:
            continue
        cols = list(rows[0])
        lines += ["", f"## {title}", "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(format_value(r.get(c)) for c in cols) + " |" for r in rows]
    if doc["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    if doc.get("provenance"):
        lines += ["", "## Provenance", "", "```json", json.dumps(doc["provenance"], indent=1), "```"]
    lines += ["", "## Inputs", "", "| role | file | sha256 |", "|---|---|---|"]
    lines += [f"| {role} | `{v['path']}` | `{v['sha256'][:16]}…` |" for role, v in doc["inputs"].items()]
    return "\n".join(lines) + "\n"


def write_report(report: Report, out_dir: Path, figures: dict[str, Any] | None = None) -> dict:
    """Write ``metrics.json`` and ``report.md`` (and each figure, a callable taking a path) into ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    doc = report.as_dict()
    written = []
    for name, draw in (figures or {}).items():
        path = out_dir / f"{name}.png"
        if draw(path):
            written.append(path.name)
    doc["figures"] = written
    (out_dir / "metrics.json").write_text(json.dumps(doc, indent=1, allow_nan=False, default=_json_default) + "\n")
    md = _markdown(doc) + "".join(f"\n![{n}]({n})\n" for n in written)
    (out_dir / "report.md").write_text(md)
    return doc


def _json_default(obj):
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def histograms(series: dict[str, tuple[list[float], list[float] | None]], title: str):
    """A figure callable: one histogram panel per property, generated against reference (when given)."""
    def draw(path: Path) -> bool:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np

        panels = [(k, g, r) for k, (g, r) in series.items() if len(g)]
        if not panels:
            return False
        fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False)
        for ax, (name, gen, ref) in zip(axes[0], panels):
            values = np.asarray(gen, dtype=float)
            both = values if ref is None or not len(ref) else np.concatenate([values, np.asarray(ref, float)])
            bins = np.histogram_bin_edges(both[np.isfinite(both)], bins=40)
            if ref is not None and len(ref):
                ax.hist(ref, bins=bins, density=True, alpha=0.5, label="reference", color="tab:gray")
            ax.hist(values, bins=bins, density=True, alpha=0.6, label="predictions", color="tab:blue")
            ax.set_title(name)
            ax.legend(fontsize=7)
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return True
    return draw
