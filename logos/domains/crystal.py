"""Crystals: CIF (and pymatgen JSON / POSCAR) <-> ``<CrystalS><sgN> a b c alpha beta gamma sites<CrystalE>``.

Encoder. A CIF is read with gemmi (one record per ``data_`` block; each block is parsed on its
own, so one broken block never loses the others), the symmetry operations it states are applied
(gemmi), and spglib analyses the resulting unit cell:

- ``symprec`` (default ``0.01`` Angstrom; ``--symprec``) and ``angle_tolerance`` (default 5
  degrees; ``--angle-tolerance``): pymatgen ``SpacegroupAnalyzer``'s defaults, so the space group
  written is the one pymatgen reports for the input. The space group, the standardized *conventional* cell
  (spglib's idealized ``std_lattice``/``std_positions``, in the setting of the space group's first
  Hall number, which is also the setting the detokenizer expands with) and the Wyckoff orbits
  come from one ``get_symmetry_dataset`` call.
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

Detokenizer. Each representative is expanded with the operations of the space group's first
Hall setting (spglib's database), after snapping it onto its special position (the average of
its images under the operations that map it within ``SNAP_TOLERANCE`` of itself — the exact
projection onto the site's fixed subspace), and duplicate images are merged. The ``.cif`` writer
states the space group (IT number, H-M and Hall symbols and the full operation list) and the
asymmetric unit, which gemmi and pymatgen both expand to the same cell. ``-o out.cif`` writes
one CIF per record into the folder ``out/``; ``--cif-multi-block`` writes one multi-block file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import warnings
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterator

import gemmi
import numpy as np

# spglib's C core prints search diagnostics ("ssm_get_exact_positions failed") to stderr; the
# encoder reports failures itself, one line per record.
os.environ.setdefault("SPGLIB_WARNING", "OFF")
import spglib  # noqa: E402

from logos.domains.base import Domain, DomainOptions, TextWriter, Writer, option
from logos.grammar import split_symbols
from logos.records import InputError, RecordError, WorkItem, open_text
from logos.wyckoff import LETTERS

NAME = "crystal"
OPEN, CLOSE, OCC = "<CrystalS>", "<CrystalE>", "<Occ>"
CIF_SUFFIXES = (".cif",)
JSON_SUFFIXES = (".json",)
POSCAR_SUFFIXES = (".vasp", ".poscar")
POSCAR_NAMES = ("POSCAR", "CONTCAR")

DEFAULT_SYMPREC = 0.01
DEFAULT_ANGLE_TOLERANCE = 5.0
LENGTH_DIGITS, ANGLE_DIGITS, DEFAULT_FRAC_DIGITS, OCC_DIGITS = 3, 2, 4, 3
SNAP_TOLERANCE = 0.1  # Angstrom: an image this close to its site counts as the same point
MERGE_TOLERANCE = 0.01  # Angstrom: atoms closer than this share one position (disorder)

__all__ = ["CrystalDomain", "CrystalOptions", "Crystal", "Site", "read_cif_block", "encode_crystal", "parse_crystal_text", "expand",
           "crystal_to_cif", "CifWriter"]


# ---------------------------------------------------------------- data model
@dataclass
class Site:
    """One atom (or one species of a disordered position) in fractional coordinates."""

    element: str
    frac: tuple[float, float, float]
    occ: float = 1.0
    wyckoff: str | None = None


@dataclass
class Crystal:
    """A periodic structure: lattice parameters and sites (a unit cell or an asymmetric unit)."""

    lattice: tuple[float, float, float, float, float, float]
    sites: list[Site]
    space_group: int | None = None
    name: str | None = None
    meta: dict = field(default_factory=dict)

    def matrix(self) -> np.ndarray:
        """Lattice vectors as rows (Angstrom)."""
        return lattice_matrix(*self.lattice)


def lattice_matrix(a, b, c, alpha, beta, gamma) -> np.ndarray:
    """Rows a, b, c in the standard orientation (a along x, b in the xy plane), as gemmi/pymatgen."""
    cell = gemmi.UnitCell(a, b, c, alpha, beta, gamma)
    return np.array(cell.orth.mat.tolist()).T


def lattice_parameters(matrix: np.ndarray) -> tuple[float, ...]:
    a, b, c = (float(np.linalg.norm(v)) for v in matrix)

    def angle(u, v):
        return float(np.degrees(np.arccos(np.clip(np.dot(u, v) / np.linalg.norm(u) / np.linalg.norm(v), -1, 1))))

    return a, b, c, angle(matrix[1], matrix[2]), angle(matrix[0], matrix[2]), angle(matrix[0], matrix[1])


# ---------------------------------------------------------------- readers
_DATA_LINE = re.compile(r"^data_", re.IGNORECASE)


def cif_kind(head: str) -> str | None:
    """'protein' for an mmCIF (macromolecular ``_atom_site`` loop), 'crystal' for fractional sites + cell."""
    low = head.lower()
    if "_atom_site.label_seq_id" in low or "_atom_site.auth_seq_id" in low or "_atom_site.group_pdb" in low:
        return "protein"
    if ("_atom_site_fract_x" in low or "_atom_site.fract_x" in low) and "_cell" in low:
        return "crystal"
    if "_atom_site_fract_x" in low or "_atom_site.fract_x" in low or "_cell_length_a" in low:
        return "crystal"  # a crystal CIF with a broken cell: claim it, so the error is reported
    return None


def _head(path: Path, size: int = 1 << 16) -> str:
    try:
        with open_text(path) as fh:
            return fh.read(size)
    except InputError:
        return ""


def cif_blocks(path: Path) -> Iterator[tuple[str, str]]:
    """(block name, block text) for every ``data_`` block of a CIF, split by text (not parsed)."""
    with open_text(path) as fh:
        name, lines = None, []
        for line in fh:
            if _DATA_LINE.match(line):
                if name is not None or any(l.strip() and not l.lstrip().startswith("#") for l in lines):
                    yield name or "", "".join(lines)
                name, lines = line.strip()[5:], [line]
            else:
                lines.append(line)
        if name is not None or any(l.strip() and not l.lstrip().startswith("#") for l in lines):
            yield name or "", "".join(lines)


def read_crystal_file(path: Path) -> Iterator[WorkItem]:
    """Work items of a crystal file: one per CIF ``data_`` block, per pymatgen structure, or the POSCAR."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(CIF_SUFFIXES):
        n = 0
        for n, (block, text) in enumerate(cif_blocks(path), 1):
            yield WorkItem(f"{path}:{block or n}", text, id=block or None, extra={"format": "cif"})
        if n == 0:
            raise InputError("no data_ block in the CIF")
    elif name.endswith(JSON_SUFFIXES):
        for n, (ident, obj) in enumerate(_json_structures(path), 1):
            yield WorkItem(f"{path}:{ident}", obj, id=str(ident), extra={"format": "pymatgen"})
    else:
        with open_text(path) as fh:
            yield WorkItem(str(path), fh.read(), id=path.stem, extra={"format": "poscar"})


def count_crystals(path: Path) -> int:
    if path.name.lower().removesuffix(".gz").endswith(CIF_SUFFIXES):
        with open_text(path) as fh:
            return max(1, sum(1 for line in fh if _DATA_LINE.match(line)))
    return 1


def _json_structures(path: Path) -> Iterator[tuple[str, dict]]:
    """pymatgen Structure dicts in a JSON file: one dict, a list, or a column table ({"structure": {id: ...}})."""
    with open_text(path) as fh:
        try:
            obj = json.load(fh)
        except json.JSONDecodeError as e:
            raise InputError(f"not JSON: {e.msg} (line {e.lineno})") from None
    if isinstance(obj, dict) and "lattice" in obj and "sites" in obj:
        yield "1", obj
    elif isinstance(obj, list):
        for i, s in enumerate(obj, 1):
            yield str(i), s
    elif isinstance(obj, dict) and isinstance(obj.get("structure"), dict):
        yield from obj["structure"].items()
    else:
        raise InputError("JSON holds no pymatgen Structure dicts")


def _gemmi_error(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return msg.replace("string:", "line ")


def read_cif_block(text: str) -> Crystal:
    """One CIF data block -> the full unit cell (symmetry applied), RecordError on a bad block."""
    try:
        block = gemmi.cif.read_string(text).sole_block()
    except (ValueError, RuntimeError) as e:
        raise RecordError(f"CIF syntax error: {_gemmi_error(e)}") from None
    missing = [t for t in ("_cell_length_a", "_cell_length_b", "_cell_length_c",
                           "_cell_angle_alpha", "_cell_angle_beta", "_cell_angle_gamma")
               if block.find_value(t) is None and block.find_value(t.replace("_cell_", "_cell.", 1)) is None]
    if len(missing) == 6:
        raise RecordError("missing cell: no _cell_length_*/_cell_angle_* values")
    if missing:
        raise RecordError(f"missing cell parameter(s): {', '.join(missing)}")
    if block.find_values("_atom_site_fract_x") is None or len(block.find_values("_atom_site_fract_x")) == 0:
        raise RecordError("no _atom_site_fract_x loop (no fractional sites)")
    try:
        small = gemmi.make_small_structure_from_block(block)
    except (ValueError, RuntimeError) as e:
        raise RecordError(f"cannot read the structure: {_gemmi_error(e)}") from None
    cell = small.cell
    if not all(np.isfinite(p) and p > 0 for p in cell.parameters) or not cell.is_crystal() or cell.volume <= 0:
        raise RecordError(f"invalid cell parameters {tuple(round(p, 4) for p in cell.parameters)}")
    if not small.sites:
        raise RecordError("no atom sites")
    for site in small.sites:
        if site.element.atomic_number == 0:
            label = site.type_symbol or site.label
            raise RecordError(f"unknown element {label!r} at site {site.label!r}")
        if not all(np.isfinite(site.fract.tolist())):
            raise RecordError(f"site {site.label!r} has non-numeric coordinates")
    # the stated operations win over the Hall symbol, which wins over the H-M symbol
    try:
        small.determine_and_set_spacegroup("S.H1")
    except (ValueError, RuntimeError) as e:
        raise RecordError(f"bad symmetry operations: {_gemmi_error(e)}") from None
    has_ops = any(len(block.find_values(t)) for t in ("_space_group_symop_operation_xyz",
                                                      "_symmetry_equiv_pos_as_xyz", "_space_group_symop.operation_xyz"))
    if small.spacegroup is None and has_ops:
        raise RecordError("the symmetry operations match no space group gemmi knows")
    small.setup_cell_images()
    sites = [Site(s.element.name if s.element.name != "D" else "H", tuple(float(v) % 1.0 for v in s.fract.tolist()),
                  float(s.occ)) for s in small.get_all_unit_cell_sites()]
    return Crystal(tuple(cell.parameters), sites, name=block.name)


def crystal_from_dict(obj: dict) -> Crystal:
    """A pymatgen ``Structure.as_dict()`` -> Crystal, read directly (no pymatgen needed)."""
    try:
        matrix = np.array(obj["lattice"]["matrix"], dtype=float).reshape(3, 3)
        sites = []
        for site in obj["sites"]:
            frac = tuple(float(v) % 1.0 for v in site["abc"])
            for sp in site["species"]:
                el = sp["element"]
                if gemmi.Element(el).atomic_number == 0 or el in ("X", "Xx"):
                    raise RecordError(f"unknown element {el!r}")
                sites.append(Site(el, frac, float(sp.get("occu", 1.0))))
    except (KeyError, TypeError, ValueError) as e:
        raise RecordError(f"not a pymatgen Structure dict: {type(e).__name__}: {e}") from None
    if abs(np.linalg.det(matrix)) < 1e-6:
        raise RecordError("lattice matrix has no volume")
    if not sites:
        raise RecordError("no atom sites")
    return Crystal(lattice_parameters(matrix), sites)


def crystal_from_pymatgen(obj) -> Crystal:
    """A pymatgen Structure (or its dict) -> Crystal, keeping partial occupancies."""
    if isinstance(obj, dict):
        return crystal_from_dict(obj)
    try:
        from pymatgen.core import Structure
    except ImportError:  # pragma: no cover - the extra is missing
        raise RecordError("reading pymatgen JSON needs pymatgen (pip install 'logos[materials]')") from None
    try:
        s = obj if isinstance(obj, Structure) else Structure.from_dict(obj)
    except Exception as e:
        raise RecordError(f"not a pymatgen Structure: {type(e).__name__}: {e}") from None
    sites = []
    for site in s:
        for sp, occ in site.species.items():
            el = getattr(sp, "symbol", None) or getattr(getattr(sp, "element", None), "symbol", None)
            if el is None or el in ("X", "Xx"):
                raise RecordError(f"unknown species {sp!s}")
            sites.append(Site(el, tuple(float(v) % 1.0 for v in site.frac_coords), float(occ)))
    return Crystal(tuple(s.lattice.abc) + tuple(s.lattice.angles), sites)


def crystal_from_poscar(text: str) -> Crystal:
    try:
        from pymatgen.io.vasp import Poscar
    except ImportError:  # pragma: no cover
        raise RecordError("reading POSCAR needs pymatgen (pip install 'logos[materials]')") from None
    try:
        structure = Poscar.from_str(text).structure
    except Exception as e:
        raise RecordError(f"cannot read POSCAR: {type(e).__name__}: {e}") from None
    return crystal_from_pymatgen(structure)


# ---------------------------------------------------------------- symmetry
@contextlib.contextmanager
def quiet_spglib():
    """Silence spglib's per-call DeprecationWarning about its old error handling (the switch is
    module-wide and shared with pymatgen, so it is left as it is)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


@functools.lru_cache(maxsize=1)
def _first_hall_numbers() -> dict[int, int]:
    first: dict[int, int] = {}
    with quiet_spglib():
        for hall in range(1, 531):
            first.setdefault(int(spglib.get_spacegroup_type(hall).number), hall)
    return first


def first_hall_number(space_group: int) -> int:
    """The Hall number of the space group's first (standard) setting in spglib's table."""
    return _first_hall_numbers()[space_group]


@functools.lru_cache(maxsize=None)
def space_group_operations(space_group: int) -> tuple[np.ndarray, np.ndarray]:
    """(rotations (n,3,3) int, translations (n,3)) of the standard setting, centering included."""
    if not 1 <= space_group <= 230:
        raise RecordError(f"space group {space_group} outside 1..230")
    with quiet_spglib():
        sym = spglib.get_symmetry_from_database(first_hall_number(space_group))
    return np.asarray(sym["rotations"], dtype=int), np.asarray(sym["translations"], dtype=float)


def _composite_cell(crystal: Crystal) -> tuple[np.ndarray, np.ndarray, list[tuple[tuple[str, float], ...]]]:
    """Merge atoms sharing a position into composite species: positions, type ids, type table."""
    matrix = crystal.matrix()
    frac = np.array([s.frac for s in crystal.sites], dtype=float) % 1.0
    groups: list[list[int]] = []
    assigned = np.full(len(frac), -1)
    for i in range(len(frac)):
        if assigned[i] >= 0:
            continue
        d = frac[i + 1:] - frac[i]
        d -= np.round(d)
        close = np.where(np.linalg.norm(d @ matrix, axis=1) < MERGE_TOLERANCE)[0] + i + 1
        members = [i] + [j for j in close if assigned[j] < 0]
        assigned[members] = len(groups)
        groups.append(members)
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


def symmetry_dataset(lattice: np.ndarray, positions: np.ndarray, types: np.ndarray, symprec: float,
                     angle_tolerance: float = DEFAULT_ANGLE_TOLERANCE):
    try:
        with quiet_spglib():
            ds = spglib.get_symmetry_dataset((lattice, positions, types), symprec=symprec,
                                             angle_tolerance=angle_tolerance)
    except Exception as e:  # spglib >= 2.5 raises SpglibError
        raise RecordError(f"spglib finds no symmetry at symprec {symprec}: {e}") from None
    if ds is None:
        raise RecordError(f"spglib finds no symmetry at symprec {symprec}: {spglib.get_error_message()}")
    return ds


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


# ---------------------------------------------------------------- encoder interface
@dataclass(frozen=True)
class CrystalOptions(DomainOptions):
    """Options of the crystal encoder (recorded in every record's ``meta`` too)."""

    symprec: float = option(DEFAULT_SYMPREC, f"spglib symmetry tolerance in Angstrom (default {DEFAULT_SYMPREC})")
    angle_tolerance: float = option(DEFAULT_ANGLE_TOLERANCE,
                                    f"spglib angle tolerance in degrees (default {DEFAULT_ANGLE_TOLERANCE})")
    frac_digits: int = option(DEFAULT_FRAC_DIGITS,
                              f"decimals of fractional coordinates (default {DEFAULT_FRAC_DIGITS})")

    def __post_init__(self):
        if self.symprec <= 0 or not 1 <= self.frac_digits <= 8:
            raise ValueError("symprec must be positive and frac_digits in 1..8")


def load(item: WorkItem) -> Crystal:
    fmt = item.extra.get("format", "cif")
    if fmt == "cif":
        return read_cif_block(item.payload)
    if fmt == "pymatgen":
        return crystal_from_pymatgen(item.payload)
    return crystal_from_poscar(item.payload)


# ---------------------------------------------------------------- detokenizer
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


def _snap(frac: np.ndarray, rots: np.ndarray, trans: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """Project a site onto its special position: the mean of its images that land on it."""
    images = np.einsum("nij,j->ni", rots, frac) + trans
    shift = np.round(images - frac)
    images = images - shift
    dist = np.linalg.norm((images - frac) @ matrix, axis=1)
    return images[dist < SNAP_TOLERANCE].mean(axis=0)


def orbit(frac, space_group: int, matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(snapped representative, its distinct images in [0, 1)) under the space group."""
    rots, trans = space_group_operations(space_group)
    rep = _snap(np.asarray(frac, dtype=float), rots, trans, matrix)
    images = (np.einsum("nij,j->ni", rots, rep) + trans) % 1.0
    unique: list[np.ndarray] = []
    for p in images:
        if not any(np.linalg.norm(((p - q) - np.round(p - q)) @ matrix) < SNAP_TOLERANCE for q in unique):
            unique.append(p)
    return rep % 1.0, np.array(unique)


def expand(crystal: Crystal) -> tuple[Crystal, list[int]]:
    """Asymmetric unit (with space group) -> (snapped asymmetric unit, orbit size of each site).

    The full cell is ``expanded_sites(...)``; kept separate so the CIF can state the asymmetric unit.
    """
    if crystal.space_group is None:
        raise RecordError("no space group")
    a, b, c, al, be, ga = crystal.lattice
    if min(a, b, c) <= 0 or not all(0 < x < 180 for x in (al, be, ga)):
        raise RecordError(f"invalid lattice parameters {crystal.lattice}")
    matrix = crystal.matrix()
    if not np.isfinite(matrix).all() or abs(np.linalg.det(matrix)) < 1e-6:
        raise RecordError(f"lattice parameters {crystal.lattice} give no cell")
    asym, sizes = [], []
    for s in crystal.sites:
        rep, images = orbit(s.frac, crystal.space_group, matrix)
        asym.append(Site(s.element, tuple(float(v) for v in rep), s.occ, s.wyckoff))
        sizes.append(len(images))
    return Crystal(crystal.lattice, asym, crystal.space_group, crystal.name), sizes


def unit_cell(crystal: Crystal) -> Crystal:
    """All atoms of the conventional cell of a crystal given by its asymmetric unit."""
    matrix = crystal.matrix()
    sites = []
    for s in crystal.sites:
        _, images = orbit(s.frac, crystal.space_group, matrix)
        sites.extend(Site(s.element, tuple(float(v) for v in p), s.occ, s.wyckoff) for p in images)
    return Crystal(crystal.lattice, sites, crystal.space_group, crystal.name)


def _symop_xyz(rot: np.ndarray, tr: np.ndarray) -> str:
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


def _cif_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", name)[:70] or "crystal"


def _formula_sum(crystal: Crystal) -> str:
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
    lines = [f"data_{_cif_name(name)}",
             f"_symmetry_space_group_name_H-M   '{sgt.international_full}'",
             f"_space_group_name_H-M_alt   '{sgt.international_full}'",
             f"_space_group_name_Hall   '{sgt.hall_symbol}'",
             f"_space_group_IT_number   {sg}",
             f"_symmetry_Int_Tables_number   {sg}"]
    for tag, v in zip(("length_a", "length_b", "length_c", "angle_alpha", "angle_beta", "angle_gamma"), crystal.lattice):
        lines.append(f"_cell_{tag}   {v:.6f}")
    lines.append(f"_cell_volume   {gemmi.UnitCell(*crystal.lattice).volume:.4f}")
    lines.append(f"_chemical_formula_sum   '{_formula_sum(crystal)}'")
    lines += ["loop_", "_space_group_symop_id", "_space_group_symop_operation_xyz"]
    lines += [f"{k} '{_symop_xyz(r, t)}'" for k, (r, t) in enumerate(zip(rots, trans), 1)]
    lines += ["loop_", "_atom_site_label", "_atom_site_type_symbol", "_atom_site_Wyckoff_symbol",
              "_atom_site_fract_x", "_atom_site_fract_y", "_atom_site_fract_z", "_atom_site_occupancy"]
    counts: dict[str, int] = {}
    for s in crystal.sites:
        counts[s.element] = counts.get(s.element, 0) + 1
        x, y, z = s.frac
        lines.append(f"{s.element}{counts[s.element]} {s.element} {s.wyckoff or '?'} {x:.6f} {y:.6f} {z:.6f} {s.occ:.4f}")
    return "\n".join(lines) + "\n"


def decode_text(text: str) -> Crystal:
    """Grammar text -> snapped asymmetric unit (the crystal a CIF states)."""
    crystal = parse_crystal_text(text)
    snapped, _ = expand(crystal)
    return snapped


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
            (self._dir / f"{self._n:06d}_{_cif_name(name)}.cif").write_text(block, encoding="utf-8")
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
        name = path.name.lower().removesuffix(".gz")
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
        text = encode_crystal(load(item), opts.symprec, opts.frac_digits, opts.angle_tolerance)
        digits = {"length": LENGTH_DIGITS, "angle": ANGLE_DIGITS, "frac": opts.frac_digits, "occ": OCC_DIGITS}
        rec = {"text": text, "domain": NAME, "source": item.source,
               "meta": {"symprec": opts.symprec, "angle_tolerance": opts.angle_tolerance, "digits": digits}}
        if item.id:
            rec["id"] = item.id
        return [rec]
