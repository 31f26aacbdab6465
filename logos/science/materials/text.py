"""Grammar text <-> Crystal, grammar v2: space group, free lattice parameters, Wyckoff sites with free coordinates.

Canonical form (v2), written by :func:`encode_crystal`::

    <CrystalS>Cl4Na4<sg225>5.640 Na<wa> Cl<wb><CrystalE>
    <CrystalS>O2Ti1<sg136>4.653 2.969 Ti<wa> O<wf> 0.3048<CrystalE>

- Optional composition header right after ``<CrystalS>``: the element counts of the conventional
  cell (sum of multiplicity x occupancy), elements in alphabetical order, every count written
  (``Cl4Na4``; a fractional count from partial occupancy has up to 3 decimals, ``Fe1.5``). It is a
  prompt for crystal structure prediction; the parser checks it against the sites.
- ``<sgN>`` then, with NO space after the tag (which tells v2 from v1, see below), only the lattice
  parameters the crystal system leaves free (:func:`~logos.science.materials.wyckoff.lattice_free`: cubic a;
  tetragonal, trigonal and hexagonal a c - rhombohedral groups on hexagonal axes, as spglib
  standardizes them; orthorhombic a b c; monoclinic a b c beta, unique axis b; triclinic all six),
  of spglib's standardized conventional cell: lengths 3 decimals (Angstrom), angles 2 (degrees).
- One site per Wyckoff orbit: `` El<wX>`` and only the position's free coordinates, x y z order
  (0-3 numbers, ``--frac-digits`` decimals, wrapped into [0, 1)); partial occupancy as ``<Occ>0.500``
  (one site per species of a disordered position, same letter and coordinates).
- Representative: of the orbit's atoms in the standardized cell, the one whose rounded free
  coordinates sort first; and of the descriptions that the space group's normalizer gives (other
  origins, axis signs and swaps of equal axes, :mod:`logos.science.materials.canonical`), the one whose
  sorted site list is smallest, so the text does not depend on the cell, origin or setting the
  crystal was read in. Sites sorted by Wyckoff letter (a..z, A), atomic number, free coordinates, occupancy.
- Setting: spglib's first Hall number of the group (origin choice 1 where there are two); the
  positions come from pyxtal's tables (:mod:`logos.science.materials.wyckoff`). The decoder places each
  site on its position exactly (first triplet) and the orbit follows from the group: the
  multiplicity is the letter's by construction.

Refused: atoms of *different* elements closer than ``MIN_DISTANCE`` (0.5 Angstrom, the structural
validity rule) unless their occupancies sum to at most 1.05 (split-site disorder). Atoms sharing a
position (closer than ``MERGE_TOLERANCE``) form one composite species for spglib; occupancies
summing to 1.00-1.05 are scaled to 1, above 1.05 they are an error; the same element twice at one
position counts once. Elements as written (D as H, charges dropped).

Precision: with 4 decimals a coordinate is off by at most 0.00005 of a cell edge; 3 decimals moved
7 of the 4,764 Materials Project crystals within ``symprec`` of a higher space group in v1.

v1 text (``<CrystalS><sgN> a b c alpha beta gamma El<wX> x y z ...``, a space after the tag, six
lattice numbers, three coordinates per site) still parses and decodes (snapped onto the special
positions as before); :func:`convert_v1` rewrites it as v2. Parsing is in :mod:`logos.science.materials.parse`.
"""

from __future__ import annotations

import gemmi
import numpy as np

from logos.science.materials.canonical import canonical_sites
from logos.science.materials.crystal import MIN_DISTANCE, Crystal, lattice_parameters, periodic_images, position_groups
from logos.science.materials.parse import CLOSE, OCC, OPEN, composition_text, parse_crystal_text
from logos.science.materials.symmetry import DEFAULT_ANGLE_TOLERANCE, DEFAULT_SYMPREC, expand, symmetry_dataset
from logos.science.materials.wyckoff import LETTERS, lattice_free, position
from logos.util.records import RecordError

LENGTH_DIGITS, ANGLE_DIGITS, DEFAULT_FRAC_DIGITS, OCC_DIGITS = 3, 2, 4, 3
MERGE_TOLERANCE = 0.01  # Angstrom: atoms closer than this share one position (disorder)
DISORDER_SUM = 1.05  # occupancies of close atoms summing to at most this are alternatives, not a clash

__all__ = ["encode_crystal", "parse_crystal_text", "decode_text", "convert_v1", "OPEN", "CLOSE", "OCC",
           "LENGTH_DIGITS", "ANGLE_DIGITS", "DEFAULT_FRAC_DIGITS", "OCC_DIGITS", "MERGE_TOLERANCE", "MIN_DISTANCE"]


# ---------------------------------------------------------------- encoder
def _refuse_close_pairs(frac: np.ndarray, matrix: np.ndarray, species: list[dict[str, float]]) -> None:
    """RecordError naming the first two positions of different elements closer than MIN_DISTANCE."""
    if len(frac) < 2:
        return
    from scipy.spatial import cKDTree  # lazily: scipy.spatial costs ~0.5 s of start-up in every process

    cart = frac @ matrix
    shifts, images = periodic_images(cart, matrix, MIN_DISTANCE)
    n = len(frac)
    for i, hits in enumerate(cKDTree(images).query_ball_point(cart, MIN_DISTANCE)):
        for h in sorted(hits):
            j = h % n
            if j == i or set(species[i]) == set(species[j]):
                continue
            if sum(species[i].values()) + sum(species[j].values()) <= DISORDER_SUM:
                continue
            d = float(np.linalg.norm(images[h] - cart[i]))

            def name(k):
                return "/".join(species[k]) + " at (" + ", ".join(f"{v:.4f}" for v in frac[k]) + ")"
            raise RecordError(f"sites {name(i)} and {name(j)} are {d:.3f} A apart: different elements closer "
                              f"than {MIN_DISTANCE} A")


def _composite_cell(crystal: Crystal) -> tuple[np.ndarray, np.ndarray, list[tuple[tuple[str, float], ...]]]:
    """Merge atoms sharing a position into composite species: positions, type ids, type table."""
    matrix = crystal.matrix()
    frac = np.array([s.frac for s in crystal.sites], dtype=float) % 1.0
    groups = position_groups(frac, matrix, MERGE_TOLERANCE)
    kinds: dict[tuple, int] = {}
    types, positions, all_species = [], [], []
    for members in groups:
        species: dict[str, float] = {}
        for j in members:  # the same element twice at one position is a duplicate, not more of it
            el = crystal.sites[j].element
            species[el] = max(species.get(el, 0.0), crystal.sites[j].occ)
        total = sum(species.values())
        if 1.0 < total <= DISORDER_SUM:  # rounding in the source (0.52 + 0.50): scale to a full site
            species = {e: o / total for e, o in species.items()}
        elif total > DISORDER_SUM:
            els = ", ".join(f"{e} {o:g}" for e, o in species.items())
            raise RecordError(f"atoms overlap at {tuple(round(float(v), 4) for v in frac[members[0]])}: "
                              f"occupancies sum to {total:.3f} ({els})")
        key = tuple(sorted((e, round(min(o, 1.0), OCC_DIGITS)) for e, o in species.items()))
        types.append(kinds.setdefault(key, len(kinds) + 1))
        positions.append(frac[members[0]])
        all_species.append(species)
    _refuse_close_pairs(np.array(positions), matrix, all_species)
    table = [k for k, _ in sorted(kinds.items(), key=lambda kv: kv[1])]
    return np.array(positions), np.array(types), table


def _fmt(value: float, digits: int) -> str:
    text = f"{value:.{digits}f}"
    return "0." + "0" * digits if text.lstrip("-").strip("0.") == "" else text


def _orbits(ds) -> dict[int, tuple[str, list[int]]]:
    """Wyckoff letter and standardized-cell atoms of each crystallographic orbit (through the primitive cell)."""
    prim_to_input: dict[int, int] = {}
    for j, p in enumerate(ds.mapping_to_primitive):
        prim_to_input.setdefault(int(p), j)
    orbits: dict[int, tuple[str, list[int]]] = {}
    for i, p in enumerate(ds.std_mapping_to_primitive):
        j = prim_to_input[int(p)]
        orbit = int(ds.crystallographic_orbits[j])  # equivalent_atoms can split an orbit of a supercell
        orbits.setdefault(orbit, (ds.wyckoffs[j], []))[1].append(i)
    return orbits


def encode_crystal(crystal: Crystal, symprec: float = DEFAULT_SYMPREC, frac_digits: int = DEFAULT_FRAC_DIGITS,
                   angle_tolerance: float = DEFAULT_ANGLE_TOLERANCE, composition: bool = True) -> str:
    """The v2 grammar text of a crystal (see the module docstring for the canonical form)."""
    if not crystal.sites:
        raise RecordError("no atom sites")
    positions, types, table = _composite_cell(crystal)
    ds = symmetry_dataset(crystal.matrix(), positions, types, symprec, angle_tolerance)
    sg = int(ds.number)
    std_pos = np.asarray(ds.std_positions) % 1.0
    orbits = list(_orbits(ds).values())
    for letter, members in orbits:  # spglib's letters agree with pyxtal's coordinates of that letter
        wp = position(sg, letter) if letter in LETTERS else None
        if wp is None or all(wp.free_values(std_pos[i]) is None for i in members):
            raise RecordError(f"spglib's Wyckoff position {letter!r} of space group {sg} does not match the "
                              f"coordinates {tuple(round(float(v), 4) for v in std_pos[members[0]])}")
    species = [table[int(ds.std_types[members[0]]) - 1] for _, members in orbits]
    keys = [tuple(sorted((gemmi.Element(e).atomic_number, o) for e, o in sp)) for sp in species]
    lattice = np.asarray(ds.std_lattice)
    chosen = canonical_sites(sg, lattice, std_pos, [m for _, m in orbits], keys, frac_digits)
    sites = []
    for (letter, rep), sp in zip(chosen, species):
        for element, occ in sp:
            z = gemmi.Element(element).atomic_number
            sites.append((LETTERS.index(letter), z, rep, occ, element, letter, position(sg, letter).multiplicity))
    sites.sort(key=lambda s: s[:4])
    params = lattice_parameters(lattice)
    parts = [OPEN]
    if composition:
        counts: dict[str, float] = {}
        for *_, occ, element, _, mult in sites:
            counts[element] = counts.get(element, 0.0) + mult * round(occ, OCC_DIGITS)
        parts.append(composition_text(counts))
    parts += [f"<sg{sg}>", " ".join(_fmt(params[k], LENGTH_DIGITS if k < 3 else ANGLE_DIGITS)
                                    for k in lattice_free(sg))]
    for _, _, rep, occ, element, letter, _ in sites:
        parts.append(f" {element}<w{letter}>" + "".join(f" {_fmt(v, frac_digits)}" for v in rep))
        if occ < 1.0:
            parts.append(f"{OCC}{_fmt(occ, OCC_DIGITS)}")
    parts.append(CLOSE)
    return "".join(parts)


# ---------------------------------------------------------------- decoder
def decode_text(text: str) -> Crystal:
    """Grammar text (v2, or v1) -> the asymmetric unit a CIF states (v2 sites exactly on their positions,
    v1 sites snapped onto them)."""
    crystal = parse_crystal_text(text)
    if crystal.meta.get("grammar") == "v1":
        return expand(crystal)[0]
    return crystal


def convert_v1(text: str, frac_digits: int = DEFAULT_FRAC_DIGITS, composition: bool = True) -> str:
    """A v1 crystal text rewritten as canonical v2 text (decoded to its unit cell and encoded again)."""
    from logos.science.materials.symmetry import unit_cell
    return encode_crystal(unit_cell(decode_text(text)), frac_digits=frac_digits, composition=composition)
