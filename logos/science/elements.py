"""The element table: the 118 element symbols in order of atomic number (the one list the package uses)."""

from __future__ import annotations

__all__ = ["ELEMENTS", "ATOMIC_NUMBER", "LAST_CLASSICAL"]

ELEMENTS: tuple[str, ...] = tuple((
    "H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se Br Kr Rb Sr "
    "Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy Ho Er Tm Yb Lu Hf Ta W Re "
    "Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf Es Fm Md No Lr "
    "Rf Db Sg Bh Hs Mt Ds Rg Cn Nh Fl Mc Lv Ts Og").split())
"""Symbols by atomic number: ``ELEMENTS[0]`` is hydrogen (Z = 1), ``ELEMENTS[117]`` oganesson (Z = 118)."""

ATOMIC_NUMBER: dict[str, int] = {symbol: z for z, symbol in enumerate(ELEMENTS, 1)}

LAST_CLASSICAL = 103
"""Lawrencium, the last element with a chemistry (the MOF node grammar allows ``ELEMENTS[:LAST_CLASSICAL]``)."""
