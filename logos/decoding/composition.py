"""Crystal decoding constraint: the Wyckoff sites a row writes must add up to its prompt's composition.

The grammar (:mod:`logos.materials.constraint`) knows each space group's Wyckoff letters but cannot
count: a crystal structure prediction prompt ``<CrystalS>Ca1O3Ti1`` followed by sites of other
elements, or by too many oxygens, is grammatical and only refused when the sample is written. This
layer follows every row's text the way :class:`~logos.decoding.rows.SmilesRow` follows
molecule spans (same ``check`` / ``advance`` interface, one candidate token at a time):

- an element may start only when the composition still has atoms of it left;
- ``El<wX>`` is accepted only when the position's multiplicity fits in what is left of ``El`` and the
  rest can still be filled with the group's multiplicities;
- a position with no free coordinate holds one site (a second would coincide with it), and what is
  left of every element must still be placeable at once: on positions with free coordinates, any
  number of times, and on the unused fixed positions, none shared between elements;
- ``<CrystalE>`` is accepted only when every element's count is reached exactly.

Rows whose prompt has no composition header, and sites with partial occupancy (``<Occ>``), are not
counted (the writer still checks them).

The same count decides, before any sampling, which cells of a formula a space group can hold:
:func:`placeable` (whole counts of distinct elements, placed at once) and :func:`formula_units` (the
numbers Z of formula units whose cell ``Z x formula`` is placeable, up to an atom cap), which give
structure prediction from a formula its header choices.
"""

from __future__ import annotations

import functools
import itertools
import re

from logos.science.materials.parse import parse_composition
from logos.science.materials.wyckoff import LETTERS, MULTIPLICITY
from logos.util.records import RecordError

__all__ = ["CompositionRows", "feasible", "placeable", "placement_problem", "formula_units", "smallest_formula_units",
           "cell_counts"]

CLOSE = "<CrystalE>"
_HEADER = re.compile(r"<CrystalS>([A-Z][A-Za-z0-9.]*)(?=<sg\d+>|$)")
_GROUP = re.compile(r"<sg(\d+)>")
_SITE = re.compile(r"([A-Z][a-z]?)<w([a-zA-Z])>")
_PARTIAL_ELEMENT = re.compile(r"(?<![A-Za-z])([A-Z][a-z]?)$")  # an element being written at the end of the text


@functools.lru_cache(maxsize=None)
def _fixed(sg: int) -> frozenset[int]:
    """Indices (into ``LETTERS``) of the group's positions with no free coordinate: a site there is one point orbit,
    so two sites on the same such letter would coincide."""
    from logos.science.materials.wyckoff import positions

    return frozenset(LETTERS.index(p.letter) for p in positions(sg) if not p.free)


@functools.lru_cache(maxsize=4096)
def _fillable(sg: int, unused_fixed: frozenset[int], limit: int) -> frozenset[int]:
    """Atom counts up to ``limit`` that the group's positions reach: those with free coordinates any number of
    times, each of the ``unused_fixed`` positions at most once (per element; sharing between elements is not
    counted, so this may allow a count the elements cannot all reach together)."""
    free = {m for k, m in enumerate(MULTIPLICITY[sg]) if k not in _fixed(sg)}
    reach = {0}
    for total in range(1, limit + 1):
        if any(total - m in reach for m in free):
            reach.add(total)
    for k in unused_fixed:
        m = MULTIPLICITY[sg][k]
        reach |= {r + m for r in reach if r + m <= limit}
        for total in range(1, limit + 1):  # close again under the free positions
            if total not in reach and any(total - f in reach for f in free):
                reach.add(total)
    return frozenset(reach)


@functools.lru_cache(maxsize=65536)
def _assignable(sg: int, unused_fixed: frozenset[int], counts: tuple[int, ...]) -> bool:
    """Whether atom counts of distinct elements can all be placed at once: each on positions with free coordinates
    (any number of times) and a set of the unused fixed positions, no fixed position shared between elements."""
    if not counts:
        return True
    if len(counts) == 1:  # one element: the reachable counts are exactly its own
        return counts[0] in _fillable(sg, unused_fixed, counts[0])
    if len(unused_fixed) > 12:  # not met by any group; a bound on the subsets tried
        return all(c in _fillable(sg, unused_fixed, c) for c in counts)
    first, rest = counts[0], counts[1:]
    return any(_assignable(sg, unused_fixed - subset, rest) for subset, _ in _fixed_splits(sg, unused_fixed, first))


def _fixed_splits(sg: int, unused: frozenset[int], count: int):
    """``(subset, atoms on it)`` for each subset of the unused fixed positions that one element's ``count`` atoms can
    take, the rest of them going on positions with free coordinates (smallest subsets first)."""
    free_reach = _fillable(sg, frozenset(), count)
    fixed = sorted(unused)
    for size in range(len(fixed) + 1):
        for subset in itertools.combinations(fixed, size):
            used = sum(MULTIPLICITY[sg][k] for k in subset)
            if used <= count and count - used in free_reach:
                yield frozenset(subset), used


def placeable(counts: dict[str, int], space_group: int) -> bool:
    """Whether whole atom counts of distinct elements can all be placed at once on the group's Wyckoff positions (each
    element on positions with free coordinates, any number of times, and on fixed positions no other element takes)
    in a crystal of that group: see :func:`placement_problem`."""
    return placement_problem(counts, space_group) is None


def placement_problem(counts: dict[str, int], space_group: int) -> str | None:
    """Why whole atom counts cannot make a crystal of the group (None: they can): no placement on its Wyckoff
    positions, or only placements on fixed positions (no free coordinate) that all have more symmetry, so spglib
    finds another group whatever the lattice (Na8Cl8 in Fm-3m: Na on 8c, Cl on 4a and 4b is the CsCl structure of
    half the cell edge, Pm-3m)."""
    key = tuple(sorted(v for v in counts.values() if v))
    if not _assignable(space_group, _fixed(space_group), key):
        return "no placement on its Wyckoff positions"
    others = _other_groups(space_group, key)
    if others:
        return f"every placement on its Wyckoff positions has more symmetry (group {', '.join(map(str, others))})"
    return None


_GENERIC = (5.13, 6.07, 7.31, 83.0, 101.0, 77.0)  # lattice values no symmetry of the system makes equal


def _fixed_only(sg: int, unused: frozenset[int], counts: tuple[int, ...], out: list, limit: int) -> bool:
    """Collect in ``out`` the placements of ``counts`` (one element each) on fixed positions only, each a tuple of
    position sets; False when some placement uses a position with free coordinates or more than ``limit`` exist."""
    if not counts:
        out.append(())
        return len(out) <= limit
    first, rest = counts[0], counts[1:]
    for subset, used in _fixed_splits(sg, unused, first):
        left = unused - subset
        if used < first:  # the rest on free positions
            if _assignable(sg, left, rest):
                return False
            continue
        tails: list = []
        if not _fixed_only(sg, left, rest, tails, limit):
            return False
        out.extend((subset,) + t for t in tails)
        if len(out) > limit:
            return False
    return True


@functools.lru_cache(maxsize=4096)
def _other_groups(sg: int, counts: tuple[int, ...]) -> tuple[int, ...]:
    """The groups spglib finds (symprec 0.01, a lattice of the system with no accidental symmetry) for the placements
    of ``counts`` when all of them use fixed positions only and none keeps group ``sg``; () otherwise."""
    import numpy as np
    import spglib

    from logos.science.materials.wyckoff import full_lattice, lattice_free, positions

    placements: list = []
    if not _fixed_only(sg, _fixed(sg), counts, placements, 64) or not placements:
        return ()
    a, b, c, alpha, beta, gamma = full_lattice(sg, [_GENERIC[i] for i in lattice_free(sg)])
    al, be, ga = np.radians([alpha, beta, gamma])
    cx = c * np.cos(be)
    cy = c * (np.cos(al) - np.cos(be) * np.cos(ga)) / np.sin(ga)
    lattice = np.array([[a, 0, 0], [b * np.cos(ga), b * np.sin(ga), 0], [cx, cy, np.sqrt(c * c - cx * cx - cy * cy)]])
    found = set()
    for placement in placements:
        points, kinds = [], []
        for kind, subset in enumerate(placement):
            for k in subset:
                orbit = np.unique(np.round(positions(sg)[k].orbit([]) % 1.0, 6) % 1.0, axis=0)
                points.extend(orbit)
                kinds.extend([kind] * len(orbit))
        data = spglib.get_symmetry_dataset((lattice, np.array(points), kinds), symprec=0.01)
        number = int(data.number) if data is not None else 0
        if number == sg:
            return ()
        found.add(number)
    return tuple(sorted(found))


def cell_counts(formula: dict[str, float], units: int) -> dict[str, int] | None:
    """The whole atom counts of ``units`` formula units (``Fe2O3`` x 6 -> Fe12 O18), or None where a count is not
    whole (``Fe1.5O2`` x 1)."""
    out = {}
    for el, n in formula.items():
        total = n * units
        if abs(total - round(total)) > 1e-6 or round(total) < 1:
            return None
        out[el] = int(round(total))
    return out


def _unit(formula: dict[str, float]) -> int | None:
    """The fewest formula units with whole counts (1 for ``Fe2O3``, 2 for ``Fe1.5O2``; None past 1000)."""
    return next((z for z in range(1, 1001) if cell_counts(formula, z) is not None), None)


def formula_units(formula: dict[str, float], space_group: int | None, max_atoms: int) -> list[int]:
    """The numbers of formula units Z (ascending) whose cell has whole counts, at most ``max_atoms`` atoms and, in
    ``space_group``, a placement on its Wyckoff positions (without a group: every one, as P1 holds any cell)."""
    unit = _unit(formula)
    if unit is None:
        return []
    out = []
    z = unit
    while True:
        counts = cell_counts(formula, z)
        if counts is not None:
            if sum(counts.values()) > max_atoms:
                return out
            if space_group is None or placeable(counts, space_group):
                out.append(z)
        z += unit


def smallest_formula_units(formula: dict[str, float], space_group: int | None) -> int | None:
    """The fewest formula units whose cell can be placed in the group (without a group: the fewest with whole counts,
    as P1 holds any cell), whatever its size. One always can: ``M`` units (``M`` the general position's multiplicity,
    times the units that make the counts whole) fill general positions only; None only where no number of units up
    to 1000 makes the counts whole."""
    unit = _unit(formula)
    if unit is None or space_group is None:
        return unit
    for z in range(unit, unit * max(MULTIPLICITY[space_group]) + 1, unit):
        counts = cell_counts(formula, z)
        if counts is not None and placeable(counts, space_group):
            return z
    return None  # not reached: the general position's multiplicity always fits


def feasible(target: dict[str, int], text: str, final: bool) -> bool:
    """Whether a crystal row's ``text`` can still end with exactly the composition ``target`` (``final``: it ends here)."""
    if "<Occ>" in text:
        return True
    m = _GROUP.search(text)
    if m is None:
        return not final
    sg = int(m.group(1))
    body = text[m.end():]
    left = dict(target)
    fixed, used = _fixed(sg), set()
    for el, letter in _SITE.findall(body):
        if el not in left or letter not in LETTERS:
            return False
        k = LETTERS.index(letter)
        if k >= len(MULTIPLICITY[sg]) or k in used:
            return False
        if k in fixed:
            used.add(k)
        left[el] -= MULTIPLICITY[sg][k]
        if left[el] < 0:
            return False
    if final:
        return all(v == 0 for v in left.values())
    if not _assignable(sg, frozenset(fixed - used), tuple(sorted(v for v in left.values() if v))):
        return False
    tail = body.rsplit(">", 1)[-1]
    partial = _PARTIAL_ELEMENT.search(tail)
    if partial and not any(el.startswith(partial.group(1)) and v > 0 for el, v in left.items()):
        return False
    if tail[-1:].isspace() and not any(left.values()) and "<w" in body:
        from logos.science.materials.wyckoff import position

        letter = body.rsplit("<w", 1)[1][0]
        if len(tail.split()) >= len(position(sg, letter).free):
            return False  # the last site's coordinates are all written: the space starts a site no atom is left for
    return True


class CompositionRows:
    """The atom counts of every crystal row against its prompt's composition header."""

    def __init__(self, table, prompt_texts: list[str]):
        self.table = table
        self.close_id = table.id.get(CLOSE)
        self.texts = list(prompt_texts)
        self.targets: list[dict[str, int] | None] = [self._target(t) for t in prompt_texts]

    @staticmethod
    def _target(prompt: str) -> dict[str, int] | None:
        m = _HEADER.search(prompt)
        if m is None:
            return None
        try:
            counts = parse_composition(m.group(1))
        except RecordError:
            return None
        if any(abs(v - round(v)) > 1e-6 for v in counts.values()):
            return None  # fractional counts: partial occupancy, not counted here
        return {el: int(round(v)) for el, v in counts.items()}

    def feasible(self, row: int, text: str, final: bool) -> bool:
        """Whether ``text`` (the row's text so far) can still end with exactly the row's composition."""
        target = self.targets[row]
        return target is None or feasible(target, text, final)

    # the interface the sampler uses for its row constraint
    def check(self, row: int, token: int, closing: bool = False) -> bool:
        if self.targets[row] is None:
            return True
        return self.feasible(row, self.texts[row] + self.table.text[token], final=token == self.close_id)

    def advance(self, row: int, token: int) -> None:
        self.texts[row] += self.table.text[token]

    def closing(self, row: int, remaining: int, slack: int) -> bool:
        return False  # no planned ending: the grammar's budget handling closes crystal rows

    def stuck(self, row: int) -> bool:
        return False
