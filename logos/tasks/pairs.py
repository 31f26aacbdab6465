"""Finetuning data: prompt -> completion pairs in the grammar, built from the files each task's users have.

The registry (:mod:`logos.tasks.registry`) names each task's builder; :func:`logos.tasks.build_pairs`
runs it over a task's sources. Every builder yields records ``{"id", "prompt", "completion", "domain": TASK, "group"}``: ``logos pack``
turns them into shards whose loss mask starts at the completion's first token (the end-of-sequence
token after it is trained too, so the model learns to stop), and whose ``domain`` is the *task*, so a
multitask recipe's ``train.mixture`` sets exact proportions per task. ``group`` keeps every variant of
one item (augmented SMILES of one reaction, one crystal's settings) on the same side of the split.

Formats (the prompts :mod:`logos.generate` writes for the same task, so a finetuned model is used
with ``logos generate --task T`` unchanged):

- ``retro``: ``<MoleculeS>product<MoleculeE><ReverseReact>`` -> reactant spans (sorted canonical;
  randomized SMILES under ``augment``);
- ``forward``: reactant spans ``<React>`` -> product spans;
- ``csp`` (crystal structure prediction): the crystal text cut after its composition header (and
  space group, with ``with_space_group``) -> the rest of the crystal;
- ``split`` (pocket search, ligand design, MOFs, any ``logos tokenize`` output): a record's ``text``
  cut after the first occurrence of a marker (``<Search>``; the ligand's ``<MoleculeS>``; a MOF's
  ``<MetalE>``), the marker staying in the prompt;
- ``pairs``: a JSONL of ``{"prompt", "completion"}`` (the convention of TRL's SFT trainer).

Reaction inputs: ``.rsmi`` (one reaction SMILES per line, optional id) and USPTO-style CSV
(``id,class,reactants>reagents>production``, atom-mapped: maps removed). Reagents are dropped from the
retro completion (the USPTO-50k benchmark predicts reactants only).
"""

from __future__ import annotations

import csv
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from logos.util.records import InputError, RecordError, open_text

__all__ = ["PairOptions", "reaction_pairs", "split_pairs", "jsonl_pairs", "csp_pairs", "read_reactions"]


@dataclass(frozen=True)
class PairOptions:
    """How a builder reads its sources (the ``finetune`` section of a recipe)."""

    task: str
    augment: int = 0
    """Randomized-SMILES variants per reaction besides the canonical one (reactions only)."""
    augment_side: str = "both"
    """Which side of a reaction pair a variant randomizes: ``both`` (reactants shuffled too), or ``prompt`` (the
    completion stays canonical, so each reaction keeps one target string)."""
    seed: int = 0
    marker: str | None = None
    """``split`` builders: the symbol after which the completion starts (default: the task's ``marker``)."""
    with_space_group: bool = False
    """``csp``: the prompt also gives the space group."""


def read_reactions(path: Path) -> Iterator[tuple[str, str, str | None]]:
    """(id, reaction SMILES, class) of an ``.rsmi`` or USPTO-style CSV file."""
    with open_text(path) as fh:
        if path.name.endswith((".csv", ".csv.xz", ".csv.gz")):
            reader = csv.DictReader(fh)
            column = next((c for c in reader.fieldnames or [] if ">" in c or "rxn" in c.lower()), None)
            if column is None:
                raise InputError(f"{path}: no reaction column (expected e.g. 'reactants>reagents>production')")
            for n, row in enumerate(reader, 2):
                yield row.get("id") or f"line{n}", row[column], row.get("class")
        else:
            for n, line in enumerate(fh, 1):
                fields = line.split()
                if fields:
                    yield (fields[1] if len(fields) > 1 else f"line{n}"), fields[0], None


def _random_smiles(smiles: str, rng: random.Random) -> str:
    from rdkit import Chem

    mol = Chem.MolFromSmiles(smiles)
    atoms = list(range(mol.GetNumAtoms()))
    rng.shuffle(atoms)
    return Chem.MolToSmiles(Chem.RenumberAtoms(mol, atoms), canonical=False)


def reaction_pairs(path: Path, options: PairOptions, errors) -> Iterator[dict]:
    """Retro or forward pairs of every reaction in ``path`` (+ ``augment`` randomized variants each)."""
    from logos.science.chemistry import span
    from logos.domains.reaction import REACT, RETRO, parse_reaction

    rng = random.Random(options.seed)
    for ident, rxn, klass in read_reactions(path):
        try:
            reactants, _, products = parse_reaction(rxn)
        except RecordError as e:
            errors.add(f"{path}:{ident}", str(e))
            continue
        group = ".".join(products)
        for variant in range(1 + options.augment):
            reactants_v, products_v = reactants, products
            if variant:
                randomize_reactants = options.augment_side == "both" or options.task == "forward"
                randomize_products = options.augment_side == "both" or options.task == "retro"
                if randomize_reactants:
                    reactants_v = [_random_smiles(s, rng) for s in reactants]
                    rng.shuffle(reactants_v)
                if randomize_products:
                    products_v = [_random_smiles(s, rng) for s in products]
            r, p = "".join(map(span, reactants_v)), "".join(map(span, products_v))
            prompt, completion = (p + RETRO, r) if options.task == "retro" else (r + REACT, p)
            yield {"id": f"{ident}#{variant}" if variant else ident, "prompt": prompt, "completion": completion,
                   "domain": options.task, "group": group, **({"class": klass} if klass else {})}


def split_pairs(path: Path, options: PairOptions, errors) -> Iterator[dict]:
    """Records of ``logos tokenize`` output cut after the task's marker."""
    marker = options.marker
    if not marker:
        raise InputError(f"task {options.task!r} needs a marker to split records at (finetune.marker)")
    for n, rec in enumerate(_jsonl(path), 1):
        text = rec.get("text", "")
        cut = text.find(marker)
        if cut < 0 or cut + len(marker) >= len(text):
            errors.add(f"{path}:{rec.get('id', n)}", f"no {marker} with a completion after it")
            continue
        cut += len(marker)
        yield {"id": rec.get("id", f"line{n}"), "prompt": text[:cut], "completion": text[cut:],
               "domain": options.task, "group": rec.get("group") or rec.get("id") or text[:cut]}


def jsonl_pairs(path: Path, options: PairOptions, errors) -> Iterator[dict]:
    """A ``{"prompt", "completion"}`` JSONL, checked for strings."""
    for n, rec in enumerate(_jsonl(path), 1):
        if not isinstance(rec.get("prompt"), str) or not isinstance(rec.get("completion"), str) \
                or not rec["completion"]:
            errors.add(f"{path}:{n}", "needs string 'prompt' and non-empty 'completion'")
            continue
        yield {"id": rec.get("id", f"line{n}"), "prompt": rec["prompt"], "completion": rec["completion"],
               "domain": rec.get("task") or options.task, "group": rec.get("group") or rec["prompt"]}


def csp_pairs(path: Path, options: PairOptions, errors) -> Iterator[dict]:
    """Composition (+ space group) -> crystal, from CIFs or a CDVAE CSV (``cif`` column) via the crystal encoder."""
    from logos.tasks.crystal_pairs import csp_records

    yield from csp_records(path, options, errors)


def _jsonl(path: Path) -> Iterator[dict]:
    with open_text(path) as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise InputError(f"{path}:{n}: not JSON ({e.msg})") from None
                if isinstance(rec, dict) and "format" in rec and "text" not in rec and "prompt" not in rec:
                    continue  # a logos header line
                yield rec
