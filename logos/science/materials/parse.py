"""Reading crystal grammar text (v2 and v1) into a Crystal, with a one-line RecordError for any malformed text.

:func:`parse_crystal_text` does not need the grammar check first: truncated text, a missing or extra
coordinate, a Wyckoff letter the group lacks, a bad number or element, a lattice that gives no cell
or a composition header that disagrees with the sites each give one :class:`RecordError` naming the
problem (and the offset in the crystal span where it is a syntax error), never an IndexError.

The two forms are told apart by the character after ``<sgN>``: a space in v1 (six lattice numbers,
three coordinates per site, no composition header), a digit in v2 (the free lattice parameters and
each position's free coordinates, :mod:`logos.science.materials.text`). The returned Crystal holds one site
per written site: in v2 placed exactly on its Wyckoff position (the first triplet), in v1 as
written; ``meta`` has ``grammar`` ('v1' or 'v2') and ``composition`` (the header's counts, or None).
"""

from __future__ import annotations

import re

import gemmi
import numpy as np

from logos.science.materials.crystal import Crystal, Site
from logos.science.materials.wyckoff import crystal_system, full_lattice, position
from logos.util.records import RecordError

OPEN, CLOSE, OCC = "<CrystalS>", "<CrystalE>", "<Occ>"
COMPOSITION_TOLERANCE = 0.002  # atoms: header counts have 3 decimals

__all__ = ["parse_crystal_text", "composition_text", "parse_composition", "OPEN", "CLOSE", "OCC",
           "COMPOSITION_TOLERANCE"]

_NUM = r"-?[0-9]+(?:\.[0-9]+)?"
_HEAD = re.compile(r"((?:[A-Z][a-z]?[0-9]+(?:\.[0-9]+)?)+)?<sg([0-9]+)>( ?)")
_NUMBERS = re.compile(rf"{_NUM}(?: {_NUM})*")
_SITE = re.compile(rf" ([A-Z][a-z]?)<w([a-zA-Z])>((?: {_NUM})*)(?:{re.escape(OCC)}({_NUM}))?")
_COUNT = re.compile(r"([A-Z][a-z]?)([0-9]+(?:\.[0-9]+)?)")


def composition_text(counts: dict[str, float]) -> str:
    """``{'Na': 4, 'Cl': 4}`` -> ``Cl4Na4``: alphabetical, every count written (3 decimals at most)."""
    parts = []
    for el in sorted(counts):
        n = counts[el]
        text = str(int(round(n))) if abs(n - round(n)) < 1e-6 else f"{n:.3f}".rstrip("0").rstrip(".")
        parts.append(f"{el}{text}")
    return "".join(parts)


def parse_composition(text: str) -> dict[str, float]:
    """``Na4Cl4`` (any element order) -> ``{'Na': 4.0, 'Cl': 4.0}``; RecordError on a malformed header."""
    counts: dict[str, float] = {}
    pos = 0
    for m in _COUNT.finditer(text):
        if m.start() != pos:
            break
        el, n = m.group(1), float(m.group(2))
        if gemmi.Element(el).atomic_number == 0:
            raise RecordError(f"unknown element {el!r} in the composition header {text!r}")
        if el in counts:
            raise RecordError(f"element {el} twice in the composition header {text!r}")
        counts[el] = n
        pos = m.end()
    if pos != len(text) or not counts:
        raise RecordError(f"malformed composition header {text!r}")
    return counts


def _span(text: str) -> str:
    start = text.find(OPEN)
    if start < 0:
        raise RecordError("record holds no crystal span")
    end = text.find(CLOSE, start)
    if end < 0:
        raise RecordError(f"crystal span is not closed (no {CLOSE}): truncated text")
    return text[start + len(OPEN):end]


def _near(body: str, pos: int) -> str:
    return f"at offset {pos} of the crystal span ({body[pos:pos + 16]!r})" if pos < len(body) else \
        "at the end of the crystal span"


def parse_crystal_text(text: str) -> Crystal:
    """The crystal span of a grammar text (v2 or v1) -> Crystal holding one site per written site."""
    body = _span(text)
    head = _HEAD.match(body)
    if not head:
        raise RecordError("crystal span does not start with a composition or a space-group token "
                          f"({body[:16]!r})")
    sg = int(head.group(2))
    if not 1 <= sg <= 230:
        raise RecordError(f"space group {sg} outside 1..230")
    v1 = head.group(3) == " "
    if v1 and head.group(1):
        raise RecordError("a v1 crystal text (space after the space group) cannot have a composition header")
    pos = head.end()
    m = _NUMBERS.match(body, pos)
    if not m:
        raise RecordError(f"expected lattice parameters {_near(body, pos)}")
    values = [float(v) for v in m.group(0).split()]
    pos = m.end()
    try:
        lattice = tuple(values) if v1 and len(values) == 6 else full_lattice(sg, values) if not v1 else None
    except ValueError as e:
        raise RecordError(str(e)) from None
    if lattice is None:
        raise RecordError(f"expected 6 lattice parameters (v1 text), got {len(values)}")
    _check_cell(lattice, sg)
    sites: list[Site] = []
    while pos < len(body):
        m = _SITE.match(body, pos)
        if not m:
            raise RecordError(f"expected a site (' El<wX> coordinates') {_near(body, pos)}")
        sites.append(_site(sg, m, v1))
        pos = m.end()
    if not sites:
        raise RecordError("crystal span has no sites")
    composition = parse_composition(head.group(1)) if head.group(1) else None
    if composition is not None:
        _check_composition(composition, sg, sites)
    return Crystal(lattice, sites, space_group=sg, meta={"grammar": "v1" if v1 else "v2", "composition": composition})


def _check_cell(lattice: tuple[float, ...], sg: int) -> None:
    a, b, c, al, be, ga = lattice
    if min(a, b, c) <= 0 or not all(0 < x < 180 for x in (al, be, ga)):
        raise RecordError(f"invalid lattice parameters {lattice} ({crystal_system(sg)})")
    cos = np.cos(np.radians([al, be, ga]))
    if 1 - (cos ** 2).sum() + 2 * cos.prod() <= 1e-8:
        raise RecordError(f"lattice parameters {lattice} give no cell (zero or imaginary volume)")


def _site(sg: int, m: re.Match, v1: bool) -> Site:
    element, letter, coords, occ_text = m.groups()
    if gemmi.Element(element).atomic_number == 0:
        raise RecordError(f"unknown element {element!r}")
    try:
        wp = position(sg, letter)
    except KeyError as e:
        raise RecordError(e.args[0]) from None
    numbers = [float(v) for v in coords.split()]
    occ = float(occ_text) if occ_text is not None else 1.0
    if not 0.0 < occ <= 1.0:
        raise RecordError(f"occupancy {occ:g} of {element} outside (0, 1]")
    if v1:
        if len(numbers) != 3:
            raise RecordError(f"site {element}<w{letter}> has {len(numbers)} coordinates, a v1 site needs 3")
        frac = tuple(v % 1.0 for v in numbers)
    else:
        if len(numbers) != len(wp.free):
            raise RecordError(f"site {element}<w{letter}>: Wyckoff position {wp.multiplicity}{letter} of space group "
                              f"{sg} ({wp.triplets[0]}) has {len(wp.free)} free coordinate(s)"
                              f"{' (' + ' '.join(wp.free_names) + ')' if wp.free else ''}, got {len(numbers)}")
        frac = tuple(float(v) for v in wp.point(numbers))
    return Site(element, frac, occ, letter)


def _check_composition(composition: dict[str, float], sg: int, sites: list[Site]) -> None:
    counts: dict[str, float] = {}
    for s in sites:
        counts[s.element] = counts.get(s.element, 0.0) + position(sg, s.wyckoff).multiplicity * s.occ
    if set(counts) != set(composition) or any(abs(counts[e] - composition[e]) > COMPOSITION_TOLERANCE for e in counts):
        raise RecordError(f"composition header {composition_text(composition)} does not match the sites "
                          f"({composition_text(counts)})")
