"""Binding-site prediction metrics: residue precision/recall/F1, DCC and DCA success, top-n and top-(n+2).

Ground truth per structure (:mod:`logos.domains.structure`, the encoder's own reading): its ligands
(an ``X_ligand.sdf`` beside ``X_protein.pdb``, PoseBusters' layout; else the structure's qualifying
hetero groups, as in HOLO4K and COACH420 files: at least 6 heavy atoms, not water, ion, buffer or
glycan) and, per ligand, its pocket: residues with a heavy atom within ``pocket_cutoff`` (5 A, the
encoder's ``--pocket-cutoff``) of a ligand heavy atom.

Predictions (``.pocket.csv`` / ``.pocket.json`` as ``logos detokenize`` and ``logos generate``
write them): per record id ``STEM#R`` (rank R, default 1) a set of residues (chain, author number,
insertion code). The predicted pocket's centre is the centroid of those residues' heavy atoms.

- ``precision``/``recall``/``f1``: of the top-1 pocket's residues against the true pocket of the
  ligand nearest to its centre, averaged over structures (a structure with no prediction: 0, 0, 0);
- ``dcc``: share of ligands with a predicted pocket centre within 4 A of the ligand's centre (mean
  of its heavy atoms) among the top-n pockets of its structure, n = the structure's ligand count
  (``dcc_top_n2``: among the top n+2); ``dca``: the same with the distance from the centre to the
  ligand's nearest heavy atom (P2Rank's and LOGOS's convention).

Reference layouts: a folder of ``X_protein.pdb`` + ``X_ligand.sdf`` pairs (``logos fetch
posebusters-complexes``); a folder of PDB files with their ligands as HETATM (HOLO4K, COACH420);
or P2Rank's ``.ds`` list file (one structure path per line, relative to the file; ``#`` comments and
``HEADER:`` lines skipped), which is how HOLO4K (``holo4k.ds``) and COACH420 (``coach420.ds``) ship.
"""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from logos.util.records import InputError, RecordError, plain_name

__all__ = ["PocketOptions", "Site", "SCHEMA_VERSION", "DEFINITIONS", "read_sites", "read_predictions",
           "residue_scores", "evaluate", "structure_files", "site_name"]

SCHEMA_VERSION = 1
DEFINITIONS = {
    "structures": "reference structures", "ligands": "reference ligands",
    "precision": "top-1 pocket: predicted residues in the true pocket / predicted residues (mean over structures)",
    "recall": "top-1 pocket: true pocket residues predicted / true pocket residues (mean over structures)",
    "f1": "harmonic mean of precision and recall per structure, averaged",
    "dcc": "share of ligands with a top-n pocket centre within 4 A of the ligand centre (n = ligands)",
    "dcc_top_n2": "the same among the top n+2 pockets",
    "dca": "share of ligands with a top-n pocket centre within 4 A of a ligand heavy atom",
    "dca_top_n2": "the same among the top n+2 pockets",
}


@dataclass(frozen=True)
class PocketOptions:
    pocket_cutoff: float = 5.0
    success_distance: float = 4.0


ResKey = tuple[str, int, str]


@dataclass
class Site:
    """One structure of the reference: residue coordinates and its ligands (atoms, pocket residues)."""

    name: str
    residues: dict[ResKey, np.ndarray]  # heavy-atom coordinates per residue
    ligands: list[tuple[np.ndarray, set[ResKey]]]


def site_name(path: Path) -> str:
    from logos.domains.protein import structure_stem as protein_stem

    return protein_stem(path).removesuffix("_protein")


def structure_files(spec: Path) -> list[Path]:
    spec = Path(spec)
    if spec.is_file() and spec.suffix == ".ds":
        out = []
        for line in spec.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith(("#", "HEADER")):
                out.append(spec.parent / line.split()[0])
        return out
    if spec.is_dir():
        return sorted(p for p in spec.iterdir() if plain_name(p).endswith((".pdb", ".ent", ".cif"))
                      and "_ligand" not in p.name)
    return [spec]


def read_sites(spec: Path, options: PocketOptions = PocketOptions()) -> list[Site]:
    """Reference structures with their ligands and true pockets (see the module docstring)."""
    from rdkit import Chem

    from logos.domains.structure import pocket_contacts, read_structure

    sites = []
    for path in structure_files(spec):
        try:
            st = read_structure(path)
        except (RecordError, InputError, OSError, ValueError) as e:
            raise InputError(f"{path}: {e}") from None
        keys = [(ch.name, r.number, r.icode) for ch in st.chains for r in ch.residues]
        residues = {(ch.name, r.number, r.icode): r.coords for ch in st.chains for r in ch.residues}
        sdf = path.parent / (site_name(path) + "_ligand.sdf")
        if sdf.exists():
            ligs = [m.GetConformer().GetPositions()[[a.GetIdx() for a in m.GetAtoms() if a.GetAtomicNum() > 1]]
                    for m in Chem.SDMolSupplier(str(sdf)) if m is not None]
        else:
            ligs = [np.array([a.pos.tolist() for a in res if a.element.name not in ("H", "D")]) for res in st.ligand_residues]
        index = {(c, r): (ch.name, res.number, res.icode) for c, ch in enumerate(st.chains)
                 for r, res in enumerate(ch.residues)}
        ligands = [(xyz, {index[k] for k in pocket_contacts(st, xyz, options.pocket_cutoff, 0.0)}) for xyz in ligs]
        if keys:
            sites.append(Site(site_name(path), residues, ligands))
    return sites


def _base(ident: str) -> tuple[str, int]:
    base, sep, r = ident.rpartition("#")
    return (base, int(r)) if sep and r.isdigit() else (ident, 1)


def read_predictions(path: Path) -> dict[str, dict[int, set[ResKey]]]:
    """structure id -> rank -> predicted residues, from ``.pocket.csv`` or ``.pocket.json``."""
    path = Path(path)
    out: dict[str, dict[int, set[ResKey]]] = defaultdict(lambda: defaultdict(set))
    try:
        if path.name.endswith(".json"):
            for rec in json.loads(path.read_text()):
                name, rank = _base(str(rec["id"]))
                out[name][rank] |= {(r["chain"], int(r["number"]), r.get("icode", "")) for r in rec["residues"]}
        else:
            with open(path, newline="") as fh:
                for row in csv.DictReader(fh):
                    name, rank = _base(row["id"])
                    out[name][rank].add((row["chain"], int(row["res_num"]), row.get("icode") or ""))
    except (KeyError, ValueError, TypeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a .pocket.csv/.pocket.json file ({type(e).__name__}: {e})") from None
    return out


def residue_scores(predicted: set, true: set) -> tuple[float, float, float]:
    """(precision, recall, F1) of a predicted residue set."""
    tp = len(predicted & true)
    p = tp / len(predicted) if predicted else 0.0
    r = tp / len(true) if true else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def _match_name(name: str, predictions: dict) -> dict[int, set[ResKey]]:
    for key in (name, name.lower(), name.upper(), f"{name}_protein"):
        if key in predictions:
            return predictions[key]
    for key, ranked in predictions.items():  # logos generate names a structure input's answers by its file name
        if site_name(Path(key)) == name:
            return ranked
    return {}


def evaluate(sites: list[Site], predictions: dict[str, dict[int, set[ResKey]]],
             options: PocketOptions = PocketOptions()) -> dict:
    """Pocket metrics of ranked predicted residue sets against the reference sites."""
    prf = []
    success = {"dcc": 0, "dcc_top_n2": 0, "dca": 0, "dca_top_n2": 0}
    n_lig = 0
    for site in sites:
        ranked = _match_name(site.name, predictions)
        centres = []
        for rank in sorted(ranked):
            xyz = [site.residues[k] for k in ranked[rank] if k in site.residues]
            centres.append(np.concatenate(xyz).mean(axis=0) if xyz else None)
        if ranked and site.ligands:
            top = ranked[min(ranked)]
            c0 = centres[0]
            near = (min(site.ligands, key=lambda l: np.linalg.norm(l[0].mean(0) - c0)) if c0 is not None
                    else site.ligands[0])
            prf.append(residue_scores(top, near[1]))
        elif site.ligands:
            prf.append((0.0, 0.0, 0.0))
        n = len(site.ligands)
        for xyz, _ in site.ligands:
            n_lig += 1
            centre = xyz.mean(axis=0)
            for k, label in ((n, ""), (n + 2, "_top_n2")):
                cs = [c for c in centres[:k] if c is not None]
                if any(np.linalg.norm(c - centre) <= options.success_distance for c in cs):
                    success["dcc" + label] += 1
                if any(np.linalg.norm(xyz - c, axis=1).min() <= options.success_distance for c in cs):
                    success["dca" + label] += 1
    m: dict = {"structures": len(sites), "ligands": n_lig}
    for i, name in enumerate(("precision", "recall", "f1")):
        m[name] = float(np.mean([t[i] for t in prf])) if prf else None
    for k, v in success.items():
        m[k] = v / n_lig if n_lig else None
    return m
