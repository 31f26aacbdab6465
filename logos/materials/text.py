"""Grammar text <-> Crystal: ``<CrystalS><sgN> a b c alpha beta gamma sites<CrystalE>`` (canonical form, precision).

Encoder (:func:`encode_crystal`). The unit cell is analysed by spglib (:mod:`logos.materials.symmetry`)
and written as its space group, the standardized conventional cell and one site per Wyckoff orbit:

- Precision (fixed, recorded in every record's ``meta``): lattice lengths 3 decimals (Angstrom),
  angles 2 decimals (degrees), fractional coordinates 4 decimals (``--frac-digits``),
  occupancies 3 decimals. With 4 decimals a coordinate is off by at most 0.00005 of a cell edge
  (0.0015 Angstrom in a 30 Angstrom cell), far inside ``StructureMatcher``'s tolerances; 3
  decimals also matched, but moved 7 of the 4,764 Materials Project crystals within ``symprec``
  of a higher space group (an atom 0.0004 off a mirror rounds onto it).
- One representative per Wyckoff orbit: of the orbit's atoms in the conventional cell, the one
  whose rounded coordinates (wrapped into [0, 1)) sort first.
- Elements as written (D is written as H, charges such as ``Fe3+`` are dropped).
- Canonical site order: Wyckoff letter (``a`` .. ``z``, then ``A``), then atomic number, then the
  coordinates, then occupancy.
- Partial occupancy is written explicitly, never dropped: atoms sharing one position form one
  composite species for spglib (so a disordered site keeps its own symmetry), and every species of
  the site is written as its own site with ``<Occ>0.500`` after the coordinates (same letter,
  same coordinates). Fully occupied sites carry no occupancy token. Vacancies (occupancy sums
  below 1) are kept as written. Occupancies of one position summing to 1.00-1.05 (rounding in
  the source) are scaled to 1; above 1.05 they are an error. The same element twice at one
  position (a duplicated atom) counts once.

Decoder. :func:`parse_crystal_text` reads the written representatives back; :func:`decode_text`
snaps them onto their special positions (:func:`~logos.materials.symmetry.expand`), giving the
asymmetric unit a CIF states.
"""

from __future__ import annotations

import re

import gemmi
import numpy as np

from logos.grammar import split_symbols
from logos.materials.crystal import Crystal, Site, lattice_parameters, position_groups
from logos.materials.symmetry import DEFAULT_ANGLE_TOLERANCE, DEFAULT_SYMPREC, expand, symmetry_dataset
from logos.materials.wyckoff import LETTERS
from logos.records import RecordError

OPEN, CLOSE, OCC = "<CrystalS>", "<CrystalE>", "<Occ>"
LENGTH_DIGITS, ANGLE_DIGITS, DEFAULT_FRAC_DIGITS, OCC_DIGITS = 3, 2, 4, 3
MERGE_TOLERANCE = 0.01  # Angstrom: atoms closer than this share one position (disorder)

__all__ = ["encode_crystal", "parse_crystal_text", "decode_text", "OPEN", "CLOSE", "OCC", "LENGTH_DIGITS",
           "ANGLE_DIGITS", "DEFAULT_FRAC_DIGITS", "OCC_DIGITS", "MERGE_TOLERANCE"]


# ---------------------------------------------------------------- encoder
def _composite_cell(crystal: Crystal) -> tuple[np.ndarray, np.ndarray, list[tuple[tuple[str, float], ...]]]:
    """Merge atoms sharing a position into composite species: positions, type ids, type table."""
    matrix = crystal.matrix()
    frac = np.array([s.frac for s in crystal.sites], dtype=float) % 1.0
    groups = position_groups(frac, matrix, MERGE_TOLERANCE)
    kinds: dict[tuple, int] = {}
    types, positions = [], []
    for members in groups:
        species: dict[str, float] = {}
        for j in members:  # the same element twice at one position is a duplicate, not more of it
            el = crystal.sites[j].element
            species[el] = max(species.get(el, 0.0), crystal.sites[j].occ)
        total = sum(species.values())
        if 1.0 < total <= 1.05:  # rounding in the source (0.52 + 0.50): scale to a full site
            species = {e: o / total for e, o in species.items()}
        elif total > 1.05:
            els = ", ".join(f"{e} {o:g}" for e, o in species.items())
            raise RecordError(f"atoms overlap at {tuple(round(float(v), 4) for v in frac[members[0]])}: "
                              f"occupancies sum to {total:.3f} ({els})")
        key = tuple(sorted((e, round(min(o, 1.0), OCC_DIGITS)) for e, o in species.items()))
        types.append(kinds.setdefault(key, len(kinds) + 1))
        positions.append(frac[members[0]])
    table = [k for k, _ in sorted(kinds.items(), key=lambda kv: kv[1])]
    return np.array(positions), np.array(types), table


def _fmt(value: float, digits: int) -> str:
    text = f"{value:.{digits}f}"
    return "0." + "0" * digits if text.lstrip("-").strip("0.") == "" else text


def _wrap_round(v: np.ndarray, digits: int) -> tuple[float, ...]:
    r = np.round(np.asarray(v, dtype=float) % 1.0, digits)
    r[r >= 1.0] = 0.0
    return tuple(float(x) + 0.0 for x in r)


def encode_crystal(crystal: Crystal, symprec: float = DEFAULT_SYMPREC, frac_digits: int = DEFAULT_FRAC_DIGITS,
                   angle_tolerance: float = DEFAULT_ANGLE_TOLERANCE) -> str:
    """The grammar text of a crystal (see the module docstring for the canonical form)."""
    if not crystal.sites:
        raise RecordError("no atom sites")
    positions, types, table = _composite_cell(crystal)
    ds = symmetry_dataset(crystal.matrix(), positions, types, symprec, angle_tolerance)
    sg = int(ds.number)
    # Wyckoff letter and orbit id of each standardized atom, through the primitive cell.
    prim_to_input: dict[int, int] = {}
    for j, p in enumerate(ds.mapping_to_primitive):
        prim_to_input.setdefault(int(p), j)
    std_pos = np.asarray(ds.std_positions) % 1.0
    orbits: dict[int, list[int]] = {}
    letters: dict[int, str] = {}
    for i, p in enumerate(ds.std_mapping_to_primitive):
        j = prim_to_input[int(p)]
        orbit = int(ds.crystallographic_orbits[j])  # equivalent_atoms can split an orbit of a supercell
        orbits.setdefault(orbit, []).append(i)
        letters[orbit] = ds.wyckoffs[j]
    sites = []
    for orbit, members in orbits.items():
        rep = min(_wrap_round(std_pos[i], frac_digits) for i in members)
        species = table[int(ds.std_types[members[0]]) - 1]
        letter = letters[orbit]
        if letter not in LETTERS:
            raise RecordError(f"spglib returned Wyckoff letter {letter!r}")
        for element, occ in species:
            z = gemmi.Element(element).atomic_number
            sites.append((LETTERS.index(letter), z, rep, occ, element, letter))
    sites.sort(key=lambda s: s[:4])
    a, b, c, alpha, beta, gamma = lattice_parameters(np.asarray(ds.std_lattice))
    parts = [OPEN, f"<sg{sg}>", " ", " ".join(_fmt(v, LENGTH_DIGITS) for v in (a, b, c)), " ",
             " ".join(_fmt(v, ANGLE_DIGITS) for v in (alpha, beta, gamma))]
    for _, _, rep, occ, element, letter in sites:
        parts.append(f" {element}<w{letter}> " + " ".join(_fmt(v, frac_digits) for v in rep))
        if occ < 1.0:
            parts.append(f"{OCC}{_fmt(occ, OCC_DIGITS)}")
    parts.append(CLOSE)
    return "".join(parts)


# ---------------------------------------------------------------- decoder
def parse_crystal_text(text: str) -> Crystal:
    """The crystal span of a grammar text -> Crystal holding the written representatives."""
    pieces = split_symbols(text)
    try:
        start = pieces.index(OPEN)
        end = pieces.index(CLOSE, start)
    except ValueError:
        raise RecordError("record holds no crystal span") from None
    body = pieces[start + 1:end]
    m = re.fullmatch(r"<sg(\d+)>", body[0]) if body else None
    if not m:
        raise RecordError("crystal span does not start with a space-group token")
    sg = int(m.group(1))
    # body[1] is "a b c alpha beta gamma El": the first site's element follows the lattice
    words = body[1].split() if len(body) > 1 else []
    try:
        lattice = tuple(float(v) for v in words[:6])
    except ValueError:
        raise RecordError(f"bad lattice parameters {' '.join(words[:6])!r}") from None
    if len(lattice) != 6:
        raise RecordError(f"expected 6 lattice parameters, got {len(lattice)}")
    element = words[6] if len(words) > 6 else None
    sites: list[Site] = []
    i = 2
    while i < len(body):
        tok = body[i]
        wm = re.fullmatch(r"<w([a-zA-Z])>", tok)
        if not wm or element is None:
            raise RecordError(f"unexpected {tok!r} in crystal span")
        words = body[i + 1].split() if i + 1 < len(body) else []
        if len(words) < 3:
            raise RecordError("site without three fractional coordinates")
        frac = tuple(float(v) for v in words[:3])
        next_element = words[3] if len(words) > 3 else None
        occ = 1.0
        i += 2
        if i < len(body) and body[i] == OCC:
            words = body[i + 1].split()
            occ = float(words[0])
            next_element = words[1] if len(words) > 1 else None
            i += 2
        if gemmi.Element(element).atomic_number == 0:
            raise RecordError(f"unknown element {element!r}")
        if not 0.0 < occ <= 1.0:
            raise RecordError(f"occupancy {occ:g} of {element} outside (0, 1]")
        sites.append(Site(element, frac, occ, wm.group(1)))
        element = next_element
    if not sites:
        raise RecordError("crystal span has no sites")
    return Crystal(lattice, sites, space_group=sg)


def decode_text(text: str) -> Crystal:
    """Grammar text -> snapped asymmetric unit (the crystal a CIF states)."""
    crystal = parse_crystal_text(text)
    snapped, _ = expand(crystal)
    return snapped
