"""Reactions: reaction SMILES ``A.B>C>P`` <-> reactant spans ``<React>`` product spans (RDKit).

Canonical form: every component (split on '.') becomes its own molecule span holding its canonical
isomeric SMILES; atom maps are stripped unless ``--keep-atom-maps``; components are sorted within
each side so the same reaction always gives the same text. Agents (the middle field) are kept by
default after ``<Reagent>`` (``--drop-agents`` drops them). ``--retro`` writes the retrosynthesis
form: product spans ``<ReverseReact>`` reactant spans [``<Reagent>`` agent spans]. A CXSMILES
extension after whitespace (``|f:...|``) is ignored.

The detokenizer writes ``.rsmi``: ``reactants>agents>products<TAB>id`` with canonical SMILES.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Iterator

from rdkit import Chem

from logos.domains import molecule, textfiles
from logos.grammar import split_symbols
from logos.records import RecordError, WorkItem

NAME = "reaction"
REACT, RETRO, REAGENT = "<React>", "<ReverseReact>", "<Reagent>"
SUFFIXES = (".rsmi", ".rxn.smi", ".rxnsmi")
REACTION_COLUMNS = ("rxn", "reaction", "reaction_smiles", "rxn_smiles", "reactions", "smiles")

__all__ = ["parse_reaction", "reaction_text", "reaction_from_text", "looks_like_reaction"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("reactions")
    g.add_argument("--retro", action="store_true", help="write the retrosynthesis form (product <ReverseReact> reactants)")
    g.add_argument("--drop-agents", action="store_true", help="drop the agents field A>agents>P")
    g.add_argument("--keep-atom-maps", action="store_true", help="keep atom-map numbers (stripped by default)")


def options(args: argparse.Namespace) -> dict:
    return {
        "retro": args.retro,
        "drop_agents": args.drop_agents,
        "keep_atom_maps": args.keep_atom_maps,
        "column": args.column,
        "id_column": args.id_column,
        "kekule": args.kekule,
    }


def looks_like_reaction(value: str) -> bool:
    return len(re.findall(r"(?<!-)>", value)) == 2 and " " not in value.strip()


def claims(path: Path) -> bool:
    return path.name.lower().removesuffix(".gz").endswith(SUFFIXES)


def read(path: Path, opts: dict) -> Iterator[WorkItem]:
    if textfiles.is_table(path):
        yield from textfiles.iter_table(path, opts.get("column"), REACTION_COLUMNS, looks_like_reaction,
                                        id_column=opts.get("id_column"))
    else:
        for item in textfiles.iter_lines(path, header_names=REACTION_COLUMNS):
            if item.id and item.id.startswith("|"):  # a CXSMILES extension, not a name
                rest = item.id.split("|", 2)[-1].strip() if item.id.count("|") >= 2 else ""
                item.id = rest or None
            yield item


count = textfiles.count_records


def parse_reaction(rxn: str, opts: dict | None = None) -> tuple[list[str], list[str], list[str]]:
    """(reactants, agents, products) as sorted canonical SMILES; RecordError names the bad part."""
    opts = opts or {}
    rxn = rxn.strip().split()[0] if rxn.strip() else ""
    fields = re.split(r"(?<!-)>", rxn)  # a dative bond "->" is not a field separator
    if len(fields) != 3:
        raise RecordError(f"not a reaction SMILES (needs reactants>agents>products): {rxn[:80]!r}")
    sides = []
    for role, field in zip(("reactant", "agent", "product"), fields):
        smiles = []
        for k, part in enumerate(p for p in field.split(".") if p):
            try:
                mol = molecule.parse_smiles(part)
            except RecordError as e:
                raise RecordError(f"{role} {k + 1}: {e}") from None
            if not opts.get("keep_atom_maps"):
                for atom in mol.GetAtoms():
                    atom.SetAtomMapNum(0)
            smiles.append(molecule.canonical_smiles(mol, bool(opts.get("kekule"))))
        sides.append(sorted(smiles))
    reactants, agents, products = sides
    if not reactants:
        raise RecordError("reaction has no reactants")
    if not products:
        raise RecordError("reaction has no products")
    return reactants, agents, products


def reaction_text(reactants: list[str], agents: list[str], products: list[str], retro: bool = False) -> str:
    spans = lambda smiles: "".join(molecule.span(s) for s in smiles)  # noqa: E731
    agent_part = REAGENT + spans(agents) if agents else ""
    if retro:
        return spans(products) + RETRO + spans(reactants) + agent_part
    return spans(reactants) + agent_part + REACT + spans(products)


def encode(item: WorkItem, opts: dict) -> list[dict]:
    reactants, agents, products = parse_reaction(item.payload, opts)
    if opts.get("drop_agents"):
        agents = []
    rec = {"text": reaction_text(reactants, agents, products, bool(opts.get("retro"))), "domain": NAME,
           "source": item.source}
    if item.id:
        rec["id"] = item.id
    return [rec]


def reaction_from_text(text: str) -> tuple[list[str], list[str], list[str]]:
    """(reactants, agents, products) SMILES as written in a forward or retro reaction text."""
    groups: dict[str, list[str]] = {}
    current = "first"
    order = []
    for piece in split_symbols(text):
        if piece in (REACT, RETRO, REAGENT):
            current = piece
            order.append(piece)
        elif piece == molecule.OPEN or piece == molecule.CLOSE:
            continue
        else:
            groups.setdefault(current, []).append(piece)
    first = groups.get("first", [])
    if REACT in order:
        return first, groups.get(REAGENT, []), groups.get(REACT, [])
    if RETRO in order:
        return groups.get(RETRO, []), groups.get(REAGENT, []), first
    raise RecordError("not a reaction text: no <React> or <ReverseReact>")


class ReactionWriter:
    """``.rsmi``: ``reactants>agents>products<TAB>id`` with each component canonicalized by RDKit."""

    suffixes = (".rsmi",)

    def __init__(self, path: Path, args: argparse.Namespace | None = None):
        self._fh = open(path, "w", encoding="utf-8")

    def write(self, record: dict) -> int:
        sides = reaction_from_text(record["text"])
        fields = []
        for role, smiles in zip(("reactant", "agent", "product"), sides):
            canon = []
            for k, s in enumerate(smiles):
                try:
                    canon.append(Chem.MolToSmiles(molecule.parse_smiles(s)))
                except RecordError as e:
                    raise RecordError(f"{role} {k + 1}: {e}") from None
            fields.append(".".join(canon))
        if not fields[0] or not fields[2]:
            raise RecordError("reaction needs at least one reactant and one product")
        self._fh.write(">".join(fields) + "\t" + str(record.get("id") or record.get("source", "")) + "\n")
        return 1

    def close(self):
        self._fh.close()


WRITERS = (ReactionWriter,)
