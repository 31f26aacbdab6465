"""Pocket-conditioned ligand metrics: validity, QED, SA, Lipinski, diversity, and (optional) Vina docking scores.

The drug-likeness numbers are :mod:`logos.evaluate.molecules`' own (one implementation):
``validity``, ``uniqueness``, ``qed``, ``sa``, ``intdiv1``; ``lipinski``: share of valid ligands
breaking at most one of Lipinski's rules (MW <= 500, Crippen logP <= 5, H-bond donors <= 5,
acceptors <= 10; RDKit Lipinski counts).

Vina (``vina`` + ``meeko``, the optional extra ``logos[docking]``): the receptor is the reference
structure's protein (ATOM records) prepared by meeko's ``Polymer`` (residues meeko cannot template
are skipped, as its ``allow_bad_res`` does, and a residue it cannot build at all, e.g. one missing
side-chain atoms, is dropped and listed in ``vina_dropped_residues``); each valid ligand is protonated, embedded (RDKit
ETKDGv3, seed 0) and prepared by meeko; the box is centred on the pocket residues' heavy atoms
(the true pocket of the reference ligand) and spans them plus 4 A on each side (at least 20 A);
``exhaustiveness`` 8 by default, best pose's score in kcal/mol. A ligand that cannot be embedded,
prepared or docked is a docking failure: counted in ``vina_failures``, never dropped silently, and
``vina_mean`` is over docked ligands only.
"""

from __future__ import annotations

import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rdkit import Chem
from rdkit.Chem import Crippen, Descriptors, Lipinski

from logos.science.chemistry import molecules_in_text
from logos.evaluate import molecules
from logos.evaluate import reference as ref
from logos.util.records import InputError, RecordError

__all__ = ["LigandOptions", "SCHEMA_VERSION", "DEFINITIONS", "read_ligands", "lipinski_ok", "evaluate", "vina_scores"]

SCHEMA_VERSION = 1
DEFINITIONS = {
    "n": "ligands", "validity": "share RDKit parses", "uniqueness": "distinct canonical valid / valid",
    "qed": "mean QED", "sa": "mean SA score (RDKit Contrib)", "lipinski": "share of valid with <= 1 Lipinski violation",
    "intdiv1": "MOSES IntDiv of the valid ligands (Morgan r=2, 1024 bits)",
    "vina_mean": "mean best Vina score over docked ligands (kcal/mol)",
    "vina_docked": "ligands docked", "vina_failures": "valid ligands that could not be embedded, prepared or docked",
    "vina_dropped_residues": "receptor residues meeko could not build, left out of the receptor",
}


@dataclass(frozen=True)
class LigandOptions:
    vina: bool = False
    exhaustiveness: int = 8
    seed: int = 0


def read_ligands(path: Path) -> list[tuple[str, str | None]]:
    """(target id, ligand SMILES or None) of a JSONL (``id``, ``text``: the last molecule span) or SMILES/SDF file."""
    path = Path(path)
    if not path.name.endswith(".jsonl"):
        return [(path.stem, s) for s in molecules.read_molecules(path)]
    out = []
    for i, rec in ref.jsonl_records(path):
        ident = str(rec.get("id", i)).rpartition("#")[0] or str(rec.get("id", i))
        try:
            out.append((ident, molecules_in_text(rec.get("text", ""))[-1]))
        except (RecordError, IndexError):
            out.append((ident, rec.get("smiles")))
    return out


def lipinski_ok(mol: Chem.Mol) -> bool:
    broken = (Descriptors.MolWt(mol) > 500) + (Crippen.MolLogP(mol) > 5) + (Lipinski.NumHDonors(mol) > 5) \
        + (Lipinski.NumHAcceptors(mol) > 10)
    return broken <= 1


def _receptor(pdb: Path, dropped: list[str] | None = None) -> str:
    """Receptor PDBQT by meeko; a residue meeko cannot build (e.g. missing side-chain atoms) is dropped
    (named in ``dropped``), up to 20 of them."""
    import re

    from meeko import MoleculePreparation, PDBQTWriterLegacy, Polymer, ResidueChemTemplates

    lines = [l for l in open(pdb) if l.startswith(("ATOM", "TER", "END"))]
    for _ in range(20):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                poly = Polymer.from_pdb_string("".join(lines), ResidueChemTemplates.create_from_defaults(),
                                               MoleculePreparation(), allow_bad_res=True, default_altloc="A")
            return PDBQTWriterLegacy.write_from_polymer(poly)[0]
        except RuntimeError as e:
            bad = re.search(r"key (\w):(-?\d+)(\w?)", str(e))
            if not bad:
                raise
            chain, num, icode = bad.group(1), int(bad.group(2)), bad.group(3)
            if dropped is not None:
                dropped.append(f"{pdb.name}:{chain}:{num}{icode}")
            lines = [l for l in lines if not (l.startswith("ATOM") and l[21] == chain and int(l[22:26]) == num
                                              and l[26].strip() == icode)]
    raise RuntimeError(f"{pdb.name}: meeko cannot prepare the receptor")


def vina_scores(smiles: list[str], receptor_pdb: Path, pocket_xyz: np.ndarray,
                options: LigandOptions = LigandOptions(), dropped: list[str] | None = None) -> list[float | None]:
    """Best Vina score per ligand (None: a docking failure); residues left out of the receptor go to ``dropped``."""
    try:
        from meeko import MoleculePreparation, PDBQTWriterLegacy
        from vina import Vina
    except ImportError:
        raise InputError("Vina scores need vina and meeko: pip install 'logos[docking]'") from None
    from rdkit.Chem import AllChem

    import tempfile

    try:
        receptor = _receptor(Path(receptor_pdb), dropped)
    except Exception:  # a receptor meeko cannot prepare: every ligand of it is a docking failure
        return [None] * len(smiles)
    with tempfile.NamedTemporaryFile("w", suffix=".pdbqt", delete=False) as fh:
        fh.write(receptor)
        rec_path = fh.name
    centre = pocket_xyz.mean(axis=0)
    size = np.maximum(pocket_xyz.max(axis=0) - pocket_xyz.min(axis=0) + 8.0, 20.0)
    out: list[float | None] = []
    for s in smiles:
        try:
            mol = Chem.AddHs(Chem.MolFromSmiles(s))
            params = AllChem.ETKDGv3()
            params.randomSeed = options.seed
            if AllChem.EmbedMolecule(mol, params) != 0:
                raise RuntimeError("embedding failed")
            text, ok, err = PDBQTWriterLegacy.write_string(MoleculePreparation().prepare(mol)[0])
            if not ok:
                raise RuntimeError(err)
            v = Vina(sf_name="vina", cpu=1, seed=options.seed, verbosity=0)
            v.set_receptor(rec_path)
            v.set_ligand_from_string(text)
            v.compute_vina_maps(center=centre.tolist(), box_size=size.tolist())
            v.dock(exhaustiveness=options.exhaustiveness, n_poses=1)
            out.append(float(v.energies(n_poses=1)[0][0]))
        except Exception:  # any failure of embedding, preparation or docking is counted, not raised
            out.append(None)
    Path(rec_path).unlink(missing_ok=True)
    return out


def evaluate(ligands: list[tuple[str, str | None]], sites: list | None = None, structures: dict | None = None,
             options: LigandOptions = LigandOptions()) -> dict:
    """Ligand metrics; with ``options.vina``, ``sites`` (:func:`logos.evaluate.pockets.read_sites`) and
    ``structures`` (site name -> protein PDB path) give the receptors and boxes."""
    smiles = [s for _, s in ligands]
    mols = [m for m in (Chem.MolFromSmiles(s) if s else None for s in smiles) if m is not None]
    base = molecules.evaluate(smiles, options=molecules.MoleculeOptions(unique_at=()))
    canon = {Chem.MolToSmiles(m) for m in mols}
    m = {"n": len(ligands), "validity": base["validity"], "uniqueness": len(canon) / len(mols) if mols else None,
         "qed": base["qed"], "sa": base["sa"], "lipinski": sum(map(lipinski_ok, mols)) / len(mols) if mols else None,
         "intdiv1": base["intdiv1"]}
    if options.vina:
        if not sites or not structures:
            raise InputError("Vina scores need --references: the complexes whose pockets give the boxes")
        by_site = {s.name: s for s in sites}
        groups: dict[str, list[str]] = defaultdict(list)
        for target, s in ligands:
            if s and Chem.MolFromSmiles(s) is not None:
                groups[target].append(s)
        scores: list[float | None] = []
        dropped: list[str] = []
        for target, smis in groups.items():
            site = by_site.get(target) or by_site.get(target.removesuffix("_protein"))
            if site is None or not site.ligands:
                scores += [None] * len(smis)
                continue
            xyz = np.concatenate([site.residues[k] for k in site.ligands[0][1]])
            scores += vina_scores(smis, structures[site.name], xyz, options, dropped)
        done = [x for x in scores if x is not None]
        m.update(vina_mean=float(np.mean(done)) if done else None, vina_docked=len(done),
                 vina_failures=len(scores) - len(done), vina_dropped_residues=dropped)
    return m
