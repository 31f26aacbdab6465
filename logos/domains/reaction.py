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

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from logos.domains import molecule, textfiles
from logos.domains.base import Domain, TextWriter, option
from logos.language.grammar import split_symbols
from logos.science.chemistry import canonical_smiles
from logos.util.records import RecordError, WorkItem, plain_name

NAME = "reaction"
REACT, RETRO, REAGENT = "<React>", "<ReverseReact>", "<Reagent>"
SUFFIXES = (".rsmi", ".rxn.smi", ".rxnsmi")
REACTION_COLUMNS = ("rxn", "reaction", "reaction_smiles", "rxn_smiles", "reactions", "smiles")

__all__ = ["ReactionDomain", "ReactionOptions", "parse_reaction", "reaction_text", "reaction_from_text",
           "looks_like_reaction"]


@dataclass(frozen=True)
class ReactionOptions(molecule.SmilesTableOptions):
    """Options of the reaction encoder (column, id column and kekule are shared with molecules)."""

    retro: bool = option(False, "write the retrosynthesis form (product <ReverseReact> reactants)")
    drop_agents: bool = option(False, "drop the agents field A>agents>P")
    keep_atom_maps: bool = option(False, "keep atom-map numbers (stripped by default)")


def looks_like_reaction(value: str) -> bool:
    return len(re.findall(r"(?<!-)>", value)) == 2 and " " not in value.strip()


def parse_reaction(rxn: str, keep_atom_maps: bool = False, kekule: bool = False
                   ) -> tuple[list[str], list[str], list[str]]:
    """(reactants, agents, products) as sorted canonical SMILES; RecordError names the bad part."""
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
            if not keep_atom_maps:
                for atom in mol.GetAtoms():
                    atom.SetAtomMapNum(0)
            smiles.append(molecule.canonical_smiles(mol, kekule))
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


def reaction_from_text(text: str) -> tuple[list[str], list[str], list[str]]:
    """(reactants, agents, products) SMILES as written in a forward or retro reaction text.

    Every molecule must be a closed ``<MoleculeS>SMILES<MoleculeE>`` span (a sample cut off inside a
    span is not a reaction).
    """
    groups: dict[str, list[str]] = {}
    current, order, inside = "first", [], None  # inside: None outside a span, else the span's SMILES so far
    for piece in split_symbols(text):
        if piece == molecule.OPEN:
            if inside is not None:
                raise RecordError(f"{molecule.OPEN} inside an unclosed molecule span")
            inside = ""
        elif piece == molecule.CLOSE:
            if not inside:
                raise RecordError(f"empty or unopened molecule span before {molecule.CLOSE}")
            groups.setdefault(current, []).append(inside)
            inside = None
        elif inside is not None:
            if piece.startswith("<") and piece.endswith(">") and piece in (REACT, RETRO, REAGENT):
                raise RecordError(f"{piece} inside an unclosed molecule span")
            inside += piece
        elif piece in (REACT, RETRO, REAGENT):
            current = piece
            order.append(piece)
        elif piece.strip():
            raise RecordError(f"text outside a molecule span: {piece[:40]!r}")
    if inside is not None:
        raise RecordError(f"unclosed {molecule.OPEN} span at the end of the text")
    first = groups.get("first", [])
    if REACT in order:
        return first, groups.get(REAGENT, []), groups.get(REACT, [])
    if RETRO in order:
        return groups.get(RETRO, []), groups.get(REAGENT, []), first
    raise RecordError("not a reaction text: no <React> or <ReverseReact>")


class ReactionWriter(TextWriter):
    """``.rsmi``: ``reactants>agents>products<TAB>id`` with each component canonicalized by RDKit."""

    suffixes = (".rsmi",)

    def write(self, record: dict) -> int:
        sides = reaction_from_text(record["text"])
        fields = []
        for role, smiles in zip(("reactant", "agent", "product"), sides):
            canon = []
            for k, s in enumerate(smiles):
                try:
                    canon.append(canonical_smiles(molecule.parse_smiles(s)))
                except RecordError as e:
                    raise RecordError(f"{role} {k + 1}: {e}") from None
            fields.append(".".join(canon))
        if not fields[0] or not fields[2]:
            raise RecordError("reaction needs at least one reactant and one product")
        self.fh.write(">".join(fields) + "\t" + self.ident(record) + "\n")
        return 1


class ReactionDomain(Domain):
    """Reaction SMILES (``.rsmi``, or SMILES/CSV files whose values are reactions)."""

    name = NAME
    options_type = ReactionOptions
    writers = (ReactionWriter,)
    help_title = "molecules and reactions (SMILES, CSV, SDF, reaction SMILES)"

    def claims(self, path: Path) -> bool:
        return plain_name(path).endswith(SUFFIXES)

    def read(self, path: Path, opts: ReactionOptions) -> Iterator[WorkItem]:
        if textfiles.is_table(path):
            yield from textfiles.iter_table(path, opts.column, REACTION_COLUMNS, looks_like_reaction,
                                            id_column=opts.id_column)
            return
        for item in textfiles.iter_lines(path, header_names=REACTION_COLUMNS):
            if item.id and item.id.startswith("|"):  # a CXSMILES extension, not a name
                rest = item.id.split("|", 2)[-1].strip() if item.id.count("|") >= 2 else ""
                item.id = rest or None
            yield item

    def count(self, path: Path) -> int:
        return textfiles.count_records(path)

    def encode(self, item: WorkItem, opts: ReactionOptions) -> list[dict]:
        if not item.payload.isascii():  # RDKit's wrapper fails on non-ASCII with a SystemError
            raise RecordError("reaction SMILES has non-ASCII characters")
        reactants, agents, products = parse_reaction(item.payload, opts.keep_atom_maps, opts.kekule)
        if opts.drop_agents:
            agents = []
        rec = {"text": reaction_text(reactants, agents, products, opts.retro), "domain": NAME, "source": item.source}
        if item.id:
            rec["id"] = item.id
        return [rec]
