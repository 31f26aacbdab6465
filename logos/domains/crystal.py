"""Crystals: CIF (and pymatgen JSON / POSCAR) <-> ``<CrystalS>Cl4Na4<sg225>5.640 Na<wa> Cl<wb><CrystalE>`` (grammar v2).

The domain adapter: which files are crystals, the encoder options and the ``.cif`` writer; the work
is done in :mod:`logos.science.materials` (reading: :mod:`~logos.science.materials.crystal`; space-group analysis and
expansion: :mod:`~logos.science.materials.symmetry`; the canonical text: :mod:`~logos.science.materials.text`; CIF
writing: :mod:`~logos.science.materials.cif`).

Encoder. One record per CIF ``data_`` block (each block parsed on its own, so one broken block never
loses the others), per pymatgen structure, or per POSCAR; spglib finds the space group at
``--symprec`` / ``--angle-tolerance`` and the text states the composition of the conventional cell
(``--crystal-no-composition`` leaves it out), the free lattice parameters of the crystal system and
one site per Wyckoff orbit with the position's free coordinates (:mod:`logos.science.materials.text`), at the
precision recorded in every record's ``meta``.

Detokenizer. The ``.cif`` writer states the space group (IT number, H-M and Hall symbols and the full
operation list) and the asymmetric unit (v2: exactly on the Wyckoff positions; v1 text, which still
decodes, snapped onto them), which gemmi and pymatgen both expand to the same
cell. ``-o out.cif`` writes one CIF per record into the folder ``out/``; ``--cif-multi-block`` writes
one multi-block file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from logos.domains.base import Domain, DomainOptions, Writer, option
from logos.science.materials.cif import cif_name, crystal_to_cif
from logos.science.materials.crystal import (CIF_SUFFIXES, JSON_SUFFIXES, POSCAR_NAMES, POSCAR_SUFFIXES, cif_kind,
                                     count_crystals, load, read_crystal_file)
from logos.science.materials.symmetry import DEFAULT_ANGLE_TOLERANCE, DEFAULT_SYMPREC
from logos.science.materials.text import (ANGLE_DIGITS, DEFAULT_FRAC_DIGITS, LENGTH_DIGITS, OCC_DIGITS, decode_text,
                                  encode_crystal)
from logos.util.records import InputError, WorkItem, open_text, plain_name

NAME = "crystal"

__all__ = ["CrystalDomain", "CrystalOptions", "CifWriter"]


@dataclass(frozen=True)
class CrystalOptions(DomainOptions):
    """Options of the crystal encoder (recorded in every record's ``meta`` too)."""

    symprec: float = option(DEFAULT_SYMPREC, f"spglib symmetry tolerance in Angstrom (default {DEFAULT_SYMPREC})")
    angle_tolerance: float = option(DEFAULT_ANGLE_TOLERANCE,
                                    f"spglib angle tolerance in degrees (default {DEFAULT_ANGLE_TOLERANCE})")
    frac_digits: int = option(DEFAULT_FRAC_DIGITS,
                              f"decimals of fractional coordinates (default {DEFAULT_FRAC_DIGITS})")

    no_composition: bool = option(False, "do not write the composition header (cell formula) of crystals",
                                  flag="--crystal-no-composition")

    def __post_init__(self):
        if self.symprec <= 0 or not 1 <= self.frac_digits <= 8:
            raise ValueError("symprec must be positive and frac_digits in 1..8")


def _head(path: Path, size: int = 1 << 16) -> str:
    """The first ``size`` characters of a file ("" when it cannot be read as text)."""
    try:
        with open_text(path) as fh:
            return fh.read(size)
    except InputError:
        return ""


class CifWriter(Writer):
    """``.cif``: one CIF per record in the folder named after the output, or one multi-block file
    with ``--cif-multi-block``."""

    suffixes = CIF_SUFFIXES

    def open(self) -> None:
        self._n = 0
        if self.options.cif_multi_block:
            self._fh = open(self.path, "w", encoding="utf-8")
        else:
            self._dir = self.path.with_suffix("")
            self._dir.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict) -> int:
        crystal = decode_text(record["text"])
        self._n += 1
        name = str(record.get("id") or f"crystal_{self._n}")
        block = crystal_to_cif(crystal, name)
        if self.options.cif_multi_block:
            self._fh.write(block + "\n")
        else:
            (self._dir / f"{self._n:06d}_{cif_name(name)}.cif").write_text(block, encoding="utf-8")
        return 1

    def release(self) -> None:
        if self.options.cif_multi_block:
            self._fh.close()


class CrystalDomain(Domain):
    """Crystal CIFs (fractional sites + cell), pymatgen ``Structure`` JSON and POSCAR files."""

    name = NAME
    options_type = CrystalOptions
    writers = (CifWriter,)
    help_title = "crystals (CIF, pymatgen JSON, POSCAR)"

    def claims(self, path: Path) -> bool:
        name = plain_name(path)
        if name.endswith(CIF_SUFFIXES):
            head = _head(path)
            # binary or unreadable .cif files are claimed too, so the error names the real problem
            return not head or cif_kind(head) == "crystal"
        if path.name in POSCAR_NAMES or name.endswith(POSCAR_SUFFIXES):
            return True
        if name.endswith(JSON_SUFFIXES):
            return '"@class": "Structure"' in _head(path, 4096) or '"lattice"' in _head(path, 4096)
        return False

    def read(self, path: Path, opts: CrystalOptions) -> Iterator[WorkItem]:
        return read_crystal_file(path)

    def count(self, path: Path) -> int:
        return count_crystals(path)

    def encode(self, item: WorkItem, opts: CrystalOptions) -> list[dict]:
        text = encode_crystal(load(item), opts.symprec, opts.frac_digits, opts.angle_tolerance,
                              composition=not opts.no_composition)
        digits = {"length": LENGTH_DIGITS, "angle": ANGLE_DIGITS, "frac": opts.frac_digits, "occ": OCC_DIGITS}
        rec = {"text": text, "domain": NAME, "source": item.source,
               "meta": {"grammar": "v2", "symprec": opts.symprec, "angle_tolerance": opts.angle_tolerance,
                        "digits": digits}}
        if item.id:
            rec["id"] = item.id
        return [rec]
