"""The crystal data model, lattice math and readers: CIF blocks (gemmi), pymatgen ``Structure`` dicts, POSCAR.

A :class:`Crystal` is a lattice (a, b, c in Angstrom, alpha, beta, gamma in degrees) and a list of
:class:`Site` (element, fractional coordinates, occupancy, Wyckoff letter): a full unit cell as read,
or an asymmetric unit with its space group as written by the grammar.

Reading. A CIF is read with gemmi (one work item per ``data_`` block; each block is parsed on its
own, so one broken block never loses the others) and the symmetry operations it states are applied
(gemmi: the stated operations win over the Hall symbol, which wins over the H-M symbol), giving every
atom of the unit cell. Elements are kept as written, except that D is read as H; charges such as
``Fe3+`` are dropped. pymatgen ``Structure`` JSON (one dict, a list, or a column table) and POSCAR
files are read too, keeping partial occupancies.
"""

from __future__ import annotations

import csv
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import gemmi
import numpy as np

from logos.util.records import InputError, RecordError, WorkItem, open_text, plain_name

CIF_SUFFIXES = (".cif",)
JSON_SUFFIXES = (".json",)
POSCAR_SUFFIXES = (".vasp", ".poscar")
TABLE_SUFFIXES = (".csv",)  # a table with a ``cif`` column, one crystal per row (CDVAE's Perov-5, Carbon-24, MP-20)
POSCAR_NAMES = ("POSCAR", "CONTCAR")
# Angstrom: atoms closer than this are not physical (structural validity; the encoder refuses such pairs of
# different elements; the MOF bond search treats them as overlapping)
MIN_DISTANCE = 0.5

__all__ = ["Crystal", "Site", "lattice_matrix", "lattice_parameters", "periodic_images", "position_groups",
           "cif_kind", "cif_blocks", "read_crystal_file", "count_crystals", "read_cif_block", "crystal_from_dict",
           "crystal_from_pymatgen", "crystal_from_poscar", "load", "CIF_SUFFIXES", "JSON_SUFFIXES",
           "POSCAR_SUFFIXES", "POSCAR_NAMES", "MIN_DISTANCE"]


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


def periodic_images(cart: np.ndarray, matrix: np.ndarray, cutoff: float) -> tuple[np.ndarray, np.ndarray]:
    """Images of Cartesian positions in the cells around the home cell, enough to find every pair
    closer than ``cutoff``: (integer cell shifts (m, 3), images (m * n, 3)); image ``k * n + i`` is
    atom ``i`` shifted by ``shifts[k]``.

    The 27 cells around the home cell, or more along an axis whose cell width is below ``cutoff``.
    """
    shifts = np.array([(i, j, k) for i in (-1, 0, 1) for j in (-1, 0, 1) for k in (-1, 0, 1)])
    widths = abs(np.linalg.det(matrix)) / np.linalg.norm(np.cross(matrix[[1, 2, 0]], matrix[[2, 0, 1]]), axis=1)
    if widths.min() < cutoff:
        reps = np.ceil(cutoff / widths).astype(int)
        shifts = np.array([(i, j, k) for i in range(-reps[0], reps[0] + 1) for j in range(-reps[1], reps[1] + 1)
                           for k in range(-reps[2], reps[2] + 1)])
    images = (cart[None, :, :] + (shifts @ matrix)[:, None, :]).reshape(-1, 3)
    return shifts, images


def position_groups(frac: np.ndarray, matrix: np.ndarray, tolerance: float) -> list[list[int]]:
    """Indices of the sites that share one position (closer than ``tolerance`` Angstrom under periodic
    boundaries), in site order: each group is a site and every later, ungrouped site close to it."""
    groups: list[list[int]] = []
    assigned = np.full(len(frac), -1)
    for i in range(len(frac)):
        if assigned[i] >= 0:
            continue
        d = frac[i + 1:] - frac[i]
        d -= np.round(d)
        close = np.where(np.linalg.norm(d @ matrix, axis=1) < tolerance)[0] + i + 1
        members = [i] + [j for j in close if assigned[j] < 0]
        assigned[members] = len(groups)
        groups.append(members)
    return groups


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
    name = plain_name(path)
    if name.endswith(CIF_SUFFIXES):
        n = 0
        for n, (block, text) in enumerate(cif_blocks(path), 1):
            yield WorkItem(f"{path}:{block or n}", text, id=block or None, extra={"format": "cif"})
        if n == 0:
            raise InputError("no data_ block in the CIF")
    elif name.endswith(JSON_SUFFIXES):
        for ident, obj in _json_structures(path):
            yield WorkItem(f"{path}:{ident}", obj, id=str(ident), extra={"format": "pymatgen"})
    elif name.endswith(TABLE_SUFFIXES):
        yield from _table_crystals(path)
    else:
        with open_text(path) as fh:
            yield WorkItem(str(path), fh.read(), id=path.stem, extra={"format": "poscar"})


def count_crystals(path: Path) -> int:
    if plain_name(path).endswith(CIF_SUFFIXES):
        with open_text(path) as fh:
            return max(1, sum(1 for line in fh if _DATA_LINE.match(line)))
    if plain_name(path).endswith(TABLE_SUFFIXES):
        return sum(1 for _ in _table_rows(path))
    return 1


def _table_rows(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, row) of a CSV table whose header has a ``cif`` column."""
    csv.field_size_limit(1 << 26)
    with open_text(path) as fh:
        reader = csv.DictReader(fh)
        if "cif" not in (reader.fieldnames or []):
            raise InputError(f"no 'cif' column in the CSV header ({', '.join(reader.fieldnames or [])})")
        for n, row in enumerate(reader, 2):
            yield n, row


def _table_crystals(path: Path) -> Iterator[WorkItem]:
    """One work item per row of a CSV with a ``cif`` column; the id is ``material_id`` (or ``id``) when present."""
    for n, row in _table_rows(path):
        ident = row.get("material_id") or row.get("id") or None
        yield WorkItem(f"{path}:{n}", row.get("cif") or "", id=ident, extra={"format": "cif"})


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


def load(item: WorkItem) -> Crystal:
    """The crystal of a work item of :func:`read_crystal_file` (a CIF block, a pymatgen dict, a POSCAR)."""
    fmt = item.extra.get("format", "cif")
    if fmt == "cif":
        return read_cif_block(item.payload)
    if fmt == "pymatgen":
        return crystal_from_pymatgen(item.payload)
    return crystal_from_poscar(item.payload)
