"""Ligands with bond orders: the chemical component dictionary (CCD) for hetero residues, or an SDF/MOL2 pose.

**Ligand bond orders** come from the PDB Chemical Component Dictionary shipped inside
``biotite==1.6.0`` (``structure/info/components.bcif``), matched to the model's atoms by atom
name; charges also come from the CCD. A component missing from the CCD, a model atom the CCD
does not list, a CCD heavy atom missing from the model (a partial ligand; atoms the CCD flags as
leaving atoms may be absent, as in covalently bound ligands), or a molecule RDKit
cannot sanitize is an error for that ligand - bond orders are never guessed from geometry. A
ligand is one hetero residue: multi-residue ligands (oligosaccharides, peptide inhibitors) are
not joined.

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

from logos.records import RecordError

__all__ = ["Ligand", "ccd_mol", "ligand_from_mol"]


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


@functools.lru_cache(maxsize=None)
def _ccd_component(name: str):
    try:
        import biotite.structure.info as info
    except ImportError:  # pragma: no cover - biotite is a dependency
        raise RecordError("ligand bond orders need biotite==1.6.0 (the CCD); it is not installed") from None
    try:
        return info.residue(name)
    except (KeyError, ValueError):
        return None


@functools.lru_cache(maxsize=1)
def _ccd_atom_table():
    from biotite.structure.info.ccd import get_ccd

    cat = get_ccd()["chem_comp_atom"]
    return (cat["comp_id"].as_array(), cat["atom_id"].as_array(), cat["pdbx_leaving_atom_flag"].as_array())


@functools.lru_cache(maxsize=None)
def _leaving_atoms(name: str) -> frozenset[str]:
    """Atoms the CCD flags as leaving (lost when the component bonds covalently): they may be absent."""
    comp, atom, flag = _ccd_atom_table()
    rows = np.nonzero(comp == name)[0]
    return frozenset(str(atom[i]) for i in rows if str(flag[i]).upper() == "Y")


# biotite.structure.BondType -> RDKit (Kekule form for the aromatic_* kinds). 0 (ANY) and
# 8 (COORDINATION) have no bond order and are refused.
_BOND_TYPES = {1: Chem.BondType.SINGLE, 2: Chem.BondType.DOUBLE, 3: Chem.BondType.TRIPLE,
               4: Chem.BondType.QUADRUPLE, 5: Chem.BondType.SINGLE, 6: Chem.BondType.DOUBLE,
               7: Chem.BondType.TRIPLE, 9: Chem.BondType.AROMATIC}
_AROMATIC = 9


def ccd_mol(res: gemmi.Residue) -> tuple[Chem.Mol, list[str]]:
    """RDKit molecule of one hetero residue, bond orders and charges from the CCD, model coordinates."""
    comp = _ccd_component(res.name)
    if comp is None:
        raise RecordError(f"ligand {res.name}: not in the chemical component dictionary (no bond orders)")
    ccd_index = {str(n): i for i, n in enumerate(comp.atom_name) if comp.element[i] not in ("H", "D")}
    names, xyz = _heavy(res)
    missing = [n for n in names if n not in ccd_index]
    if missing:
        raise RecordError(f"ligand {res.name}: atoms {missing[:4]} are not in its CCD entry")
    unmodelled = sorted(set(ccd_index) - set(names) - _leaving_atoms(res.name))
    if unmodelled:  # a fragment's SMILES would not be the ligand's: refuse rather than write it
        raise RecordError(f"ligand {res.name}: {len(unmodelled)} heavy atoms of its CCD entry are not modelled "
                          f"({', '.join(unmodelled[:4])})")
    rw = Chem.RWMol()
    conf = Chem.Conformer(len(names))
    local = {}
    for k, n in enumerate(names):
        i = ccd_index[n]
        element = str(comp.element[i]).capitalize()
        atom = Chem.Atom(element)
        atom.SetFormalCharge(int(comp.charge[i]))
        local[i] = rw.AddAtom(atom)
        conf.SetAtomPosition(local[i], Point3D(*map(float, xyz[k])))
    for i, j, kind in comp.bonds.as_array():
        i, j, kind = int(i), int(j), int(kind)
        if i in local and j in local:
            if kind not in _BOND_TYPES:
                raise RecordError(f"ligand {res.name}: CCD bond {comp.atom_name[i]}-{comp.atom_name[j]} "
                                  f"has no usable bond order (type {kind})")
            rw.AddBond(local[i], local[j], _BOND_TYPES[kind])
            if kind == _AROMATIC:
                rw.GetAtomWithIdx(local[i]).SetIsAromatic(True)
                rw.GetAtomWithIdx(local[j]).SetIsAromatic(True)
    mol = rw.GetMol()
    mol.AddConformer(conf, assignId=True)
    try:
        Chem.SanitizeMol(mol)
        Chem.AssignStereochemistryFrom3D(mol)
    except Exception as e:  # RDKit raises several sanitization exception types
        raise RecordError(f"ligand {res.name}: RDKit cannot sanitize it ({' '.join(str(e).split())})") from None
    return mol, names


def ligand_from_mol(mol: Chem.Mol, label: str) -> Ligand:
    """A ligand read from an SDF/MOL2 record (hydrogens removed, 3D conformer required)."""
    mol = Chem.RemoveHs(mol)
    if mol.GetNumConformers() == 0 or not mol.GetConformer().Is3D():
        raise RecordError(f"ligand {label}: no 3D coordinates (a pocket needs the bound pose)")
    # Atom names: MOL2 atom names when the file has them, else element + 1-based heavy-atom index.
    names = [a.GetProp("_TriposAtomName") if a.HasProp("_TriposAtomName") else a.GetSymbol() + str(a.GetIdx() + 1)
             for a in mol.GetAtoms()]
    return Ligand(mol, label, names)
