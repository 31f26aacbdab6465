"""CIF writing: a crystal's asymmetric unit and space group as a CIF data block (symmetry operations, formula sum).

The block states the space group (IT number, H-M and Hall symbols of its first Hall setting and the
full operation list as ``x,y,z`` strings) and the asymmetric unit with Wyckoff letters and
occupancies, which gemmi and pymatgen both expand to the same cell.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

import gemmi
import numpy as np
import spglib

from logos.science.materials.crystal import Crystal
from logos.science.materials.symmetry import first_hall_number, orbit, quiet_spglib, space_group_operations

__all__ = ["crystal_to_cif", "cif_name", "formula_sum", "symop_xyz"]


def symop_xyz(rot: np.ndarray, tr: np.ndarray) -> str:
    """One symmetry operation as a CIF ``x,y,z`` string, e.g. ``-y,x-y,z+1/3``."""
    out = []
    for row, t in zip(rot, tr):
        term = ""
        for coeff, axis in zip(row, "xyz"):
            if coeff:
                term += ("+" if coeff > 0 and term else "-" if coeff < 0 else "") + (axis if abs(coeff) == 1 else f"{abs(coeff)}*{axis}")
        f = Fraction(float(t) % 1.0).limit_denominator(12)
        if f:
            term += f"+{f.numerator}/{f.denominator}"
        out.append(term or "0")
    return ",".join(out)


def cif_name(name: str) -> str:
    """A record id made safe for a ``data_`` block name and a file name."""
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", name)[:70] or "crystal"


def formula_sum(crystal: Crystal) -> str:
    """Cell composition in lowest terms (Hill order: C, H, then alphabetical), e.g. ``Cl Na``."""
    counts: dict[str, Fraction] = {}
    matrix = crystal.matrix()
    for s in crystal.sites:
        n = len(orbit(s.frac, crystal.space_group, matrix)[1])
        counts[s.element] = counts.get(s.element, Fraction(0)) + n * Fraction(s.occ).limit_denominator(1000)
    g = functools.reduce(lambda x, y: Fraction(np.gcd(x.numerator * y.denominator, y.numerator * x.denominator),
                                                x.denominator * y.denominator), counts.values())
    order = sorted(counts, key=lambda e: (e != "C", e != "H", e) if "C" in counts else (0, 0, e))
    parts = []
    for e in order:
        v = counts[e] / g
        text = str(v.numerator) if v.denominator == 1 else f"{float(v):.3f}".rstrip("0")
        parts.append(e if text == "1" else f"{e}{text}")
    return " ".join(parts)


def crystal_to_cif(crystal: Crystal, name: str = "crystal") -> str:
    """A CIF data block for a crystal given by its (snapped) asymmetric unit and space group."""
    sg = crystal.space_group
    hall = first_hall_number(sg)
    with quiet_spglib():
        sgt = spglib.get_spacegroup_type(hall)
    rots, trans = space_group_operations(sg)
    lines = [f"data_{cif_name(name)}",
             f"_symmetry_space_group_name_H-M   '{sgt.international_full}'",
             f"_space_group_name_H-M_alt   '{sgt.international_full}'",
             f"_space_group_name_Hall   '{sgt.hall_symbol}'",
             f"_space_group_IT_number   {sg}",
             f"_symmetry_Int_Tables_number   {sg}"]
    for tag, v in zip(("length_a", "length_b", "length_c", "angle_alpha", "angle_beta", "angle_gamma"), crystal.lattice):
        lines.append(f"_cell_{tag}   {v:.6f}")
    lines.append(f"_cell_volume   {gemmi.UnitCell(*crystal.lattice).volume:.4f}")
    lines.append(f"_chemical_formula_sum   '{formula_sum(crystal)}'")
    lines += ["loop_", "_space_group_symop_id", "_space_group_symop_operation_xyz"]
    lines += [f"{k} '{symop_xyz(r, t)}'" for k, (r, t) in enumerate(zip(rots, trans), 1)]
    lines += ["loop_", "_atom_site_label", "_atom_site_type_symbol", "_atom_site_Wyckoff_symbol",
              "_atom_site_fract_x", "_atom_site_fract_y", "_atom_site_fract_z", "_atom_site_occupancy"]
    counts: dict[str, int] = {}
    for s in crystal.sites:
        counts[s.element] = counts.get(s.element, 0) + 1
        x, y, z = s.frac
        lines.append(f"{s.element}{counts[s.element]} {s.element} {s.wyckoff or '?'} {x:.6f} {y:.6f} {z:.6f} {s.occ:.4f}")
    return "\n".join(lines) + "\n"
