"""The check a crystal row passes before it may close: the CIF it will be written as is one every reader accepts.

A text the grammar and the composition allow can still decode to a cell no tool agrees with (two
atoms on top of each other, a lattice that lets sites coincide so spglib sees another group). At the
closing tag the decoder therefore builds the CIF the writer would write and requires that

- pymatgen and gemmi both read it;
- no two atoms of the cell are closer than ``MIN_DISTANCE`` (0.5 Angstrom);
- spglib finds the declared space group: at symprec 0.01 on the CIF pymatgen reads, and at the
  evaluation's tolerance (:func:`logos.science.materials.validity.space_group_consistency`, 0.1 A)
  on the decoded cell, so that ``logos evaluate`` finds the group the text declares. A cell with
  more symmetry than it declares (a supergroup, e.g. a coordinate of 0.4999 where the group's
  special position is 1/2) is refused: the encoder always writes the group spglib finds.

A refused closing makes the row continue (when the grammar and composition allow) or be resampled,
as a molecule span RDKit refuses is.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

__all__ = ["crystal_problem", "MIN_DISTANCE", "SYMPREC"]

MIN_DISTANCE = 0.5
SYMPREC = 0.01


@functools.lru_cache(maxsize=4096)
def crystal_problem(text: str) -> str | None:
    """Why the crystal ``text`` (``<CrystalS>...<CrystalE>``) would be written as a file some reader refuses, or None."""
    import gemmi
    from pymatgen.core import Structure
    from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

    from logos.science.materials.cif import crystal_to_cif
    from logos.science.materials.text import decode_text
    from logos.util.records import RecordError

    try:
        crystal = decode_text(text)
        cif = crystal_to_cif(crystal, "check")
    except (RecordError, ValueError, KeyError, IndexError, ZeroDivisionError) as e:
        return f"does not decode: {str(e)[:80]}"
    try:
        small = gemmi.make_small_structure_from_block(gemmi.cif.read_string(cif).sole_block())
        if not small.get_all_unit_cell_sites():
            return "gemmi finds no atom"
    except Exception as e:  # noqa: BLE001 - any refusal by the reader is the answer
        return f"gemmi cannot read it: {str(e)[:80]}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            structure = Structure.from_str(cif, fmt="cif")
    except Exception as e:  # noqa: BLE001
        return f"pymatgen cannot read it: {str(e)[:80]}"
    if len(structure) > 1:
        d = structure.distance_matrix + np.eye(len(structure)) * 1e9
        if float(d.min()) < MIN_DISTANCE:
            return f"atoms {float(d.min()):.2f} A apart"
    try:
        found = SpacegroupAnalyzer(structure, symprec=SYMPREC).get_space_group_number()
    except Exception as e:  # noqa: BLE001
        return f"spglib finds no group: {str(e)[:80]}"
    if found != crystal.space_group:
        return f"spglib finds group {found}, not the declared {crystal.space_group}"
    from logos.science.materials.symmetry import expand, unit_cell
    from logos.science.materials.validity import space_group_consistency

    ok, reason = space_group_consistency(unit_cell(expand(crystal)[0]), crystal.space_group)
    return None if ok else reason
