"""Molecules: SMILES/CSV/SDF files <-> ``<MoleculeS>canonical isomeric SMILES<MoleculeE>`` (RDKit).

Canonical form: RDKit canonical isomeric SMILES of the sanitized molecule with explicit hydrogens
removed (SDF hydrogens are folded into their heavy atoms). ``--kekule`` writes the kekulized
canonical SMILES instead; ``--augment N`` adds N distinct randomized SMILES of the same molecule
per record (seeded by the record's source, so reruns give the same text).

The detokenizer parses every molecule span with RDKit and writes ``.smi`` (canonical SMILES and
id) or ``.sdf`` (2D depiction, or a 3D conformer with ``--3d``: ETKDGv3 + MMFF, hydrogens added).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rdkit import Chem
from rdkit.Chem import AllChem, rdDepictor

from logos.science.chemistry import (CLOSE, OPEN, canonical_smiles, is_smiles, molecules_in_text, parse_molblock,  # noqa: F401
                        parse_smiles, span)
from logos.domains import textfiles
from logos.domains.base import Domain, DomainOptions, TextWriter, Writer, option
from logos.util.records import RecordError, WorkItem, open_text, plain_name

NAME = "molecule"
LINE_SUFFIXES = (".smi", ".smiles", ".txt", ".csv", ".tsv")
SDF_SUFFIXES = (".sdf", ".mol", ".sd")
SMILES_COLUMNS = ("smiles", "canonical_smiles", "isomeric_smiles", "smi", "mol", "molecule")

__all__ = ["MoleculeDomain", "MoleculeOptions", "SmilesTableOptions", "encode_mol", "record_molecules", "embed_3d"]


# ---------------------------------------------------------------- encoder
@dataclass(frozen=True)
class SmilesTableOptions(DomainOptions):
    """Options shared by the SMILES-based encoders (molecules and reactions)."""

    column: str | None = option(None, "CSV/TSV column holding SMILES or reaction SMILES (default: detected)")
    id_column: str | None = option(None, "CSV/TSV column holding the record id (default: id/name/... if present)")
    kekule: bool = option(False, "write kekulized SMILES instead of aromatic")


@dataclass(frozen=True)
class MoleculeOptions(SmilesTableOptions):
    """Options of the molecule encoder."""

    augment: int = option(0, "also write N randomized SMILES per molecule (seeded by the record's source)",
                          metavar="N")

    def __post_init__(self):
        if self.augment < 0:
            raise ValueError("augment must be >= 0")


def _read_sdf(path: Path) -> Iterator[WorkItem]:
    """SDF records as mol-block strings (parsed in the workers); the title line is the id."""
    with open_text(path) as fh:
        block: list[str] = []
        index = 0
        for line in fh:
            if line.startswith("$$$$"):
                index += 1
                yield _sdf_item(path, index, block)
                block = []
            else:
                block.append(line)
        if any(l.strip() for l in block):  # last record without a $$$$ terminator (.mol files)
            index += 1
            yield _sdf_item(path, index, block)


def _sdf_item(path: Path, index: int, lines: list[str]) -> WorkItem:
    source = f"{path}:{index}"
    if not any(l.strip() for l in lines):
        return WorkItem(source, None, extra={"error": "empty SDF record"})
    title = lines[0].strip() or None
    return WorkItem(source, "".join(lines), id=title, extra={"sdf": True})


def encode_mol(mol: Chem.Mol, opts: MoleculeOptions, seed_key: str = "") -> list[str]:
    """The grammar texts of one molecule: canonical first, then ``augment`` randomized variants."""
    kekule = opts.kekule
    texts = [span(canonical_smiles(mol, kekule))]
    n = opts.augment
    if n > 0:
        base = Chem.Mol(mol)
        if kekule:
            Chem.Kekulize(base, clearAromaticFlags=True)
        seed = zlib.crc32(seed_key.encode()) & 0x7FFFFFFF
        seen = {texts[0]}
        # Ask for more than needed: small molecules have few distinct random SMILES.
        for smi in Chem.MolToRandomSmilesVect(base, 4 * n + 4, randomSeed=seed, isomericSmiles=True,
                                              kekuleSmiles=kekule):
            t = span(smi)
            if t not in seen:
                seen.add(t)
                texts.append(t)
            if len(texts) == n + 1:
                break
    return texts


# ---------------------------------------------------------------- detokenizer
class SmilesWriter(TextWriter):
    """``.smi``: one line per molecule span, ``canonical_SMILES<TAB>id``."""

    suffixes = (".smi",)

    def write(self, record: dict) -> int:
        mols = record_molecules(record)
        ident = self.ident(record)
        for i, mol in enumerate(mols):
            name = ident if len(mols) == 1 else f"{ident}#{i + 1}"
            self.fh.write(f"{Chem.MolToSmiles(mol)}\t{name}\n")
        return len(mols)


class SdfWriter(Writer):
    """``.sdf``: one entry per molecule span with 2D coordinates, or a 3D conformer (``--3d``)."""

    suffixes = (".sdf",)

    def open(self) -> None:
        self._writer = Chem.SDWriter(str(self.path))

    def write(self, record: dict) -> int:
        mols = record_molecules(record)
        ident = self.ident(record)
        for i, mol in enumerate(mols):
            mol = embed_3d(mol, self.options.seed) if self.options.three_d else _with_2d(mol)
            mol.SetProp("_Name", ident if len(mols) == 1 else f"{ident}#{i + 1}")
            mol.SetProp("smiles", Chem.MolToSmiles(Chem.RemoveHs(mol)))
            if record.get("source"):
                mol.SetProp("source", str(record["source"]))
            self._writer.write(mol)
        return len(mols)

    def release(self) -> None:
        self._writer.close()


def _with_2d(mol: Chem.Mol) -> Chem.Mol:
    mol = Chem.Mol(mol)
    rdDepictor.Compute2DCoords(mol)
    return mol


def embed_3d(mol: Chem.Mol, seed: int = 0) -> Chem.Mol:
    """A 3D conformer with hydrogens (ETKDGv3, then MMFF94 when parameters exist)."""
    molh = Chem.AddHs(mol)
    params = AllChem.ETKDGv3()
    params.randomSeed = seed
    if AllChem.EmbedMolecule(molh, params) != 0:
        params.useRandomCoords = True
        if AllChem.EmbedMolecule(molh, params) != 0:
            raise RecordError(f"cannot embed a 3D conformer for {Chem.MolToSmiles(mol)}")
    if AllChem.MMFFHasAllMoleculeParams(molh):
        AllChem.MMFFOptimizeMolecule(molh, maxIters=500)
    return molh


def record_molecules(record: dict) -> list[Chem.Mol]:
    text = record["text"]
    if any(op in text for op in ("<React>", "<ReverseReact>")):
        raise RecordError("a reaction record: write it to .rsmi")
    smiles = molecules_in_text(text)
    if not smiles:
        raise RecordError("record holds no molecule span")
    return [parse_smiles(s) for s in smiles]


class MoleculeDomain(Domain):
    """SMILES, CSV/TSV and SDF files of single molecules."""

    name = NAME
    options_type = MoleculeOptions
    writers = (SmilesWriter, SdfWriter)
    help_title = "molecules"

    def claims(self, path: Path) -> bool:
        return plain_name(path).endswith(LINE_SUFFIXES + SDF_SUFFIXES)

    def read(self, path: Path, opts: MoleculeOptions) -> Iterator[WorkItem]:
        name = plain_name(path)
        if name.endswith(SDF_SUFFIXES):
            yield from _read_sdf(path)
        elif textfiles.is_table(path):
            yield from textfiles.iter_table(path, opts.column, SMILES_COLUMNS, is_smiles,
                                            id_column=opts.id_column)
        else:
            yield from textfiles.iter_lines(path, header_names=SMILES_COLUMNS)

    def count(self, path: Path) -> int:
        if plain_name(path).endswith(SDF_SUFFIXES):
            with open_text(path) as fh:
                return max(1, sum(1 for line in fh if line.startswith("$$$$")))
        return textfiles.count_records(path)

    def encode(self, item: WorkItem, opts: MoleculeOptions) -> list[dict]:
        if not item.extra.get("sdf") and not item.payload.isascii():  # RDKit's wrapper fails with a SystemError
            raise RecordError("SMILES has non-ASCII characters")
        mol = parse_molblock(item.payload) if item.extra.get("sdf") else parse_smiles(item.payload)
        records = []
        for k, text in enumerate(encode_mol(mol, opts, item.source)):
            rec = {"text": text, "domain": NAME, "source": item.source}
            if item.id:
                rec["id"] = item.id
            if k:
                rec["meta"] = {"variant": k}
            records.append(rec)
        return records
