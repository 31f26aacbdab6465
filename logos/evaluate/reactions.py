"""Reaction prediction metrics (retro and forward): top-k exact match, invalid rate, per reaction class.

Definitions (as LOGOS, Chemformer and the USPTO-50k literature report them):

- an answer matches when its canonical molecule set equals the ground truth's: atom maps removed,
  the SMILES split on ``.``, each molecule canonicalized by RDKit (isomeric), the set sorted and
  joined; for ``retro`` the reactants are compared, for ``forward`` the products;
- ``top-k``: share of test reactions whose answers ranked 1..k (ranks as given; an invalid answer
  keeps its slot) include a match; a reaction with no answers counts as a miss;
- ``invalid@1``: share of top-1 answers RDKit cannot parse (or missing); ``invalid_all``: share
  of all answers given that RDKit cannot parse;
- per class: the same top-k for each ``class`` of the reference (USPTO-50k's 10 reaction types).

Ranked-answers format (read by :func:`read_predictions`; ``logos generate`` writes the last two):

- JSONL ``{"id": ID, "answers": [SMILES, ...]}``, best first (the documented format);
- JSONL ``{"id": ID, "rank": R, "text": GRAMMAR_TEXT}`` (``OUT.samples.jsonl`` of generation);
- ``.rsmi`` lines ``reactants>agents>products<TAB>ID#R`` (``#R`` optional: file order is rank order).

The reference is USPTO-50k's CSV (``id,class,reactants>reagents>production``): a reaction's id is
its 1-based row number (the patent numbers in the ``id`` column repeat: 582 do in the test split).
A prediction id that is not a row number is matched by the canonical input instead (the product for
retro, the reactants for forward), so files from other generators need no renumbering.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from logos.science.chemistry import canonical_set, molecules_in_text
from logos.evaluate.reference import jsonl_records, open_any
from logos.util.records import InputError, RecordError, plain_name

__all__ = ["ReactionOptions", "Reaction", "SCHEMA_VERSION", "DEFINITIONS", "canonical_set", "read_reference",
           "read_predictions", "evaluate", "contamination"]

SCHEMA_VERSION = 1
DEFINITIONS = {
    "n": "test reactions",
    "invalid@1": "share of top-1 answers RDKit cannot parse (or missing)",
    "invalid_all": "share of all given answers RDKit cannot parse",
    "answered": "share of test reactions with at least one answer",
    "test_in_train": "test reactions whose canonical reaction occurs in the training set",
}
for _k in (1, 3, 5, 10):
    DEFINITIONS[f"top-{_k}"] = f"share of test reactions with an exact canonical match among the first {_k} answers"


@dataclass(frozen=True)
class ReactionOptions:
    task: str = "retro"  # retro: compare reactants; forward: compare products
    ks: tuple[int, ...] = (1, 3, 5, 10)


@dataclass
class Reaction:
    id: str
    cls: str
    reactants: str  # canonical set
    product: str  # canonical set


def read_reference(path: Path, limit: int | None = None) -> list[Reaction]:
    """USPTO-style CSV (``id,class,rxn``) or ``.rsmi`` (``rxn [id]``): reactions with canonical sides."""
    path = Path(path)
    out = []
    with open_any(path) as fh:
        if plain_name(path).endswith(".csv"):
            rows = csv.reader(fh)
            header = next(rows, [])
            col = next((i for i, h in enumerate(header) if ">" in h or "rxn" in h.lower() or "reaction" in h.lower()), None)
            if col is None:
                raise InputError(f"{path}: no reaction column in the header {header}")
            cls_col = header.index("class") if "class" in header else None
            items = ((str(i), r[cls_col] if cls_col is not None else "", r[col]) for i, r in enumerate(rows, 1))
        else:
            items = ((str(i), "", line.split()[0]) for i, line in enumerate(fh, 1) if line.strip())
        for ident, cls, rxn in items:
            if limit and len(out) >= limit:
                break
            sides = rxn.split(">")
            if len(sides) != 3:
                raise InputError(f"{path}:{ident}: not a reaction SMILES (A>B>C): {rxn[:60]!r}")
            r, p = canonical_set(sides[0]), canonical_set(sides[2])
            if r is None or p is None:
                raise InputError(f"{path}:{ident}: RDKit cannot parse the reaction {rxn[:60]!r}")
            out.append(Reaction(ident, cls, r, p))
    return out


def _rank_of(ident: str) -> tuple[str, int | None]:
    base, sep, rank = ident.rpartition("#")
    return (base, int(rank)) if sep and rank.isdigit() else (ident, None)


def read_predictions(path: Path, task: str = "retro") -> dict[str, list[tuple[str | None, str | None]]]:
    """id -> ranked answers as (answer SMILES, input SMILES or None); see the module docstring for formats."""
    path = Path(path)
    ranked: dict[str, list[tuple[int, str | None, str | None]]] = defaultdict(list)
    if plain_name(path).endswith(".jsonl"):
        for lineno, rec in jsonl_records(path):
            if "id" not in rec:
                raise InputError(f"{path}:{lineno}: record has no 'id'")
            ident = str(rec["id"])
            if "answers" in rec:
                for r, a in enumerate(rec["answers"], 1):
                    ranked[ident].append((r, a, rec.get("input")))
            else:
                answer, source = _from_text(rec.get("text", ""), task)
                ranked[ident].append((int(rec.get("rank", len(ranked[ident]) + 1)), answer, source))
    else:
        with open_any(path) as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                fields = line.rstrip("\n").split("\t") if "\t" in line else line.split()
                ident, rank = _rank_of(fields[1] if len(fields) > 1 else str(lineno))
                sides = fields[0].split(">")
                if len(sides) != 3:
                    ranked[ident].append((rank or len(ranked[ident]) + 1, None, None))
                    continue
                answer, source = (sides[0], sides[2]) if task == "retro" else (sides[2], sides[0])
                ranked[ident].append((rank or len(ranked[ident]) + 1, answer, source))
    return {k: [(a, s) for _, a, s in sorted(v, key=lambda t: t[0])] for k, v in ranked.items()}


def _from_text(text: str, task: str) -> tuple[str | None, str | None]:
    """(answer, input) SMILES of a reaction grammar text (retro: ``P <ReverseReact> A B``)."""
    try:
        if "<ReverseReact>" in text:
            before, after = text.split("<ReverseReact>", 1)
            return ".".join(molecules_in_text(after)) or None, ".".join(molecules_in_text(before)) or None
        before, _, after = text.partition("<React>")
        return ".".join(molecules_in_text(after)) or None, ".".join(molecules_in_text(before)) or None
    except RecordError:
        return None, None


def evaluate(reference: list[Reaction], predictions: dict[str, list[tuple[str | None, str | None]]],
             options: ReactionOptions = ReactionOptions()) -> tuple[dict, list[dict]]:
    """(metrics, per-class rows) of ranked predictions against the reference reactions."""
    retro = options.task == "retro"
    by_input: dict[str, list[tuple[str | None, str | None]]] = {}
    for answers in predictions.values():
        src = next((s for _, s in answers if s), None)
        key = canonical_set(src) if src else None
        if key:
            by_input.setdefault(key, answers)
    hits = {k: 0 for k in options.ks}
    per_class: dict[str, dict] = defaultdict(lambda: {"n": 0, **{k: 0 for k in options.ks}})
    invalid1 = given = invalid_all = answered = 0
    for rx in reference:
        target = rx.reactants if retro else rx.product
        answers = predictions.get(rx.id) or by_input.get(rx.product if retro else rx.reactants) or []
        canon = [canonical_set(a) if a else None for a, _ in answers]
        answered += bool(answers)
        given += len(canon)
        invalid_all += sum(c is None for c in canon)
        invalid1 += not canon or canon[0] is None
        first = next((i for i, c in enumerate(canon) if c == target), None)
        row = per_class[rx.cls or "all"]
        row["n"] += 1
        for k in options.ks:
            if first is not None and first < k:
                hits[k] += 1
                row[k] += 1
    n = len(reference)
    metrics: dict = {"n": n}
    metrics.update({f"top-{k}": hits[k] / n if n else None for k in options.ks})
    metrics.update({"invalid@1": invalid1 / n if n else None, "invalid_all": invalid_all / given if given else None,
                    "answered": answered / n if n else None})
    rows = [{"class": c, "n": r["n"], **{f"top-{k}": r[k] / r["n"] for k in options.ks}}
            for c, r in sorted(per_class.items(), key=lambda t: (len(t[0]), t[0]))]
    return metrics, rows


def contamination(reference: list[Reaction], train_path: Path) -> int:
    """Test reactions whose canonical (reactants, product) pair occurs in a training reaction file."""
    train = {(r.reactants, r.product) for r in read_reference(train_path)}
    return sum((r.reactants, r.product) in train for r in reference)
