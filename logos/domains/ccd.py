"""Ligands with bond orders: the chemical component dictionary (CCD), a user template, or perceived geometry; or an SDF/MOL2 pose.

**Ligand bond orders**, in this order of precedence (the record's ``meta.ligand.bond_orders`` says
which one was used, and ``dropped_atoms`` / ``unmodelled_atoms`` what was left out):

1. ``template``: ``--ligand-smiles CODE=SMILES[,CODE=SMILES]`` or an SDF file whose titles are
   the codes; for ligands outside the CCD (a predicted complex's ``LIG1``) or to override it. The
   model's connectivity is perceived from geometry (RDKit ``DetermineConnectivity``) and matched
   as a graph (elements and bonds, orders ignored) onto the template; orders and charges come from
   the template. The model may be a part of the template (a covalent ligand that lost a leaving
   group): the template's other atoms are listed as unmodelled.
2. ``ccd``: the PDB Chemical Component Dictionary shipped inside ``biotite==1.6.0``
   (``structure/info/components.bcif``, read through the prebuilt index of
   :mod:`logos.domains.ccd_index`), matched by atom name; charges also come from the CCD. A
   covalent, partly reacted ligand keeps the atoms its CCD entry knows: model atoms the entry
   does not name are dropped (``dropped_atoms``), entry atoms the model lacks are listed
   (``unmodelled_atoms``; leaving atoms are expected to be missing and are not listed). When
   fewer than half of the model's atoms carry CCD names (old or renamed atom names), the CCD
   entry is used as a template instead (``ccd-graph``).
3. ``perceived`` (only with ``--perceive-bonds``): RDKit's geometry-based perception
   (``rdDetermineBonds.DetermineBonds``, xyz2mol) when the ligand has its hydrogens; without them,
   connectivity from RDKit and double bonds from bond lengths and planarity (shortest first, at
   most one per atom, only where valence allows), charges where valence needs them. A guess: the
   record says so. Without the flag a ligand with no CCD entry and no template is an error that
   names both options.

Metal–ligand bonds (hemes, metal cofactors) are written as dative bonds (``N->Fe``, which the
grammar's SMILES allows) where the donor would otherwise exceed its valence. A ligand is one
hetero residue: multi-residue ligands (oligosaccharides, peptide inhibitors) are not joined.

A ligand read from an SDF/MOL2 file instead (:func:`ligand_from_mol`) keeps the file's bond orders;
its hydrogens are removed and it must have 3D coordinates (the bound pose).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import gemmi
import numpy as np
from rdkit import Chem
from rdkit.Geometry import Point3D

from logos.domains.ccd_index import component as _ccd_component
from logos.util.records import RecordError

__all__ = ["Ligand", "ccd_mol", "ligand_from_mol", "templates"]


@dataclass
class Ligand:
    """A ligand with bond orders: an RDKit molecule (heavy atoms, one conformer) and its label."""

    mol: Chem.Mol
    label: str  # "TQ3 A/1001" or "lig.sdf#1"
    atom_names: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def coords(self) -> np.ndarray:
        return self.mol.GetConformer().GetPositions()



def _heavy(res: gemmi.Residue) -> tuple[list[str], np.ndarray]:
    names, xyz = [], []
    for atom in res:
        if atom.element.name not in ("H", "D"):
            names.append(atom.name)
            xyz.append((atom.pos.x, atom.pos.y, atom.pos.z))
    return names, np.array(xyz, dtype=float).reshape(-1, 3)


# biotite.structure.BondType -> RDKit (Kekule form for the aromatic_* kinds). 0 (ANY) and
# 8 (COORDINATION) have no bond order and are refused.
_BOND_TYPES = {1: Chem.BondType.SINGLE, 2: Chem.BondType.DOUBLE, 3: Chem.BondType.TRIPLE,
               4: Chem.BondType.QUADRUPLE, 5: Chem.BondType.SINGLE, 6: Chem.BondType.DOUBLE,
               7: Chem.BondType.TRIPLE, 9: Chem.BondType.AROMATIC}
_AROMATIC = 9


_METALS = frozenset("""Li Be Na Mg Al K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Rb Sr Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn
Cs Ba La Ce Pr Nd Sm Eu Gd Tb Dy Ho Er Tm Yb Lu Hf Ta W Re Os Ir Pt Au Hg Tl Pb Bi""".split())
_DONOR_VALENCE = {"N": 3, "O": 2, "S": 2, "P": 3}


def _dative_metal_bonds(rw: Chem.RWMol) -> int:
    """Metal bonds that would push the donor past its valence become dative donor->metal; how many."""
    n = 0
    for bond in list(rw.GetBonds()):
        a, b = bond.GetBeginAtom(), bond.GetEndAtom()
        if (a.GetSymbol() in _METALS) == (b.GetSymbol() in _METALS):
            continue
        donor, metal = (b, a) if a.GetSymbol() in _METALS else (a, b)
        limit = _DONOR_VALENCE.get(donor.GetSymbol())
        if limit is None:
            continue
        valence = sum(bd.GetBondTypeAsDouble() for bd in donor.GetBonds()) + donor.GetFormalCharge()
        if valence > limit:
            i, j = donor.GetIdx(), metal.GetIdx()
            rw.RemoveBond(i, j)
            rw.AddBond(i, j, Chem.BondType.DATIVE)
            n += 1
    return n


def _finish(rw: Chem.RWMol, label: str, meta: dict) -> Chem.Mol:
    """Dative metal bonds, sanitize, stereo from the 3D pose."""
    if _dative_metal_bonds(rw):
        meta["dative_bonds"] = True
    mol = rw.GetMol()
    try:
        Chem.SanitizeMol(mol)
        Chem.AssignStereochemistryFrom3D(mol)
    except Exception as e:  # RDKit raises several sanitization exception types
        raise RecordError(f"ligand {label}: RDKit cannot sanitize it ({' '.join(str(e).split())[:120]})") from None
    return mol


def _model_mol(elements: list[str], xyz: np.ndarray) -> Chem.RWMol:
    """Atoms at their model positions, bonds from geometry (single, orders unknown)."""
    from rdkit.Chem import rdDetermineBonds

    rw = Chem.RWMol()
    conf = Chem.Conformer(len(elements))
    for k, e in enumerate(elements):
        rw.AddAtom(Chem.Atom(e))
        conf.SetAtomPosition(k, Point3D(*map(float, xyz[k])))
    rw.AddConformer(conf, assignId=True)
    rdDetermineBonds.DetermineConnectivity(rw)
    for atom in rw.GetAtoms():
        atom.SetNoImplicit(False)
        atom.SetNumExplicitHs(0)
    return rw


def _generic(mol: Chem.Mol) -> Chem.Mol:
    g = Chem.RWMol(mol)
    for atom in g.GetAtoms():
        atom.SetFormalCharge(0)
        atom.SetIsAromatic(False)
        atom.SetNoImplicit(True)
    for bond in g.GetBonds():
        bond.SetBondType(Chem.BondType.SINGLE)
        bond.SetIsAromatic(False)
    return g.GetMol()


def _from_template(rw: Chem.RWMol, template: Chem.Mol, label: str, meta: dict) -> Chem.Mol:
    """Bond orders and charges of ``template`` on the model's perceived graph (the model may be a part of it)."""
    tpl = Chem.RemoveHs(template)
    Chem.Kekulize(tpl, clearAromaticFlags=True)
    match = _generic(tpl).GetSubstructMatch(_generic(rw.GetMol()))
    if not match:
        raise RecordError(f"ligand {label}: its atoms and geometric bonds do not match the template "
                          f"{Chem.MolToSmiles(template)[:60]!r}")
    for bond in rw.GetBonds():
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        bond.SetBondType(tpl.GetBondBetweenAtoms(match[i], match[j]).GetBondType())
    for k, atom in enumerate(rw.GetAtoms()):
        atom.SetFormalCharge(tpl.GetAtomWithIdx(match[k]).GetFormalCharge())
    missing = tpl.GetNumAtoms() - len(match)
    if missing:
        meta["unmodelled_atoms"] = missing
    return _finish(rw, label, meta)


def _perceive(rw: Chem.RWMol, xyz: np.ndarray, label: str, meta: dict, with_h: bool) -> Chem.Mol:
    """Bond orders from geometry (see the module docstring); ``meta["bond_orders"] = "perceived"``."""
    meta["bond_orders"] = "perceived"
    if with_h:
        from rdkit.Chem import rdDetermineBonds

        try:
            rdDetermineBonds.DetermineBondOrders(rw, charge=0, allowChargedFragments=True)
            return Chem.RemoveHs(_finish(rw, label, meta))
        except (ValueError, RuntimeError, RecordError):
            pass  # fall back to the heavy-atom rule below
    single = {("C", "C"): 1.54, ("C", "N"): 1.47, ("C", "O"): 1.43, ("N", "N"): 1.45, ("N", "O"): 1.40,
              ("C", "S"): 1.82, ("O", "P"): 1.60, ("O", "S"): 1.57}
    valence = {"C": 4, "N": 3, "O": 2, "S": 2, "P": 5}
    heavy = [a.GetIdx() for a in rw.GetAtoms() if a.GetSymbol() != "H"]
    degree = {i: sum(1 for n in rw.GetAtomWithIdx(i).GetNeighbors() if n.GetSymbol() != "H") for i in heavy}
    candidates = []
    for bond in rw.GetBonds():
        a, b = bond.GetBeginAtom(), bond.GetEndAtom()
        key = tuple(sorted((a.GetSymbol(), b.GetSymbol())))
        if key not in single or any(degree[x.GetIdx()] >= valence[x.GetSymbol()] for x in (a, b)):
            continue
        d = float(np.linalg.norm(xyz[a.GetIdx()] - xyz[b.GetIdx()]))
        if d < single[key] - 0.09:  # clearly shorter than a single bond
            candidates.append((d / single[key], bond.GetIdx()))
    used: set[int] = set()
    for _, k in sorted(candidates):
        bond = rw.GetBondWithIdx(k)
        i, j = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        if i not in used and j not in used:
            bond.SetBondType(Chem.BondType.DOUBLE)
            used.update((i, j))
    for atom in rw.GetAtoms():
        if atom.GetSymbol() == "N" and sum(b.GetBondTypeAsDouble() for b in atom.GetBonds()) > 3:
            atom.SetFormalCharge(1)
    return Chem.RemoveHs(_finish(rw, label, meta))


def ccd_mol(res: gemmi.Residue, template: Chem.Mol | None = None,
            perceive: bool = False) -> tuple[Chem.Mol, list[str], dict]:
    """RDKit molecule of one hetero residue with model coordinates, its atom names and how its bond
    orders were found (``meta``; see the module docstring for the order of sources)."""
    label = res.name
    names, xyz = _heavy(res)
    elements = [a.element.name.capitalize() for a in res if a.element.name not in ("H", "D")]
    if template is not None:
        meta: dict = {"bond_orders": "template"}
        return _from_template(_model_mol(elements, xyz), template, label, meta), names, meta
    comp = _ccd_component(res.name)
    if comp is None:
        if perceive:
            return _perceived(res, names, xyz, elements, label)
        raise RecordError(f"ligand {res.name}: not in the chemical component dictionary; give its bond orders "
                          f"with --ligand-smiles {res.name}=SMILES, or --perceive-bonds to guess them from geometry")
    ccd_index = {n: i for i, n in enumerate(comp.atom_names)}  # heavy atoms only
    known = [k for k, n in enumerate(names) if n in ccd_index]
    if len(known) * 2 < len(names):  # old or renamed atom names: match the CCD entry as a graph
        meta = {"bond_orders": "ccd-graph"}
        try:
            return _from_template(_model_mol(elements, xyz), _component_mol(res.name), label, meta), names, meta
        except RecordError:
            if perceive:
                return _perceived(res, names, xyz, elements, label)
            raise
    meta = {"bond_orders": "ccd"}
    dropped = [n for n in names if n not in ccd_index]
    unmodelled = sorted(set(ccd_index) - set(names) - comp.leaving)
    if dropped:
        meta["dropped_atoms"] = dropped
    if unmodelled:
        meta["unmodelled_atoms"] = unmodelled
    names = [names[k] for k in known]
    xyz = xyz[known]
    rw = Chem.RWMol()
    conf = Chem.Conformer(len(names))
    local = {}
    for k, n in enumerate(names):
        i = ccd_index[n]
        atom = Chem.Atom(comp.elements[i].capitalize())
        atom.SetFormalCharge(comp.charges[i])
        local[i] = rw.AddAtom(atom)
        conf.SetAtomPosition(local[i], Point3D(*map(float, xyz[k])))
    for i, j, kind in comp.bonds:
        if i in local and j in local:
            if kind not in _BOND_TYPES:
                raise RecordError(f"ligand {res.name}: CCD bond {comp.atom_names[i]}-{comp.atom_names[j]} "
                                  f"has no usable bond order (type {kind})")
            rw.AddBond(local[i], local[j], _BOND_TYPES[kind])
            if kind == _AROMATIC:
                rw.GetAtomWithIdx(local[i]).SetIsAromatic(True)
                rw.GetAtomWithIdx(local[j]).SetIsAromatic(True)
    rw.AddConformer(conf, assignId=True)
    return _finish(rw, label, meta), names, meta


def _perceived(res, names, xyz, elements, label) -> tuple[Chem.Mol, list[str], dict]:
    meta: dict = {}
    with_h = any(a.element.name in ("H", "D") for a in res)
    if with_h:
        all_xyz = np.array([a.pos.tolist() for a in res], dtype=float)
        rw = _model_mol([a.element.name.capitalize() if a.element.name != "D" else "H" for a in res], all_xyz)
        return _perceive(rw, all_xyz, label, meta, True), names, meta
    return _perceive(_model_mol(elements, xyz), xyz, label, meta, False), names, meta


@functools.lru_cache(maxsize=256)
def _component_mol(name: str) -> Chem.Mol:
    """The CCD entry as an RDKit molecule (heavy atoms, CCD bond orders and charges), for graph matching."""
    comp = _ccd_component(name)
    rw = Chem.RWMol()
    local = {}
    for i, e in enumerate(comp.elements):
        atom = Chem.Atom(e.capitalize())
        atom.SetFormalCharge(comp.charges[i])
        local[i] = rw.AddAtom(atom)
    for i, j, kind in comp.bonds:
        if kind in _BOND_TYPES:
            rw.AddBond(local[i], local[j], _BOND_TYPES[kind])
            if kind == _AROMATIC:
                for x in (i, j):
                    rw.GetAtomWithIdx(local[x]).SetIsAromatic(True)
    _dative_metal_bonds(rw)
    mol = rw.GetMol()
    Chem.SanitizeMol(mol)
    return mol


@functools.lru_cache(maxsize=64)
def templates(spec: str | None) -> dict[str, Chem.Mol]:
    """``--ligand-smiles``: ``CODE=SMILES[,CODE=SMILES...]`` or an SDF file whose record titles are the codes."""
    if not spec:
        return {}
    out: dict[str, Chem.Mol] = {}
    if spec.lower().endswith((".sdf", ".sdf.gz", ".mol")):
        from pathlib import Path

        from logos.util.records import open_text

        with open_text(Path(spec)) as fh:
            for block in fh.read().split("$$$$"):
                mol = Chem.MolFromMolBlock(block.lstrip("\n"), sanitize=True) if block.strip() else None
                if mol is not None and mol.GetProp("_Name").strip():
                    out[mol.GetProp("_Name").strip()] = mol
        if not out:
            raise RecordError(f"--ligand-smiles {spec}: no named molecules in the file")
        return out
    for part in spec.split(","):
        code, sep, smiles = part.strip().partition("=")
        mol = Chem.MolFromSmiles(smiles) if sep else None
        if mol is None:
            raise RecordError(f"--ligand-smiles: {part.strip()[:60]!r} is not CODE=SMILES with a valid SMILES")
        out[code.strip()] = mol
    return out


def ligand_from_mol(mol: Chem.Mol, label: str) -> Ligand:
    """A ligand read from an SDF/MOL2 record (hydrogens removed, 3D conformer required)."""
    mol = Chem.RemoveHs(mol)
    if mol.GetNumConformers() == 0 or not mol.GetConformer().Is3D():
        raise RecordError(f"ligand {label}: no 3D coordinates (a pocket needs the bound pose)")
    # Atom names: MOL2 atom names when the file has them, else element + 1-based heavy-atom index.
    names = [a.GetProp("_TriposAtomName") if a.HasProp("_TriposAtomName") else a.GetSymbol() + str(a.GetIdx() + 1)
             for a in mol.GetAtoms()]
    return Ligand(mol, label, names)
