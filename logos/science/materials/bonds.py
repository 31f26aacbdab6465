"""Covalent bonds under periodic boundaries: the bond graph of a unit cell and its connected components.

Atoms i, j are bonded when their minimum-image distance is at most ``r_i + r_j + bond_tolerance``
(Cordero covalent radii from gemmi; ``--bond-tolerance``, default 0.4 Angstrom as in the CSD), under
periodic boundary conditions. Between non-metals an atom keeps at most its element's usual number of
bonds (H 1, F 1, O 2, C/N/B/Si 4), shortest first, so hydrogen bonds and close contacts are not taken
for covalent bonds. Atoms closer than ``MIN_DISTANCE`` (0.5 Angstrom: overlapping or disordered
sites) are an error.

Metals are every element except H, noble gases and the non-metals/metalloids
B C N O F Si P S Cl As Se Br Te I At (:data:`NON_METALS` lists the elements that are not metals).
"""

from __future__ import annotations

from typing import Iterable

import gemmi
import numpy as np

from logos.science.materials.crystal import MIN_DISTANCE, Crystal, periodic_images
from logos.util.records import RecordError

DEFAULT_BOND_TOLERANCE = 0.4
NON_METALS = frozenset("H He B C N O F Ne Si P S Cl Ar As Se Br Kr Te I Xe At Rn".split())
_MAX_DEGREE = {"H": 1, "F": 1, "O": 2, "C": 4, "N": 4, "B": 4, "Si": 4}

__all__ = ["periodic_bonds", "components", "DEFAULT_BOND_TOLERANCE", "MIN_DISTANCE", "NON_METALS"]


def periodic_bonds(crystal: Crystal, tolerance: float) -> tuple[np.ndarray, list[tuple[int, int, tuple]]]:
    """Cartesian positions and bonds ``(i, j, image of j)`` (each pair once, i < j or self-image)."""
    from scipy.spatial import cKDTree  # here, not at import: scipy.spatial costs ~0.5 s in every process

    matrix = crystal.matrix()
    frac = np.array([s.frac for s in crystal.sites]) % 1.0
    cart = frac @ matrix
    radii = np.array([gemmi.Element(s.element).covalent_r for s in crystal.sites])
    cutoff = 2 * radii.max() + tolerance
    shifts, images = periodic_images(cart, matrix, cutoff)
    tree = cKDTree(images)
    n = len(cart)
    bonds = []
    for i, neighbours in enumerate(tree.query_ball_point(cart, cutoff)):
        for idx in neighbours:
            s, j = divmod(idx, n)
            shift = tuple(int(v) for v in shifts[s])
            if (j < i) or (j == i and shift <= (0, 0, 0)):
                continue
            d = np.linalg.norm(images[idx] - cart[i])
            if d < MIN_DISTANCE:
                raise RecordError(f"atoms {crystal.sites[i].element}{i + 1} and {crystal.sites[j].element}{j + 1} "
                                  f"are {d:.2f} Angstrom apart (overlapping or disordered sites)")
            if d <= radii[i] + radii[j] + tolerance:
                bonds.append((i, j, shift, d))
    # Between non-metals no atom keeps more bonds than its element allows (H 1, C 4, O 2, ...):
    # the longest go first, so a short contact or hydrogen bond is not a covalent bond.
    elements = [s.element for s in crystal.sites]
    per_atom: dict[int, list[tuple[float, int]]] = {}
    for k, (i, j, _, d) in enumerate(bonds):
        if elements[i] in NON_METALS and elements[j] in NON_METALS:
            per_atom.setdefault(i, []).append((d, k))
            if j != i:
                per_atom.setdefault(j, []).append((d, k))
    dropped: set[int] = set()
    for a, mine in per_atom.items():
        cap = _MAX_DEGREE.get(elements[a])
        if cap is not None:
            kept = [(d, k) for d, k in sorted(mine) if k not in dropped]
            dropped.update(k for _, k in kept[cap:])
    return cart, [(i, j, shift) for k, (i, j, shift, _) in enumerate(bonds) if k not in dropped]


def components(atoms: Iterable[int], adjacency: dict[int, list[tuple[int, np.ndarray]]]):
    """Connected components with unwrapped image offsets and periodic dimension (0 = finite)."""
    seen: dict[int, np.ndarray] = {}
    for start in atoms:
        if start in seen:
            continue
        seen[start] = np.zeros(3, dtype=int)
        members, stack, periods = [start], [start], []
        while stack:
            i = stack.pop()
            for j, shift in adjacency.get(i, ()):
                offset = seen[i] + shift
                if j not in seen:
                    seen[j] = offset
                    members.append(j)
                    stack.append(j)
                elif not np.array_equal(seen[j], offset):
                    periods.append(offset - seen[j])
        dim = int(np.linalg.matrix_rank(np.array(periods))) if periods else 0
        yield members, {m: seen[m] for m in members}, dim
