"""The canonical Wyckoff sites of a standardized crystal: one choice among the equivalent origins and axes.

spglib's standardized cell depends on where the input's origin was: any operation of the space
group's (Euclidean) normalizer that keeps the lattice - an origin shift such as (1/2, 1/2, 1/2) in
Fm-3m, a sign change of an axis, a swap of equal axes - maps the crystal onto an equally valid
standard description, with other Wyckoff letters (4a <-> 4b) and coordinates. :func:`canonical_sites`
tries them all and keeps the description whose sorted site list is smallest, so the same crystal gives
the same text whatever cell, origin or setting it was read in.

Candidates: the 48 signed axis permutations P that keep the metric (within ``METRIC_TOLERANCE``) and
map the group's rotations onto themselves, each with every origin shift t on a 1/24 grid for which
x -> P x + t maps the group's operations onto themselves (:func:`normalizer`, cached per group). Along
a polar axis (every rotation fixes it) the origin is free: it is set by putting one atom of the
rarest species (fewest atoms, then the smallest species key) at 0 on that axis, each such atom tried.
Normalizer operations that are not signed permutations (e.g. some hexagonal ones) are not tried.
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

from logos.science.materials.symmetry import space_group_operations
from logos.science.materials.wyckoff import LETTERS, positions

METRIC_TOLERANCE = 1e-4  # relative
GRID = 24

__all__ = ["canonical_sites", "normalizer", "polar_axes", "METRIC_TOLERANCE"]

_SIGNED_PERMUTATIONS = [np.array([[s[i] if perm[i] == j else 0 for j in range(3)] for i in range(3)])
                        for perm in itertools.permutations(range(3)) for s in itertools.product((1, -1), repeat=3)]

_PERMUTATION_STACK = np.array(_SIGNED_PERMUTATIONS)


@functools.lru_cache(maxsize=None)
def polar_axes(sg: int) -> tuple[int, ...]:
    """Axes along which every rotation of the group fixes the coordinate (the origin floats)."""
    rots, _ = space_group_operations(sg)
    return tuple(k for k in range(3) if all((np.eye(3, dtype=int) - r)[:, k].any() == 0 for r in rots))


@functools.lru_cache(maxsize=None)
def _shifts(sg: int, pi: int) -> tuple[tuple[float, float, float], ...]:
    """Origin shifts (polar components 0) that, with signed permutation ``pi``, normalize the group."""
    P = _SIGNED_PERMUTATIONS[pi]
    rots, trans = space_group_operations(sg)
    Pinv = np.round(np.linalg.inv(P)).astype(int)
    by_rot: dict[bytes, list[np.ndarray]] = {}
    for r, t in zip(rots, trans):
        by_rot.setdefault(r.tobytes(), []).append(t % 1.0)
    conjugated = [(P @ r @ Pinv).astype(int) for r in rots]
    if any(r2.tobytes() not in by_rot for r2 in conjugated):
        return ()
    centering = by_rot[np.eye(3, dtype=int).tobytes()]
    for c in centering:  # the lattice (centering included) must map onto itself
        if not any(np.abs((P @ c - a) - np.round(P @ c - a)).max() < 1e-6 for a in centering):
            return ()
    grid = _grid(polar_axes(sg))
    for k in _generators(sg):  # the rest of the group follows from its generators and the centering
        r2, t = conjugated[k], trans[k]
        val = (P @ t)[None, :] + grid @ (np.eye(3) - r2).T
        hit = np.zeros(len(grid), dtype=bool)
        for a in by_rot[r2.tobytes()]:
            d = val - a
            hit |= np.abs(d - np.round(d)).max(axis=1) < 1e-6
        grid = grid[hit]
        if not len(grid):
            return ()
    return tuple(map(tuple, grid))


@functools.lru_cache(maxsize=None)
def _grid(polar: tuple[int, ...]) -> np.ndarray:
    """Origin shifts on the 1/GRID grid, 0 along the polar axes."""
    axes = [np.zeros(1) if k in polar else np.arange(GRID) / GRID for k in range(3)]
    return np.array(list(itertools.product(*axes)))


@functools.lru_cache(maxsize=None)
def _generators(sg: int) -> tuple[int, ...]:
    """Indices of operations whose rotations generate the group's point group."""
    rots, _ = space_group_operations(sg)
    gens: list[int] = []
    closure = {np.eye(3, dtype=int).tobytes(): np.eye(3, dtype=int)}
    for k, r in enumerate(rots):
        if r.tobytes() in closure:
            continue
        gens.append(k)
        frontier = list(closure.values())
        while frontier:
            new = []
            for a in frontier:
                for g in (rots[i] for i in gens):
                    b = a @ g
                    if b.tobytes() not in closure:
                        closure[b.tobytes()] = b
                        new.append(b)
            frontier = new
    return tuple(gens)


def normalizer(sg: int, metric: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(P, t) pairs mapping the group onto itself and keeping the metric ``metric``, one per coset of
    the group (two that differ by an operation of the group give the same description); identity first."""
    scale = np.abs(metric).max()
    moved = np.einsum("pji,jk,pkl->pil", _PERMUTATION_STACK, metric, _PERMUTATION_STACK)  # P^T G P for every P
    allowed = tuple(np.nonzero(np.abs(moved - metric).max(axis=(1, 2)) <= METRIC_TOLERANCE * scale)[0].tolist())
    return _cosets(sg, allowed)


@functools.lru_cache(maxsize=None)
def _cosets(sg: int, allowed: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray]]:
    rots, trans = space_group_operations(sg)
    seen: set[tuple] = set()
    out = []
    for pi in allowed:
        P = _SIGNED_PERMUTATIONS[pi]
        pr = np.einsum("ij,njk->nik", P, rots).reshape(len(rots), 9)
        for t in _shifts(sg, pi):
            t = np.array(t)
            key = tuple(P.reshape(9)) + tuple(np.round(t * GRID).astype(int) % GRID)
            if key in seen:
                continue
            out.append((P, t))
            shifted = np.round((trans @ P.T + t) * GRID).astype(int) % GRID  # the coset (P, t) G
            seen.update(map(tuple, np.hstack([pr, shifted])))
    return out


def _describe_all(sg: int, pos: np.ndarray, orbits: list[list[int]], digits: int) -> list:
    """For each candidate description (``pos``: (C, atoms, 3) fractional coordinates), the (letter
    index, rounded free coordinates) of each orbit, or None when an orbit fits no position.

    Per orbit: the first Wyckoff position of its multiplicity that holds one of its atoms, and the
    lexicographically smallest rounded free coordinates among the atoms it holds. All candidates go
    through numpy at once (one call per orbit and position, not per candidate).
    """
    n_cand = len(pos)
    per_orbit = []
    for members in orbits:
        pts = pos[:, members, :]  # (C, m, 3)
        m = len(members)
        letter = np.full(n_cand, -1)
        free_rows = [None] * n_cand
        for k, wp in enumerate(positions(sg)):
            if wp.multiplicity != m:
                continue
            todo = np.nonzero(letter < 0)[0]
            if not len(todo):
                break
            values, ok = wp.free_values_many(pts[todo].reshape(-1, 3))
            ok = ok.reshape(len(todo), m)
            r = np.round(values, digits).reshape(len(todo), m, -1)
            r[r >= 1.0] = 0.0
            r = r + 0.0  # -0.0 -> 0.0
            hit = ok.any(axis=1)
            # lexicographic minimum over the atoms on the position, column by column
            mask = ok.copy()
            for j in range(r.shape[2]):
                col = np.where(mask, r[:, :, j], np.inf)
                mask &= col == col.min(axis=1, keepdims=True)
            chosen = r[np.arange(len(todo)), mask.argmax(axis=1)].tolist()
            for c in np.nonzero(hit)[0].tolist():
                letter[todo[c]] = k
                free_rows[todo[c]] = tuple(chosen[c])
        per_orbit.append((letter, free_rows))
    return [None if any(letter[c] < 0 for letter, _ in per_orbit)
            else [(int(letter[c]), rows[c]) for letter, rows in per_orbit] for c in range(n_cand)]


def canonical_sites(sg: int, lattice: np.ndarray, std_pos: np.ndarray, orbits: list[list[int]],
                    species: list[tuple], digits: int) -> list[tuple[str, tuple[float, ...]]]:
    """(Wyckoff letter, free coordinates) of each orbit in the canonical description.

    ``orbits`` lists the standardized-cell atoms of each orbit, ``species`` a sortable key per orbit
    (it decides the site order, so it must not depend on the input order: e.g. atomic numbers and
    occupancies). Returns None for an orbit that fits no position (the caller reports it).
    """
    metric = lattice @ lattice.T
    polar = list(polar_axes(sg))
    anchors = [None]
    if polar:
        counts: dict[tuple, int] = {}
        for members, sp in zip(orbits, species):
            counts[sp] = counts.get(sp, 0) + len(members)
        rare = min(counts, key=lambda sp: (counts[sp], sp))
        anchors = [i for members, sp in zip(orbits, species) if sp == rare for i in members]
    candidates = []  # in the order (normalizer operation, anchor): ties keep the first
    for P, t in normalizer(sg, metric):
        moved = (std_pos @ P.T + t) % 1.0
        for a in anchors:
            pos = moved.copy()
            if a is not None:
                pos[:, polar] -= moved[a, polar]
            candidates.append(pos % 1.0)
    best, best_key = None, None
    for desc in _describe_all(sg, np.array(candidates), orbits, digits):
        if desc is None:
            continue
        key = sorted((k, sp, free) for (k, free), sp in zip(desc, species))
        if best_key is None or key < best_key:
            best, best_key = desc, key
    if best is None:
        return [None] * len(orbits)
    return [(LETTERS[k], free) for k, free in best]
