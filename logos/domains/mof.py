"""Metal-organic frameworks: MOF CIF -> ``<MaterialS><MetalS>node<MetalE>`` linker molecule spans ``<MaterialE>``.

Chosen with ``--domain mof`` (a MOF CIF is also a valid crystal CIF, so it is never auto-detected).

The domain adapter: one record per CIF data block, read as for crystals
(:mod:`logos.science.materials.crystal`), split into node and linkers by :mod:`logos.science.materials.framework`
(bonds under periodic boundaries: :mod:`logos.science.materials.bonds`). A framework that cannot be split
cleanly is rejected with the reason, and counted in the error log.

Detokenizers: ``.json`` writes ``[{"id", "node", "linkers"}, ...]``; the molecule ``.sdf`` writer
writes the linkers (one SDF entry per linker span). :func:`logos.science.materials.validity.mof_validity`
checks a generated MOF: every linker parses as a molecule and the node is one seen in the training data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from logos.domains.base import Domain, DomainOptions, JsonArrayWriter, option
from logos.science.chemistry import parse_smiles
from logos.science.materials import framework
from logos.science.materials.bonds import DEFAULT_BOND_TOLERANCE
from logos.science.materials.crystal import count_crystals, load, read_crystal_file
from logos.util.records import WorkItem

NAME = "mof"

__all__ = ["MofDomain", "MofOptions", "JsonWriter"]


@dataclass(frozen=True)
class MofOptions(DomainOptions):
    """Options of the MOF encoder."""

    bond_tolerance: float = option(DEFAULT_BOND_TOLERANCE, "bond when distance <= sum of covalent radii + this, "
                                   f"Angstrom (default {DEFAULT_BOND_TOLERANCE})", metavar="A")


class JsonWriter(JsonArrayWriter):
    """``.json``: a list of ``{"id", "node", "linkers"}`` objects, one per MOF record."""

    suffixes = (".json",)

    def item(self, record: dict) -> tuple[dict, int]:
        node, linkers = framework.parse_mof_text(record["text"])
        for s in linkers:
            parse_smiles(s)
        return {"id": self.ident(record), "node": node, "linkers": linkers}, 1


class MofDomain(Domain):
    """MOF CIFs, chosen with ``--domain mof`` (a MOF CIF is also a crystal CIF, so it is never detected)."""

    name = NAME
    options_type = MofOptions
    writers = (JsonWriter,)
    help_title = "metal-organic frameworks (--domain mof)"

    def claims(self, path: Path) -> bool:
        return False

    def read(self, path: Path, opts: MofOptions) -> Iterator[WorkItem]:
        return read_crystal_file(path)

    def count(self, path: Path) -> int:
        return count_crystals(path)

    def encode(self, item: WorkItem, opts: MofOptions) -> list[dict]:
        node, linkers = framework.split_framework(load(item), opts.bond_tolerance)
        rec = {"text": framework.encode_framework(node, linkers), "domain": NAME, "source": item.source,
               "meta": {"bond_tolerance": opts.bond_tolerance}}
        if item.id:
            rec["id"] = item.id
        return [rec]
