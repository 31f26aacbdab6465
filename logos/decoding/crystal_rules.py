"""The crystal body as a per-space-group Lark grammar (llguidance dialect) for constrained decoding.

:func:`crystal_grammar_fragment` writes rules that, appended to ``grammar/logos.lark``, define
``xtal_body``: ``<sgN>`` followed by exactly group N's free lattice parameters
(:func:`~logos.materials.wyckoff.lattice_free`) and one or more sites of group N's Wyckoff letters,
each with exactly its number of free coordinates and an optional ``<Occ>``, i.e. the v2 text of
:mod:`logos.materials.text` from ``<sgN>`` up to ``<CrystalE>``. :func:`crystal_task_rules` adds the
start rule of the generation task (``<CrystalS>``, the composition header, body, ``<CrystalE>``);
:func:`crystal_grammar` is the whole grammar text for ``llguidance.LLMatcher.grammar_from_lark``.

Ranges (each a set of real cells, so every text the grammar allows decodes to a cell of positive
volume):

- lengths 1.000-99.999 Angstrom (3 decimals);
- monoclinic beta 60.00-149.99 degrees (volume a b c sin(beta) > 0 for any beta in (0, 180));
- triclinic alpha, beta, gamma each 60.00-119.99 degrees: then every angle is below the sum of the
  other two (>= 120) and the sum is below 360, the conditions for a real cell; Niggli-reduced
  cells (spglib's triclinic standardization) have their angles in [60, 120];
- fractional coordinates 0.0000-0.9999 (``frac_digits`` decimals, the encoder's digit count);
- occupancy 0.001-0.999 (fully occupied sites carry no ``<Occ>``);
- elements: the 118 of the periodic table (gemmi's names).

Bare ``<tag>`` is a special token (see the header of ``grammar/logos.lark``). Rule and terminal names
start with ``xtal``/``XTAL`` so the fragment never clashes with the shipped grammar. The composition
header is a fixed literal when the user gives the cell's composition; one of a few literals when the
user gives a formula (``xtal_head``: the cells of the numbers of formula units the group can hold, of
which the model writes one); unconditional generation writes its own (``XTAL_COMP``: whole counts),
as every training crystal has one. With a header the model writes, every site is fully occupied (no
``<Occ>``). Either way the grammar does not tie the header to the sites: the row constraint
(:class:`~logos.decoding.rows.CompositionRow`) holds the sites to it.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

import gemmi

from logos.science.materials.parse import composition_text, parse_composition
from logos.science.materials.wyckoff import crystal_system, lattice_free, positions

__all__ = ["crystal_grammar_fragment", "crystal_task_rules", "crystal_grammar", "LENGTH_RANGE",
           "MONOCLINIC_BETA_RANGE", "TRICLINIC_ANGLE_RANGE", "ELEMENTS"]

LENGTH_RANGE = (1.0, 99.999)
MONOCLINIC_BETA_RANGE = (60.0, 149.99)
TRICLINIC_ANGLE_RANGE = (60.0, 119.99)
ELEMENTS = tuple(gemmi.Element(z).name for z in range(1, 119))

_LENGTH = r"[1-9][0-9]?\.[0-9]{3}"
_BETA = r"([6-9][0-9]|1[0-4][0-9])\.[0-9]{2}"
_TRI = r"([6-9][0-9]|1[01][0-9])\.[0-9]{2}"


def _terminals(frac_digits: int) -> str:
    elements = "|".join(sorted(ELEMENTS, key=len, reverse=True))
    return "\n".join([
        f"XTAL_LEN0: /{_LENGTH}/",
        f"XTAL_LEN: / {_LENGTH}/",
        f"XTAL_BETA: / {_BETA}/",
        f"XTAL_TRI: / {_TRI}/",
        f"XTAL_FRAC: / 0\\.[0-9]{{{frac_digits}}}/",
        "XTAL_OCC: /0\\.([0-9]{2}[1-9]|[0-9][1-9]0|[1-9]00)/",
        f"XTAL_EL: / ({elements})/",
        "xtal_occ: <Occ> XTAL_OCC",
        f"XTAL_COMP: /(({elements})[1-9][0-9]?)+/",
    ])


_CELL = {"triclinic": "XTAL_LEN0 XTAL_LEN XTAL_LEN XTAL_TRI XTAL_TRI XTAL_TRI",
         "monoclinic": "XTAL_LEN0 XTAL_LEN XTAL_LEN XTAL_BETA", "orthorhombic": "XTAL_LEN0 XTAL_LEN XTAL_LEN",
         "tetragonal": "XTAL_LEN0 XTAL_LEN", "trigonal": "XTAL_LEN0 XTAL_LEN", "hexagonal": "XTAL_LEN0 XTAL_LEN",
         "cubic": "XTAL_LEN0"}


def _group_rules(sg: int) -> list[str]:
    by_count: dict[int, list[str]] = {}
    for p in positions(sg):
        by_count.setdefault(len(p.free), []).append(f"<w{p.letter}>")
    choices = [f"({' | '.join(tags)}){' XTAL_FRAC' * n}" for n, tags in sorted(by_count.items())]
    assert len(_CELL[crystal_system(sg)].split()) == len(lattice_free(sg))
    return [f"xtal_sg{sg}: <sg{sg}> {_CELL[crystal_system(sg)]} xtal_site{sg}+",
            f"xtal_site{sg}: XTAL_EL ({' | '.join(choices)}) xtal_occ?"]


def crystal_grammar_fragment(space_groups: Iterable[int] | None = None, frac_digits: int = 4) -> str:
    """Lark rules defining ``xtal_body`` (``<sgN>`` .. last site) for the given space groups (all 230 by
    default); ``frac_digits`` must be the encoder's (records' ``meta.digits.frac``)."""
    groups = sorted(set(space_groups)) if space_groups is not None else list(range(1, 231))
    if not groups or any(not 1 <= g <= 230 for g in groups):
        raise ValueError(f"space groups must be in 1..230, got {groups}")
    if not 1 <= frac_digits <= 8:
        raise ValueError("frac_digits must be in 1..8")
    lines = ["xtal_body: " + " | ".join(f"xtal_sg{g}" for g in groups)]
    for g in groups:
        lines += _group_rules(g)
    return "\n".join(lines) + "\n" + _terminals(frac_digits) + "\n"


def crystal_task_rules(space_groups: Iterable[int] | None = None, frac_digits: int = 4,
                       composition: str | None = None, start: str = "task_crystal",
                       headers: Sequence[str] = ()) -> str:
    """The fragment plus the start rule of the generation task: ``<CrystalS>``, then the composition
    header (``'Na4Cl4'``: any element order, written canonically, ``Cl4Na4``, as a fixed literal so the
    model cannot extend it), the body, ``<CrystalE>``. With ``headers`` instead (whole-count compositions)
    the model writes one of them (rule ``xtal_head``); with neither, any (``XTAL_COMP``, whole counts). A
    header the model writes has every site fully occupied (no ``<Occ>``), so the sites can be held to it."""
    if composition is not None and headers:
        raise ValueError("a composition or header choices, not both")
    fragment = crystal_grammar_fragment(space_groups, frac_digits)
    if headers:
        choices = " | ".join(f'"{composition_text(parse_composition(h))}"' for h in headers)
        return fragment.replace(" xtal_occ?", "") + f"xtal_head: {choices}\n" + \
            f"{start}: crystal_open xtal_head xtal_body crystal_close\n"
    if composition is None:
        return fragment.replace(" xtal_occ?", "") + f"{start}: crystal_open XTAL_COMP xtal_body crystal_close\n"
    head = f' "{composition_text(parse_composition(composition))}"'
    return fragment + f"{start}: crystal_open{head} xtal_body crystal_close\n"


def crystal_grammar(space_groups: Iterable[int] | None = None, frac_digits: int = 4,
                    composition: str | None = None) -> str:
    """The shipped grammar with ``start: task_crystal`` and :func:`crystal_task_rules` appended."""
    from logos.language.grammar import grammar_text
    return re.sub(r"(?m)^start:.*$", "start: task_crystal", grammar_text()) + "\n" + \
        crystal_task_rules(space_groups, frac_digits, composition) + "\n"

