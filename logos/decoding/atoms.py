"""The atoms of a SMILES being written: element vocabulary, RDKit's valences, bracket-atom syntax, bond bookkeeping."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

__all__ = ["SmilesError", "ORGANIC", "AROMATIC", "BOND_ORDERS", "Atom", "BRACKET", "CHARGE", "bracket_prefix", "allowed_valences"]

ORGANIC = {"B": 3, "C": 4, "N": 3, "O": 2, "P": 5, "S": 6, "F": 1, "Cl": 1, "Br": 1, "I": 5}  # max valence
AROMATIC = {"b": ("B", 3), "c": ("C", 3), "n": ("N", 3), "o": ("O", 2), "p": ("P", 3), "s": ("S", 3),
            "se": ("Se", 3), "as": ("As", 3)}  # element, most neighbours in an aromatic system
BOND_ORDERS = {"-": 1, "=": 2, "#": 3, "$": 4, ":": 1, "/": 1, "\\": 1, "~": 1}
_ELEMENTS = ("He Li Be Ne Na Mg Al Si Cl Ar Ca Sc Ti Cr Mn Fe Co Ni Cu Zn Ga Ge As Se Br Kr Rb Sr Zr Nb Mo Tc Ru Rh Pd "
             "Ag Cd In Sn Sb Te Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy Ho Er Tm Yb Lu Hf Ta Re Os Ir Pt Au Hg Tl Pb "
             "Bi Po At Rn Fr Ra Ac Th Pa Np Pu Am Cm Bk Cf Es Fm Md No Lr H B C N O F P S K V Y I W U se as te b c n o p s")
_BRACKET_PATTERN = (r"\[(\d{0,3})(" + "|".join(_ELEMENTS.split()) + r"|\*)(@(?:@|TH[12]|AL[12]|SP[123]|TB\d{1,2}|OH\d{1,2})?)?"
                    r"(H\d?)?([+-]\d?|\+\+|--)?(:\d{1,3})?\]")
BRACKET = re.compile(_BRACKET_PATTERN)
CHARGE = re.compile(r"[+-]\d*|\+\+|--")


class SmilesError(ValueError):
    """The next characters cannot extend this SMILES into a valid molecule."""


@functools.lru_cache(maxsize=None)
def allowed_valences(symbol: str, charge: int) -> tuple[int, ...]:
    """RDKit's allowed valences, ascending ((99,) for any); charged main-group atoms: the isoelectronic element's."""
    from rdkit import Chem

    pt = Chem.GetPeriodicTable()
    try:
        z = pt.GetAtomicNumber(symbol)
    except RuntimeError:
        raise SmilesError(f"unknown element {symbol!r}") from None
    if charge and any(lo <= z <= hi for lo, hi in ((5, 9), (13, 17), (33, 35), (51, 53))):
        z -= charge
    if not 1 <= z <= 118 or abs(charge) > 8:
        raise SmilesError(f"charge {charge:+d} on {symbol}")
    valences = sorted(pt.GetValenceList(z))
    return (99,) if -1 in valences else tuple(valences)


@functools.lru_cache(maxsize=8192)
def bracket_prefix(text: str) -> bool:
    """Whether ``text`` can still grow into a valid bracket atom (a real element, bounded digits)."""
    import regex

    return regex.fullmatch(_BRACKET_PATTERN, text, partial=True) is not None


@dataclass(slots=True)  # compact: the sampling loop reads atoms from memory a forward pass has just evicted
class Atom:
    capacity: int                   # largest valence (bond orders + hydrogens)
    used: int = 0
    aromatic: bool = False
    max_degree: int = 99            # most neighbours (aromatic atoms)
    in_ring: bool = False
    neighbours: set[int] = field(default_factory=set)
    open_rings: int = 0             # ring bonds opened here, their neighbour still to come
    valences: tuple[int, ...] = (99,)
    aromatic_bonds: set[int] = field(default_factory=set)

    @property
    def free(self) -> int:
        return self.capacity - self.used if len(self.neighbours) + self.open_rings < self.max_degree else 0

    def bond(self, other: int, order: int, aromatic: bool = False) -> None:
        self.used += order
        self.neighbours.add(other)
        if aromatic:
            self.aromatic_bonds.add(other)

    def needs_double(self) -> bool:
        """An aromatic atom whose lowest fitting valence leaves one bond for the kekulé double bond."""
        if not self.aromatic or self.valences == (99,):
            return False
        fitting = [v for v in self.valences if v >= self.used]
        return bool(fitting) and fitting[0] - self.used >= 1

    def copy(self) -> "Atom":
        return Atom(self.capacity, self.used, self.aromatic, self.max_degree, self.in_ring, set(self.neighbours),
                     self.open_rings, self.valences, set(self.aromatic_bonds))
