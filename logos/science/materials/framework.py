"""The MOF split: a framework's unit cell -> node formula + distinct linker SMILES, and its grammar text.

``<MaterialS><MetalS>node<MetalE>`` linker molecule spans ``<MaterialE>``; one CIF data block -> one record:

1. The unit cell is read as for crystals (gemmi; stated symmetry applied). Partially occupied or
   overlapping atoms (closer than 0.5 Angstrom) are an error.
2. Bonds under periodic boundaries: :mod:`logos.science.materials.bonds` (covalent radii + ``--bond-tolerance``,
   at most the element's usual number of bonds between non-metals).
3. Metals are every element except H, noble gases and the non-metals/metalloids
   B C N O F Si P S Cl As Se Br Te I At. All metal-non-metal bonds are cut; the connected
   components of the remaining non-metal atoms that hold carbon are the organic linkers; the
   rest (oxo, hydroxo, water, halide ...) stays with the metals.
4. Each linker is unwrapped across the periodic boundary, its bond orders are determined from the
   geometry (RDKit ``DetermineBondOrders``, the xyz2mol method) for every total charge in
   0, -1, ..., -6, +1, +2, and the assignment with the most plausible formal charges wins
   (deprotonated O/S/N donors are free, charged carbon costs most; ties: the charge listed first),
   so deprotonated carboxylates come out as ``[O-]``. A linker whose valence search would exceed
   ``MAX_VALENCE_CHOICES`` combinations (xyz2mol is exhaustive and can run for hours), or for
   which no charge works, gets its bond orders from a maximum matching of free valences instead
   (leftover O/N/S valences become negative charges). Stereo is taken from the 3D coordinates,
   and the linker is written as RDKit canonical isomeric SMILES without hydrogens. Distinct
   linkers are written once each, sorted by SMILES.
5. The node string is the canonical description of the inorganic part: the connected components of
   metals plus inorganic atoms, each as a formula (metals alphabetically, then the other
   elements alphabetically; counts reduced by their greatest common divisor for periodic
   components), with ``{1D}``/``{2D}``/``{3D}`` appended for an infinite rod/layer/network;
   distinct components are joined with ``.`` in sorted order, e.g. ``Zn4O`` for MOF-5 or
   ``Cu2`` for a paddle-wheel. Inorganic counter-ions bonded to no metal (``BF4``, ``ClO4``, ``Cl``
   of a charged framework) are components of the inorganic part too, e.g. ``Ag.Ag2.BF4``.

A framework that cannot be split cleanly (no metal, no organic linker, a polymeric organic part,
bond orders that no charge explains) is rejected with the reason, and counted in the error log.
:func:`parse_mof_text` reads a MOF text back as (node, linker SMILES).
"""

from __future__ import annotations

from functools import reduce
from math import gcd
from typing import Iterable

import numpy as np
from rdkit import Chem
from rdkit.Chem import rdDetermineBonds

from logos.science.chemistry import CLOSE as MOL_CLOSE, OPEN as MOL_OPEN, canonical_smiles, molecules_in_text, parse_smiles
from logos.language.grammar import split_symbols
from logos.science.materials.bonds import DEFAULT_BOND_TOLERANCE, NON_METALS, components, periodic_bonds
from logos.science.materials.crystal import Crystal
from logos.util.records import RecordError

OPEN, CLOSE, METAL_OPEN, METAL_CLOSE = "<MaterialS>", "<MaterialE>", "<MetalS>", "<MetalE>"
CHARGES = (0, -1, -2, -3, -4, -5, -6, 1, 2)
# Valences RDKit's xyz2mol tries per element; the search is their product over the atoms, so a
# linker with many multi-valent atoms (S, P, N with missing H) goes to the matching method instead.
_VALENCES = {"H": (1,), "B": (3, 4), "C": (4,), "N": (3, 4), "O": (2, 1, 3), "F": (1,), "Si": (4,), "P": (5, 3),
             "S": (6, 3, 2), "Cl": (1,), "Br": (1,), "I": (1,), "Se": (2, 4, 6), "Te": (2, 4, 6), "As": (3, 5)}
MAX_VALENCE_CHOICES = 65536

__all__ = ["split_framework", "encode_framework", "parse_mof_text", "OPEN", "CLOSE", "METAL_OPEN", "METAL_CLOSE",
           "CHARGES", "MAX_VALENCE_CHOICES"]


# ---------------------------------------------------------------- linkers and nodes
def _linker_smiles(members: list[int], offsets: dict, crystal, cart: np.ndarray, matrix: np.ndarray,
                   bonds: list[tuple[int, int]]) -> str:
    index = {a: k for k, a in enumerate(members)}
    mol = Chem.RWMol()
    conf = Chem.Conformer(len(members))
    for k, a in enumerate(members):
        atom = Chem.Atom(crystal.sites[a].element)
        atom.SetNoImplicit(True)
        mol.AddAtom(atom)
        x, y, z = cart[a] + offsets[a] @ matrix
        conf.SetAtomPosition(k, (float(x), float(y), float(z)))
    for i, j in bonds:
        mol.AddBond(index[i], index[j], Chem.BondType.SINGLE)
    mol = mol.GetMol()
    mol.AddConformer(conf, assignId=True)
    formula = _formula([crystal.sites[a].element for a in members])
    choices = 1
    for atom in mol.GetAtoms():
        options = [v for v in _VALENCES.get(atom.GetSymbol(), (0,)) if v >= atom.GetDegree()]
        choices *= max(1, len(options))
    if choices > MAX_VALENCE_CHOICES:
        return _matched_smiles(mol, formula)
    best = None
    for order, charge in enumerate(CHARGES):
        trial = Chem.Mol(mol)
        try:
            rdDetermineBonds.DetermineBondOrders(trial, charge=charge, allowChargedFragments=True, embedChiral=False)
            Chem.SanitizeMol(trial)
        except Exception:
            continue
        if any(a.GetNumRadicalElectrons() for a in trial.GetAtoms()):
            continue
        score = (_charge_penalty(trial), order)
        if best is None or score < best[0]:
            best = (score, trial)
        if score[0] == 0:
            break  # nothing beats a plausible assignment at the charge listed first
    if best is None:
        return _matched_smiles(mol, formula)  # raises with the reason when matching fails too
    trial = best[1]
    Chem.AssignStereochemistryFrom3D(trial)
    smiles = canonical_smiles(Chem.RemoveHs(trial))
    parse_smiles(smiles)  # the written SMILES must read back
    return smiles


_TARGET = {"H": 1, "B": 3, "C": 4, "N": 3, "O": 2, "F": 1, "Si": 4, "P": 3, "S": 2, "Cl": 1, "Br": 1, "I": 1,
           "Se": 2, "Te": 2, "As": 3}


def _target_valence(symbol: str, degree: int) -> tuple[int, int]:
    """(valence, formal charge) an atom of this degree is given before bonds are raised."""
    if symbol == "N" and degree == 4:
        return 4, 1
    if symbol == "B" and degree == 4:
        return 4, -1
    if symbol in ("S", "Se", "Te") and degree > 2:
        return (4 if degree == 3 else 6), 0
    if symbol in ("P", "As") and degree > 3:
        return 5, 0
    return _TARGET.get(symbol, degree), 0


def _matched_smiles(mol: Chem.Mol, formula: str) -> str:
    """Bond orders by maximum matching of unsaturated valences (for linkers too large for xyz2mol).

    Each atom gets ``target valence - degree`` free slots; a maximum-weight matching between slots of
    bonded atoms (carbon slots weigh more) raises bond orders; an O, N or S slot left over is a
    negative charge (carboxylate, azolate), a carbon slot left over is an error.
    """
    import networkx as nx

    graph = nx.Graph()
    free: dict[int, int] = {}
    charges: dict[int, int] = {}
    for atom in mol.GetAtoms():
        valence, charge = _target_valence(atom.GetSymbol(), atom.GetDegree())
        free[atom.GetIdx()] = valence - atom.GetDegree()
        charges[atom.GetIdx()] = charge
        if free[atom.GetIdx()] < 0:
            raise RecordError(f"cannot determine bond orders for linker {formula}: "
                              f"{atom.GetSymbol()} with {atom.GetDegree()} bonds")
    for bond in mol.GetBonds():
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        w = 1 + (mol.GetAtomWithIdx(i).GetSymbol() == "C") + (mol.GetAtomWithIdx(j).GetSymbol() == "C")
        for a in range(free[i]):
            for b in range(free[j]):
                graph.add_edge((i, a), (j, b), weight=w)
    rw = Chem.RWMol(mol)
    left = dict(free)
    for u, v in nx.max_weight_matching(graph):
        bond = rw.GetBondBetweenAtoms(u[0], v[0])
        bond.SetBondType({1: Chem.BondType.DOUBLE, 2: Chem.BondType.TRIPLE}.get(
            int(bond.GetBondTypeAsDouble()), Chem.BondType.TRIPLE))
        left[u[0]] -= 1
        left[v[0]] -= 1
    for idx, n in left.items():
        atom = rw.GetAtomWithIdx(idx)
        if n and atom.GetSymbol() in ("O", "N", "S", "Se"):
            charges[idx] -= n
        elif n:
            raise RecordError(f"cannot determine bond orders for linker {formula}: "
                              f"{n} unpaired valence(s) on {atom.GetSymbol()}")
        atom.SetFormalCharge(charges[idx])
    out = rw.GetMol()
    try:
        Chem.SanitizeMol(out)
    except Exception as e:
        raise RecordError(f"cannot determine bond orders for linker {formula}: {e}") from None
    Chem.AssignStereochemistryFrom3D(out)
    smiles = canonical_smiles(Chem.RemoveHs(out))
    parse_smiles(smiles)
    return smiles


def _charge_penalty(mol: Chem.Mol) -> int:
    """How implausible a charge assignment is: anionic O/S/N (deprotonated donors) are free,
    charged carbon costs most, cationic O/S and any other charge cost in between."""
    penalty = 0
    for atom in mol.GetAtoms():
        fc, el = atom.GetFormalCharge(), atom.GetSymbol()
        if fc == 0 or (fc == -1 and el in ("O", "S", "N")):
            continue
        penalty += 10 if el == "C" else 3 if (fc > 0 and el in ("O", "S")) else 1
    return penalty


def _formula(elements: Iterable[str], reduce_counts: bool = False) -> str:
    counts: dict[str, int] = {}
    for e in elements:
        counts[e] = counts.get(e, 0) + 1
    if reduce_counts:
        g = reduce(gcd, counts.values())
        counts = {e: c // g for e, c in counts.items()}
    order = sorted(counts, key=lambda e: (e in NON_METALS, e))
    return "".join(e + (str(counts[e]) if counts[e] > 1 else "") for e in order)


def split_framework(crystal: Crystal, tolerance: float = DEFAULT_BOND_TOLERANCE) -> tuple[str, list[str]]:
    """(node string, sorted distinct linker SMILES) of a framework's unit cell; RecordError if unclean."""
    if any(s.occ < 0.99 for s in crystal.sites):
        raise RecordError("partially occupied sites (disordered framework)")
    cart, bonds = periodic_bonds(crystal, tolerance)
    matrix = crystal.matrix()
    elements = [s.element for s in crystal.sites]
    metal = [e not in NON_METALS for e in elements]
    if not any(metal):
        raise RecordError("no metal atoms: not a metal-organic framework")
    organic_adj: dict[int, list] = {}
    organic_bonds: list[tuple[int, int]] = []
    for i, j, shift in bonds:
        if not metal[i] and not metal[j]:
            organic_adj.setdefault(i, []).append((j, np.array(shift)))
            organic_adj.setdefault(j, []).append((i, -np.array(shift)))
            organic_bonds.append((i, j))
    nonmetal_atoms = [a for a in range(len(elements)) if not metal[a]]
    linkers: set[str] = set()
    inorganic: set[int] = {a for a in range(len(elements)) if metal[a]}
    for members, offsets, dim in components(nonmetal_atoms, organic_adj):
        if not any(elements[a] == "C" for a in members):
            inorganic.update(members)
            continue
        if dim:
            raise RecordError(f"the organic part {_formula(elements[a] for a in members)} is polymeric "
                              f"({dim}D periodic) after cutting metal bonds")
        member_set = set(members)
        comp_bonds = [(i, j) for i, j in organic_bonds if i in member_set]
        linkers.add(_linker_smiles(members, offsets, crystal, cart, matrix, comp_bonds))
    if not linkers:
        raise RecordError("no organic linker (carbon-containing component) found")
    node_adj: dict[int, list] = {}
    for i, j, shift in bonds:
        if i in inorganic and j in inorganic:
            node_adj.setdefault(i, []).append((j, np.array(shift)))
            node_adj.setdefault(j, []).append((i, -np.array(shift)))
    parts = set()
    for members, _, dim in components(sorted(inorganic), node_adj):
        text = _formula((elements[a] for a in members), reduce_counts=bool(dim))
        parts.add(text + (f"{{{dim}D}}" if dim else ""))
    return ".".join(sorted(parts)), sorted(linkers)


# ---------------------------------------------------------------- grammar text
def encode_framework(node: str, linkers: list[str]) -> str:
    """The grammar text of a split framework: the node span, then one molecule span per linker."""
    return (OPEN + METAL_OPEN + node + METAL_CLOSE + "".join(MOL_OPEN + s + MOL_CLOSE for s in linkers) + CLOSE)


def parse_mof_text(text: str) -> tuple[str, list[str]]:
    """(node, linker SMILES) of the material span of a grammar text."""
    pieces = split_symbols(text)
    try:
        i = pieces.index(METAL_OPEN)
    except ValueError:
        raise RecordError("record holds no <MetalS> node") from None
    if i + 2 >= len(pieces) or pieces[i + 2] != METAL_CLOSE:
        raise RecordError("empty or unclosed <MetalS> node")
    return pieces[i + 1], molecules_in_text(text)
