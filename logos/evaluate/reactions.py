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

The reference is USPTO-50k's CSV (``id,class,reactants>reagents>production``). Predictions find their
reaction by what they answer, in this order:

1. the canonical input they carry (the product for retro, the reactants for forward), so files from
   other generators need no renumbering; when several reference reactions share that input, the
   prediction's id picks among them (else the first one not yet answered);
2. else the id: a reaction's 1-based row number, or the CSV's ``id`` column where that id names one row
   only. USPTO-50k's patent ids repeat (4,182 distinct ids for the 5,001 test reactions): an id that
   names several rows, on a prediction that carries no input, is refused (one line naming the id and
   the rows) rather than scored against whichever product comes first.
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
           "read_predictions", "match", "evaluate", "contamination"]

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
    id: str  # 1-based row number in the reference file
    cls: str
    reactants: str  # canonical set
    product: str  # canonical set
    name: str = ""  # the file's own id (USPTO-50k: a patent number, not unique)


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
            id_col = header.index("id") if "id" in header else None
            items = ((str(i), r[cls_col] if cls_col is not None else "", r[col], r[id_col] if id_col is not None else "")
                     for i, r in enumerate(rows, 1))
        else:
            items = ((str(i), "", f[0], f[1] if len(f) > 1 else "")
                     for i, f in ((i, line.split()) for i, line in enumerate(fh, 1)) if f)
        for ident, cls, rxn, name in items:
            if limit and len(out) >= limit:
                break
            sides = rxn.split(">")
            if len(sides) != 3:
                raise InputError(f"{path}:{ident}: not a reaction SMILES (A>B>C): {rxn[:60]!r}")
            r, p = canonical_set(sides[0]), canonical_set(sides[2])
            if r is None or p is None:
                raise InputError(f"{path}:{ident}: RDKit cannot parse the reaction {rxn[:60]!r}")
            out.append(Reaction(ident, cls, r, p, name))
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


def match(reference: list[Reaction], predictions: dict[str, list[tuple[str | None, str | None]]],
          task: str = "retro", source: str = "predictions") -> dict[str, list[tuple[str | None, str | None]]]:
    """Reference row id -> the ranked answers meant for it (see the module docstring for the order of keys)."""
    retro = task == "retro"
    by_row = {rx.id: rx for rx in reference}
    by_name: dict[str, list[Reaction]] = defaultdict(list)
    by_input: dict[str, list[Reaction]] = defaultdict(list)
    for rx in reference:
        if rx.name:
            by_name[rx.name].append(rx)
        by_input[rx.product if retro else rx.reactants].append(rx)
    out: dict[str, list[tuple[str | None, str | None]]] = {}
    for ident, answers in predictions.items():
        src = next((s for _, s in answers if s), None)
        key = canonical_set(src) if src else None
        if key is not None:
            same = [rx for rx in by_input.get(key, []) if rx.id not in out]
            chosen = next((rx for rx in same if ident in (rx.id, rx.name)), same[0] if same else None)
            if chosen is not None:
                out[chosen.id] = answers
            continue
        if ident in by_row:
            out.setdefault(ident, answers)
            continue
        named = by_name.get(ident, [])
        if len(named) > 1:
            rows = ", ".join(rx.id for rx in named[:5]) + (", ..." if len(named) > 5 else "")
            raise InputError(f"{source}: id {ident!r} names {len(named)} reference reactions (rows {rows}) and the "
                             "prediction carries no input: use row numbers as ids, or give the input")
        if named:
            out.setdefault(named[0].id, answers)
    return out


def evaluate(reference: list[Reaction], predictions: dict[str, list[tuple[str | None, str | None]]],
             options: ReactionOptions = ReactionOptions(), source: str = "predictions") -> tuple[dict, list[dict]]:
    """(metrics, per-class rows) of ranked predictions against the reference reactions."""
    retro = options.task == "retro"
    matched = match(reference, predictions, options.task, source)
    hits = {k: 0 for k in options.ks}
    per_class: dict[str, dict] = defaultdict(lambda: {"n": 0, **{k: 0 for k in options.ks}})
    invalid1 = given = invalid_all = answered = 0
    for rx in reference:
        target = rx.reactants if retro else rx.product
        answers = matched.get(rx.id, [])
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
