"""Space-group analysis (spglib) and the operations of a space group's standard setting: orbits, snapping, expansion.

Analysis. ``symprec`` (default ``0.01`` Angstrom; ``--symprec``) and ``angle_tolerance`` (default 5
degrees; ``--angle-tolerance``) are pymatgen ``SpacegroupAnalyzer``'s defaults, so the space group
found is the one pymatgen reports for the input. The space group, the standardized *conventional*
cell (spglib's idealized ``std_lattice``/``std_positions``, in the setting of the space group's first
Hall number, which is also the setting :func:`expand` uses) and the Wyckoff orbits come from one
``get_symmetry_dataset`` call (:func:`symmetry_dataset`).

Expansion. Each representative of an asymmetric unit is expanded with the operations of the space
group's first Hall setting (spglib's database), after snapping it onto its special position (the
average of its images under the operations that map it within ``SNAP_TOLERANCE`` of itself - the
exact projection onto the site's fixed subspace), and duplicate images are merged.
"""

from __future__ import annotations

import contextlib
import functools
import warnings

import numpy as np
import spglib

from logos.science.materials.crystal import Crystal, Site
from logos.util.records import RecordError

DEFAULT_SYMPREC = 0.01
DEFAULT_ANGLE_TOLERANCE = 5.0
SNAP_TOLERANCE = 0.1  # Angstrom: an image this close to its site counts as the same point

__all__ = ["quiet_spglib", "first_hall_number", "space_group_operations", "symmetry_dataset", "orbit", "expand",
           "unit_cell", "DEFAULT_SYMPREC", "DEFAULT_ANGLE_TOLERANCE", "SNAP_TOLERANCE"]


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


def symmetry_dataset(lattice: np.ndarray, positions: np.ndarray, types: np.ndarray, symprec: float,
                     angle_tolerance: float = DEFAULT_ANGLE_TOLERANCE):
    """spglib's symmetry dataset of a cell (types: one id per species); RecordError when it finds none."""
    try:
        with quiet_spglib():
            ds = spglib.get_symmetry_dataset((lattice, positions, types), symprec=symprec,
                                             angle_tolerance=angle_tolerance)
    except Exception as e:  # spglib >= 2.5 raises SpglibError
        raise RecordError(f"spglib finds no symmetry at symprec {symprec}: {e}") from None
    if ds is None:
        raise RecordError(f"spglib finds no symmetry at symprec {symprec}: {spglib.get_error_message()}")
    return ds


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

    The full cell is ``unit_cell(...)``; kept separate so the CIF can state the asymmetric unit.
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
