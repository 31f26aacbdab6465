"""Wyckoff positions of the 230 space groups: coordinate triplets, free coordinates, multiplicities.

Source. ``data/pyxtal_wyckoff_list.csv`` is ``pyxtal/database/wyckoff_list.csv`` of ``pyxtal==1.1.5``
(MIT licence, ``data/PYXTAL_LICENSE.txt``), copied from the wheel unchanged (sha256 in
``WYCKOFF_SHA256``, checked on load) and never imported: one row per space group, the Wyckoff
positions general first (letter ``a`` last), each a list of coordinate triplets such as
``'x, x+1/2, -z'`` (International Tables, conventional cell, centering translations included).

Setting. Every position is stated in the setting of the space group's *first Hall number* in
spglib's table - the setting spglib standardizes into and the one :mod:`logos.science.materials.symmetry`
expands with. pyxtal's tables use the same axes and cells (monoclinic unique axis b, cell choice 1;
rhombohedral groups on hexagonal axes) but origin choice 2 for the 24 groups with two origins, where
spglib's first Hall number is origin choice 1; those positions are shifted by ``ORIGIN_SHIFT[sg]``
(x_spglib = x_pyxtal + shift, for the points and the free coordinates alike, so a triplet
``A v + t`` becomes ``A v + t + (1 - A) shift``). ``tests/test_crystal.py`` checks, for all 230 groups, that the shifted
general position is exactly spglib's operation list, and that spglib's letter for an orbit placed on
each position of 36 groups (all 24 origin-choice groups among them; all 230 were checked once, 75 s)
has its atoms on that letter's coordinates. Of the origin shifts that map the operations onto each
other only some keep the letters (Pnnn: -1/4, not +1/4, else 4e <-> 4f); the encoder also checks every
orbit it writes.

Free coordinates. A position's *free coordinates* are the variables its first triplet uses, in the
order x, y, z (``x, x, z`` -> x z; ``1/4, 1/4, 1/4`` -> none); :meth:`Position.point` places a site
from them and :meth:`Position.free_values` recovers them from a point on the position.
Multiplicities do not depend on the origin or axis setting.

Lattice. :func:`lattice_free` names the lattice parameters a crystal system leaves free, in the
order a b c alpha beta gamma; :func:`full_lattice` rebuilds the six. Rhombohedral groups (146, 148,
155, 160, 161, 166, 167) are written on hexagonal axes (a c, gamma = 120), the setting of spglib's
first Hall number and of its standardization.
"""

from __future__ import annotations

import ast
import csv
import functools
import hashlib
import re
import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["LETTERS", "Position", "positions", "position", "multiplicity", "MULTIPLICITY", "ORIGIN_SHIFT",
           "WYCKOFF_CSV", "WYCKOFF_SHA256", "crystal_system", "lattice_free", "full_lattice"]

LETTERS = string.ascii_lowercase + "A"
WYCKOFF_CSV = Path(__file__).parent / "data" / "pyxtal_wyckoff_list.csv"
WYCKOFF_SHA256 = "ca56602252b7896121253c910739ef2fccf0ba947f2940358feb941f30c5e13d"

# Origin choice 2 (pyxtal) -> origin choice 1 (spglib's first Hall number), in eighths.
_SHIFT_8THS = {48: (6, 6, 6), 50: (2, 2, 0), 59: (2, 2, 0), 68: (0, 2, 2), 70: (1, 1, 1), 85: (2, 6, 0),
               86: (2, 2, 2), 88: (0, 2, 1), 125: (2, 2, 0), 126: (2, 2, 2), 129: (2, 6, 0), 130: (2, 6, 0),
               133: (2, 6, 2), 134: (2, 6, 2), 137: (2, 6, 2), 138: (2, 6, 2), 141: (0, 6, 1), 142: (0, 6, 1),
               201: (2, 2, 2), 203: (1, 1, 1), 222: (2, 2, 2), 224: (2, 2, 2), 227: (1, 1, 1), 228: (3, 3, 3)}
ORIGIN_SHIFT: dict[int, tuple[float, float, float]] = {sg: tuple(v / 8 for v in s) for sg, s in _SHIFT_8THS.items()}

_TERM = re.compile(r"([+-]?)(\d*(?:/\d+)?)([xyz]?)")


def _affine(triplet: str) -> tuple[np.ndarray, np.ndarray]:
    """``'-x+y, 2x, z+1/2'`` -> (integer matrix A, translation t): the point is A @ (x, y, z) + t."""
    A, t = np.zeros((3, 3), dtype=int), np.zeros(3)
    parts = triplet.replace(" ", "").split(",")
    if len(parts) != 3:
        raise ValueError(f"not a coordinate triplet: {triplet!r}")
    for i, comp in enumerate(parts):
        for sign, num, var in _TERM.findall(comp):
            s = -1 if sign == "-" else 1
            if var:
                A[i, "xyz".index(var)] += s * (int(num) if num else 1)
            elif num:
                a, _, b = num.partition("/")
                t[i] += s * int(a) / (int(b) if b else 1)
    return A, t


@dataclass(frozen=True, eq=False)
class Position:
    """One Wyckoff position of a space group (spglib's first-Hall setting)."""

    space_group: int
    letter: str
    triplets: tuple[str, ...]      # pyxtal's coordinate triplets (its own origin)
    matrices: np.ndarray           # (m, 3, 3) int: the orbit's points are matrices @ v + translations
    translations: np.ndarray       # (m, 3), origin shift applied
    free: tuple[int, ...]          # indices (0 = x, 1 = y, 2 = z) of the free coordinates, in order

    @property
    def multiplicity(self) -> int:
        return len(self.triplets)

    @property
    def free_names(self) -> str:
        return "".join("xyz"[j] for j in self.free)

    def point(self, values) -> np.ndarray:
        """The representative (first triplet) for the free coordinates ``values``, wrapped into [0, 1)."""
        v = np.zeros(3)
        v[list(self.free)] = values
        return (self.matrices[0] @ v + self.translations[0]) % 1.0

    def orbit(self, values) -> np.ndarray:
        """All ``multiplicity`` points of the orbit (coinciding points are kept), wrapped into [0, 1)."""
        v = np.zeros(3)
        v[list(self.free)] = values
        return (np.einsum("mij,j->mi", self.matrices, v) + self.translations) % 1.0

    def free_values(self, point, tol: float = 1e-3) -> np.ndarray | None:
        """The free coordinates (in [0, 1)) that place the first triplet on ``point`` (mod 1), or None."""
        values, ok = self.free_values_many(np.asarray(point, dtype=float)[None, :], tol)
        return values[0] if ok[0] else None

    def free_values_many(self, points: np.ndarray, tol: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`free_values` of many points (n, 3): (values (n, free), whether each point is on the position)."""
        A, t = self.matrices[0], self.translations[0]
        d = points - t
        v = np.zeros((len(points), 3))
        for j, i in zip(self.free, self._solo_rows):  # a row of its own with coefficient +-1 (checked in tests)
            v[:, j] = A[i, j] * d[:, i]
        v %= 1.0
        diff = v @ A.T + t - points
        ok = np.abs(diff - np.round(diff)).max(axis=1) <= tol
        return v[:, list(self.free)], ok

    @functools.cached_property
    def _solo_rows(self) -> tuple[int, ...]:
        A = self.matrices[0]
        return tuple(next(i for i in range(3) if abs(A[i, j]) == 1 and np.count_nonzero(A[i]) == 1)
                     for j in self.free)


@functools.lru_cache(maxsize=1)
def _rows() -> dict[int, str]:
    """The csv's row of each space group, unparsed (each group is parsed on first use)."""
    raw = WYCKOFF_CSV.read_bytes()
    if hashlib.sha256(raw).hexdigest() != WYCKOFF_SHA256:
        raise RuntimeError(f"{WYCKOFF_CSV} is not pyxtal 1.1.5's wyckoff_list.csv (sha256 differs)")
    return {int(row[0]): row[1] for row in list(csv.reader(raw.decode("utf-8").splitlines()))[2:]}


@functools.lru_cache(maxsize=None)
def _group(sg: int) -> tuple[Position, ...]:
    shift = np.array(ORIGIN_SHIFT.get(sg, (0.0, 0.0, 0.0)))
    lists = ast.literal_eval(_rows()[sg])  # a Python literal of lists of strings (never eval'd)
    out = []
    for k, triplets in enumerate(reversed(lists)):
        aff = [_affine(s) for s in triplets]
        mats = np.array([a for a, _ in aff])
        trans = np.array([t + (np.eye(3) - a) @ shift for a, t in aff])  # x_spglib = x_pyxtal + shift
        free = tuple(j for j in range(3) if mats[0][:, j].any())
        out.append(Position(sg, LETTERS[k], tuple(triplets), mats, trans, free))
    return tuple(out)


def positions(space_group: int) -> tuple[Position, ...]:
    """The Wyckoff positions of a space group, letter ``a`` first."""
    if not isinstance(space_group, int) or not 1 <= space_group <= 230:
        raise KeyError(f"space group {space_group} outside 1..230")
    return _group(space_group)


def position(space_group: int, letter: str) -> Position:
    """Wyckoff position ``letter`` of ``space_group``; KeyError naming the group's letters when absent."""
    pos = positions(space_group)
    i = LETTERS.find(letter)
    if len(letter) != 1 or i < 0 or i >= len(pos):
        raise KeyError(f"space group {space_group} has no Wyckoff position {letter!r} "
                       f"(it has {LETTERS[0]}..{LETTERS[len(pos) - 1]})")
    return pos[i]


def multiplicity(space_group: int, letter: str) -> int:
    """Multiplicity of Wyckoff ``letter`` in ``space_group``; KeyError when the group has no such letter."""
    return position(space_group, letter).multiplicity


class _Multiplicities(dict):
    """``MULTIPLICITY[sg]``: the multiplicities of the group's letters, ``a`` first (computed on first use)."""

    def __missing__(self, sg: int) -> tuple[int, ...]:
        value = tuple(p.multiplicity for p in positions(sg))
        self[sg] = value
        return value


MULTIPLICITY: dict[int, tuple[int, ...]] = _Multiplicities()


# ---------------------------------------------------------------- lattice parameters by crystal system
# (first space group of each system, name, indices into (a, b, c, alpha, beta, gamma) written in v2 text)
_SYSTEMS = ((1, "triclinic", (0, 1, 2, 3, 4, 5)), (3, "monoclinic", (0, 1, 2, 4)), (16, "orthorhombic", (0, 1, 2)),
            (75, "tetragonal", (0, 2)), (143, "trigonal", (0, 2)), (168, "hexagonal", (0, 2)), (195, "cubic", (0,)))


def crystal_system(space_group: int) -> str:
    """'triclinic', 'monoclinic', 'orthorhombic', 'tetragonal', 'trigonal', 'hexagonal' or 'cubic'."""
    if not 1 <= space_group <= 230:
        raise KeyError(f"space group {space_group} outside 1..230")
    return [name for first, name, _ in _SYSTEMS if first <= space_group][-1]


def lattice_free(space_group: int) -> tuple[int, ...]:
    """Indices into (a, b, c, alpha, beta, gamma) of the lattice parameters the group leaves free
    (cubic: a; tetragonal, trigonal incl. rhombohedral on hexagonal axes, hexagonal: a c; orthorhombic:
    a b c; monoclinic, unique axis b: a b c beta; triclinic: all six)."""
    system = crystal_system(space_group)
    return next(free for _, name, free in _SYSTEMS if name == system)


def full_lattice(space_group: int, values) -> tuple[float, float, float, float, float, float]:
    """The six lattice parameters from the group's free ones (in :func:`lattice_free` order)."""
    system = crystal_system(space_group)
    v = [float(x) for x in values]
    if len(v) != len(lattice_free(space_group)):
        raise ValueError(f"space group {space_group} ({system}) has {len(lattice_free(space_group))} lattice "
                         f"parameter(s), got {len(v)}")
    if system == "triclinic":
        return tuple(v)
    if system == "monoclinic":
        return v[0], v[1], v[2], 90.0, v[3], 90.0
    if system == "orthorhombic":
        return v[0], v[1], v[2], 90.0, 90.0, 90.0
    if system == "tetragonal":
        return v[0], v[0], v[1], 90.0, 90.0, 90.0
    if system in ("trigonal", "hexagonal"):
        return v[0], v[0], v[1], 90.0, 90.0, 120.0
    return v[0], v[0], v[0], 90.0, 90.0, 90.0
