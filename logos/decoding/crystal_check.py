"""The check a crystal row passes before it may close: the CIF it will be written as is one every reader accepts.

A text the grammar and the composition allow can still decode to a cell no tool agrees with (two
atoms on top of each other, a lattice that lets sites coincide so spglib sees another group). At the
closing tag the decoder therefore builds the CIF the writer would write and requires that

- pymatgen and gemmi both read it;
- no two atoms of the cell are closer than ``MIN_DISTANCE`` (0.5 Angstrom);
- spglib (symprec 0.01) finds the declared space group, or a group in which the declared group's
  operations all hold (a supergroup: reported, accepted).

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


def _declared_ops_hold(frac: np.ndarray, species: list[str], sg: int, matrix: np.ndarray, tol: float = 0.05) -> bool:
    """Whether every operation of space group ``sg`` (standard setting) maps the cell's atoms onto atoms of the same
    species, within ``tol`` Angstrom."""
    from logos.science.materials.symmetry import space_group_operations

    rots, trans = space_group_operations(sg)
    kinds = np.array([hash(s) for s in species])
    for r, t in zip(rots, trans):
        moved = frac @ r.T + t
        delta = moved[:, None, :] - frac[None, :, :]
        delta -= np.round(delta)
        dist = np.linalg.norm(delta @ matrix, axis=-1)          # [moved atom, atom]
        dist[kinds[:, None] != kinds[None, :]] = np.inf
        if not (dist.min(axis=1) <= tol).all():
            return False
    return True


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
        frac = structure.frac_coords % 1.0
        species = [site.species_string for site in structure]
        if not _declared_ops_hold(frac, species, crystal.space_group, structure.lattice.matrix):
            return f"spglib finds group {found}, not the declared {crystal.space_group}"
    return None


def supergroup(text: str) -> int | None:
    """The group spglib finds for an accepted crystal when it is a supergroup of the declared one (else None)."""
    from pymatgen.core import Structure
    from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

    from logos.science.materials.cif import crystal_to_cif
    from logos.science.materials.text import decode_text

    crystal = decode_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        structure = Structure.from_str(crystal_to_cif(crystal, "check"), fmt="cif")
    found = SpacegroupAnalyzer(structure, symprec=SYMPREC).get_space_group_number()
    return found if found != crystal.space_group else None
