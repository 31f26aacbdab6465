"""MOF generation metrics: valid, unique, novel and VNU of node + linker texts.

A MOF text (``<MaterialS><MetalS>node<MetalE><MoleculeS>linker<MoleculeE>...<MaterialE>``) is

- ``valid`` when (1) its node was seen in the training corpus (:func:`~logos.science.materials.validity.mof_validity`,
  reused: unknown when no training corpus is given, then only 2 and 3 count), (2) every linker parses
  (RDKit), and (3) its connection count is compatible: every linker carries at least two
  metal-binding groups (carboxylate or carboxylic acid, aromatic N with a free lone pair, azolate
  N-, phosphonate, sulfonate, nitrile, phenolate/alkoxide O-), so it can bridge two nodes;
- ``unique``: distinct valid MOFs / valid, the key being the node and the sorted canonical linkers;
- ``novel``: share of distinct valid MOFs whose key is absent from the training corpus;
- ``vnu``: distinct valid novel MOFs / all samples (valid, novel and unique).

Inputs: grammar JSONL (``text``), the ``.json`` of ``logos generate --task mof`` (node and linkers), or MOF CIFs (split into node and linkers by
:func:`~logos.science.materials.framework.split_framework`); the training corpus likewise, cached as keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from rdkit import Chem

from logos.science.chemistry import canonical_smiles, parse_smiles
from logos.evaluate import reference as ref
from logos.language.grammar import GrammarError, validate
from logos.science.materials.framework import encode_framework, parse_mof_text
from logos.science.materials.validity import mof_validity
from logos.util.records import InputError, RecordError

__all__ = ["SCHEMA_VERSION", "DEFINITIONS", "MofCorpus", "connection_points", "mof_key", "read_texts", "load_corpus",
           "evaluate"]

SCHEMA_VERSION = 1
DEFINITIONS = {
    "n": "samples", "valid": "share with a known node, parsing linkers and >= 2 binding groups per linker",
    "linkers_valid": "share whose linkers all parse", "node_known": "share whose node occurs in the training corpus",
    "connections_ok": "share whose every linker has >= 2 metal-binding groups",
    "unique": "distinct valid MOFs (node + sorted canonical linkers) / valid",
    "novel": "share of distinct valid MOFs absent from the training corpus",
    "vnu": "distinct valid novel MOFs / samples",
    "test_in_train": "reference MOFs whose key occurs in the training corpus",
}

_DONORS = ("[CX3](=O)[OX1-,OX2H1]", "[nX2;H0;+0]", "[n-]", "[PX4](=O)([O-,OH])[O-,OH]", "[SX4](=O)(=O)[O-,OH]",
           "[NX1]#[CX2]", "[O-;$(O[#6]);!$(O[#6]=O)]")


@lru_cache(maxsize=1)
def _patterns():
    return [Chem.MolFromSmarts(s) for s in _DONORS]


def connection_points(smiles: str) -> int:
    """Metal-binding groups of a linker (each carboxylate counts once)."""
    mol = Chem.MolFromSmiles(smiles)
    return 0 if mol is None else sum(len(mol.GetSubstructMatches(p)) for p in _patterns())


def mof_key(text: str) -> str | None:
    try:
        node, linkers = parse_mof_text(text)
        return node + "|" + ".".join(sorted(canonical_smiles(parse_smiles(s)) for s in linkers))
    except RecordError:
        return None


def read_texts(path: Path) -> list[str]:
    """MOF grammar texts of a JSONL, or of MOF CIFs (a file, a multi-block CIF, a folder) split into node + linkers."""
    path = Path(path)
    if path.name.endswith(".jsonl"):
        return [rec.get("text", "") for _, rec in ref.jsonl_records(path)]
    if path.name.endswith(".json"):  # the .json that logos generate / detokenize write: [{"id", "node", "linkers"}]
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InputError(f"{path}: not JSON ({e})") from None
        if not isinstance(doc, list) or not all(isinstance(r, dict) and "node" in r and "linkers" in r for r in doc):
            raise InputError(f"{path}: not a MOF .json (a list of {{\"id\", \"node\", \"linkers\"}} objects)")
        return [encode_framework(str(r["node"]), [str(s) for s in r["linkers"]]) for r in doc]
    from logos.science.materials.crystal import load, read_crystal_file
    from logos.science.materials.framework import split_framework

    files = sorted(p for p in path.iterdir() if p.suffix.lower() == ".cif") if path.is_dir() else [path]
    out = []
    for f in files:
        items = list(read_crystal_file(f))
        for item in ref.progress(items, len(items), f"splitting {f.name}", enabled=len(items) > 50 or None):
            try:
                out.append(encode_framework(*split_framework(load(item))))
            except RecordError:
                out.append("")
    return out


@dataclass
class MofCorpus:
    keys: set[str]
    nodes: set[str]


def load_corpus(spec: str | Path) -> MofCorpus:
    path = ref.resolve_reference(spec)
    keys = ref.cached_keys("mofs", path, lambda: [k for k in map(mof_key, read_texts(path)) if k])
    return MofCorpus(set(keys), {k.split("|", 1)[0] for k in keys})


def evaluate(texts: list[str], train: MofCorpus | None = None) -> dict:
    n = len(texts)
    rows = []
    for t in texts:
        try:
            validate(t)
            v = mof_validity(t, train.nodes if train is not None else None)
            v["connections_ok"] = v["linkers_valid"] and all(connection_points(s) >= 2 for s in parse_mof_text(t)[1])
        except (GrammarError, RecordError):
            v = {"valid": False, "linkers_valid": False, "node_known": None, "connections_ok": False}
        v["valid"] = bool(v["valid"] and v["connections_ok"])
        rows.append((mof_key(t) if v["valid"] else None, v))
    valid = [k for k, v in rows if v["valid"]]
    distinct = set(valid)
    rate = lambda f: sum(1 for _, v in rows if f(v)) / n if n else None  # noqa: E731
    m = {"n": n, "valid": rate(lambda v: v["valid"]), "linkers_valid": rate(lambda v: v["linkers_valid"]),
         "node_known": rate(lambda v: bool(v["node_known"])) if train is not None else None,
         "connections_ok": rate(lambda v: v["connections_ok"]),
         "unique": len(distinct) / len(valid) if valid else None}
    if train is not None:
        novel = distinct - train.keys
        m["novel"] = len(novel) / len(distinct) if distinct else None
        m["vnu"] = len(novel) / n if n else None
    return m
