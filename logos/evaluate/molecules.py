"""Molecule generation metrics as MOSES defines them: validity, unique@k, novelty, IntDiv, filters, FCD, SA, QED.

Definitions (MOSES, Polykovskiy et al. 2020, ``molsets==0.3.1``; its code is read, never imported:
``import moses`` is broken on Python 3.11):

- ``validity``: share of samples RDKit parses (an unreadable record counts as invalid);
- ``unique@1000``/``unique@10000``: distinct canonical SMILES among the first k *valid* samples,
  divided by k (by the number of valid samples when fewer; the report says so);
- ``novelty``: share of distinct valid molecules absent from the training set (canonical SMILES);
- ``intdiv1``: MOSES IntDiv, 1 - mean Tanimoto over all ordered pairs of valid samples including
  each molecule with itself, Morgan radius 2, 1024 bits (MOSES's ``fingerprint`` default; the bit
  count is an option); ``mean_pairwise_distance``: the same over distinct pairs only (i != j);
- ``filters``: share of valid samples passing MOSES's ``mol_passes_filters``: no ring of 8 or more
  atoms, no charged atom, only C N S O F Cl Br H, none of the SMARTS of MOSES's own ``mcf.csv`` and
  ``wehi_pains.csv`` (read from the pinned wheel by :mod:`logos.data.datasets`) on the molecule with explicit H;
- ``qed``, ``sa``, ``logp``, ``mw``: means over valid samples (RDKit QED; the SA score of RDKit
  Contrib ``SA_Score/sascorer.py``, whose fragment table is RDKit's own shipped file; Crippen logP;
  average molecular weight), and ``w_*``: the 1-D Wasserstein distance of each property's
  distribution to the reference's (MOSES's property metrics), reference statistics computed on a
  seeded sample (``property_sample``) and cached;
- ``fcd``: Fréchet ChemNet Distance (``fcd`` package, an optional extra ``logos[fcd]``) of the
  canonical valid samples against a seeded sample of the reference (``fcd_sample``), the
  reference's mean and covariance cached as ``.npy``.

:func:`evaluate` is the one implementation: ``logos evaluate --task molecule`` and generation
summaries call it with SMILES in memory.
"""

from __future__ import annotations

import csv
import io
import random
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from rdkit import Chem, DataStructs, RDConfig
from rdkit.Chem import Crippen, Descriptors, rdFingerprintGenerator
from rdkit.Chem.QED import qed as _qed

from logos.science.chemistry import canonical, canonical_smiles, molecules_in_text, parse_smiles
from logos.evaluate import reference as ref
from logos.evaluate.stats import wasserstein
from logos.util.records import InputError, RecordError, open_text, plain_name

__all__ = ["MoleculeOptions", "MoleculeReference", "SCHEMA_VERSION", "DEFINITIONS", "evaluate", "canonical",
           "read_molecules", "load_reference", "load_train", "passes_filters", "sa_score", "properties",
           "internal_diversity", "fcd_score", "figures", "molecule_summary"]

SCHEMA_VERSION = 1
PROPERTIES = ("qed", "sa", "logp", "mw")
DEFINITIONS = {
    "n": "samples read",
    "validity": "share of samples RDKit parses",
    "unique@1000": "distinct canonical SMILES among the first 1,000 valid samples / 1,000 (MOSES)",
    "unique@10000": "distinct canonical SMILES among the first 10,000 valid samples / 10,000 (MOSES)",
    "novelty": "share of distinct valid molecules not in the training set (canonical SMILES)",
    "intdiv1": "MOSES IntDiv: 1 - mean Tanimoto over all ordered pairs incl. self, Morgan r=2",
    "mean_pairwise_distance": "mean Tanimoto distance over distinct pairs, Morgan r=2",
    "filters": "share of valid samples passing MOSES filters (mcf.csv + wehi_pains.csv, charge, atoms, rings)",
    "qed": "mean QED (RDKit)", "sa": "mean SA score (RDKit Contrib sascorer)", "logp": "mean Crippen logP",
    "mw": "mean molecular weight",
    "w_qed": "Wasserstein-1 distance of QED to the reference", "w_sa": "Wasserstein-1 distance of SA",
    "w_logp": "Wasserstein-1 distance of logP", "w_mw": "Wasserstein-1 distance of molecular weight",
    "fcd": "Fréchet ChemNet Distance to the reference (fcd package)",
    "test_in_train": "reference (test) molecules whose canonical SMILES occur in the training set",
}


@dataclass(frozen=True)
class MoleculeOptions:
    """How molecules are scored (defaults: MOSES)."""

    fingerprint_bits: int = 1024
    fingerprint_radius: int = 2
    unique_at: tuple[int, ...] = (1000, 10000)
    fcd: bool = False
    fcd_sample: int = 10_000  # reference molecules through ChemNet (0: all)
    property_sample: int = 10_000  # reference molecules for property distributions (0: all)
    train_as_given: bool = False  # novelty against the training SMILES as stored (MOSES), not canonicalized
    workers: int = 1  # processes for the per-molecule scores (filters, QED, SA, logP, MW)
    seed: int = 0


# ---------------------------------------------------------------- reading
def ranked_by_likelihood(predictions: Path) -> bool:
    """Whether the samples beside ``predictions`` (``NAME.samples.jsonl`` of ``logos generate``) are written in
    decreasing log-probability: a file ranked by likelihood, whose first k samples are no unbiased draw."""
    path = Path(predictions)
    samples = path.with_name(path.name.split(".")[0] + ".samples.jsonl")
    if path.name.endswith(".samples.jsonl") or not samples.exists():
        return False
    logps = [float(rec["logprob"]) for _, rec in ref.jsonl_records(samples)
             if rec.get("written", True) and isinstance(rec.get("logprob"), (int, float))]
    return len(logps) >= 20 and len(set(logps)) > 1 and all(a >= b for a, b in zip(logps, logps[1:]))


def read_molecules(path: Path) -> list[str | None]:
    """Raw SMILES per record of ``.smi``/``.txt``/``.csv``/``.sdf``/``.jsonl`` (None: an unreadable record)."""
    path = Path(path)
    name = plain_name(path)
    if name.endswith((".sdf", ".mol")):
        out: list[str | None] = []
        with open(path, "rb") as fh:
            for mol in Chem.ForwardSDMolSupplier(fh):
                out.append(Chem.MolToSmiles(mol) if mol is not None else None)
        return out
    if name.endswith(".jsonl"):
        return [_record_smiles(rec) for _, rec in ref.jsonl_records(path)]
    with open_text(path) as fh:
        if name.endswith((".csv", ".tsv")):
            rows = list(csv.reader(fh, delimiter="\t" if name.endswith(".tsv") else ","))
            if not rows:
                return []
            header = [h.strip().lower() for h in rows[0]]
            col = next((header.index(c) for c in ("smiles", "canonical_smiles", "smi") if c in header), None)
            if col is None:
                raise InputError(f"{path}: no smiles column in the header {rows[0]}")
            return [(r[col].strip() or None) if len(r) > col else None for r in rows[1:]]
        out = []
        for line in fh:
            parts = line.split()
            if not parts or parts[0].lower() == "smiles":
                continue
            out.append(parts[0])
        return out


def _record_smiles(rec: dict) -> str | None:
    """The first molecule span of a record's grammar text (or its ``smiles`` field)."""
    text = rec.get("text")
    if text is None:
        return rec.get("smiles")
    try:
        return molecules_in_text(text)[0]
    except (RecordError, IndexError):
        return None


# ---------------------------------------------------------------- per-molecule scores
@lru_cache(maxsize=1)
def _sascorer():
    contrib = str(Path(RDConfig.RDContribDir) / "SA_Score")
    if contrib not in sys.path:
        sys.path.append(contrib)
    import sascorer  # RDKit Contrib (Ertl & Schuffenhauer 2009); its fragment table ships in the RDKit wheel

    sascorer.readFragmentScores()
    return sascorer


def sa_score(mol: Chem.Mol) -> float:
    return float(_sascorer().calculateScore(mol))


@lru_cache(maxsize=1)
def _screened_filters() -> tuple[tuple[DataStructs.ExplicitBitVect, Chem.Mol], ...]:
    return tuple((Chem.PatternFingerprint(p), p) for p in _filters())


@lru_cache(maxsize=1)
def _filters() -> tuple[Chem.Mol, ...]:
    from logos.data.datasets import package_archive, read_member

    archive = package_archive("molsets", "0.3.1")
    smarts = [row["smarts"] for row in csv.DictReader(io.StringIO(read_member(archive, "moses/metrics/mcf.csv").decode()))]
    smarts += [row[0] for row in csv.reader(io.StringIO(read_member(archive, "moses/metrics/wehi_pains.csv").decode()))
               if row]
    pats = tuple(Chem.MolFromSmarts(s.strip()) for s in smarts)
    if any(p is None for p in pats):
        raise RuntimeError("a MOSES filter SMARTS does not parse")
    return pats


_ALLOWED = frozenset({"C", "N", "S", "O", "F", "Cl", "Br", "H"})


def passes_filters(mol: Chem.Mol, screen: bool = True) -> bool:
    """MOSES ``mol_passes_filters`` (rings >= 8, charges, atom types, MCF and PAINS SMARTS).

    ``screen``: a SMARTS is matched only when its RDKit pattern fingerprint is a subset of the
    molecule's (the substructure screen of RDKit's ``SubstructLibrary``; it never drops a match),
    much faster than matching all ~230 patterns; the tests compare it with ``screen=False``.
    """
    if any(len(r) >= 8 for r in mol.GetRingInfo().AtomRings()):
        return False
    if any(a.GetFormalCharge() != 0 for a in mol.GetAtoms()):
        return False
    if any(a.GetSymbol() not in _ALLOWED for a in mol.GetAtoms()):
        return False
    h_mol = Chem.AddHs(mol)
    if screen:
        fp = Chem.PatternFingerprint(h_mol)
        if any(DataStructs.AllProbeBitsMatch(q, fp) and h_mol.HasSubstructMatch(p) for q, p in _screened_filters()):
            return False
    elif any(h_mol.HasSubstructMatch(p) for p in _filters()):
        return False
    smiles = Chem.MolToSmiles(mol, isomericSmiles=False)
    return bool(smiles) and Chem.MolFromSmiles(smiles) is not None


def properties(mols: list[Chem.Mol]) -> dict[str, np.ndarray]:
    """QED, SA, logP, molecular weight of each molecule."""
    return {"qed": np.array([_qed(m) for m in mols]), "sa": np.array([sa_score(m) for m in mols]),
            "logp": np.array([Crippen.MolLogP(m) for m in mols]), "mw": np.array([Descriptors.MolWt(m) for m in mols])}


def _scores(smiles: list[str]) -> tuple[list[bool], dict[str, np.ndarray]]:
    mols = [Chem.MolFromSmiles(s) for s in smiles]  # a canonical SMILES RDKit cannot read back fails (as in MOSES)
    return [m is not None and passes_filters(m) for m in mols], properties([m for m in mols if m is not None])


def per_molecule(smiles: list[str], workers: int = 1) -> tuple[list[bool], dict[str, np.ndarray]]:
    """Filter pass and properties of canonical SMILES, in ``workers`` processes (chunks, order kept)."""
    if workers <= 1 or len(smiles) < 2000:
        return _scores(smiles)
    from concurrent.futures import ProcessPoolExecutor

    step = -(-len(smiles) // (workers * 4))
    chunks = [smiles[i:i + step] for i in range(0, len(smiles), step)]
    with ProcessPoolExecutor(workers) as pool:
        parts = list(pool.map(_scores, chunks))
    return ([x for f, _ in parts for x in f],
            {p: np.concatenate([d[p] for _, d in parts]) for p in PROPERTIES})


def internal_diversity(mols: list[Chem.Mol], radius: int = 2, bits: int = 1024) -> tuple[float, float]:
    """(MOSES IntDiv over all ordered pairs incl. self, mean distance over distinct pairs)."""
    n = len(mols)
    if n == 0:
        return float("nan"), float("nan")
    gen = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=bits)
    fps = [gen.GetFingerprint(m) for m in mols]
    total = 0.0  # sum of similarities over i < j
    for i in range(n - 1):
        total += float(np.sum(DataStructs.BulkTanimotoSimilarity(fps[i], fps[i + 1:])))
    intdiv = 1.0 - (2 * total + n) / (n * n)
    pairwise = 1.0 - total / (n * (n - 1) / 2) if n > 1 else float("nan")
    return intdiv, pairwise


# ---------------------------------------------------------------- references
@dataclass
class MoleculeReference:
    """A reference set: canonical SMILES (valid, first occurrence order) and cached property samples."""

    path: Path
    smiles: list[str]
    props: dict[str, np.ndarray]

    @property
    def keys(self) -> set[str]:
        return set(self.smiles)


def _canonical_all(path: Path) -> list[str]:
    raw = read_molecules(path)
    seen: dict[str, None] = {}
    for s in ref.progress(raw, len(raw), f"canonicalizing {path.name}"):
        c = canonical(s)
        if c is not None:
            seen.setdefault(c, None)
    return list(seen)


def _sample(items: list, k: int, seed: int) -> list:
    return items if not k or k >= len(items) else random.Random(seed).sample(items, k)


def load_train(spec: str | Path, as_given: bool = False) -> set[str]:
    """Canonical SMILES of a training set (cached); ``as_given``: the file's SMILES uncanonicalized.

    ``as_given`` is MOSES's own novelty (its training set is stored canonical): on MOSES test,
    176,038 of 176,074 stored SMILES equal RDKit 2026.09's canonical form (0.02% differ), and it
    skips canonicalizing 1.6M molecules once (about 30 min on one core).
    """
    path = ref.resolve_reference(spec)
    if as_given:
        return {s for s in read_molecules(path) if s}
    return set(ref.cached_keys("molecules", path, lambda: _canonical_all(path)))


def load_reference(spec: str | Path, options: MoleculeOptions = MoleculeOptions()) -> MoleculeReference:
    """A reference set with its property distributions (both cached)."""
    path = ref.resolve_reference(spec)
    smiles = ref.cached_keys("molecules", path, lambda: _canonical_all(path))
    tag = f"-n{options.property_sample}-s{options.seed}"

    def build(name: str):
        mols = [Chem.MolFromSmiles(s) for s in _sample(smiles, options.property_sample, options.seed)]
        return properties([m for m in mols if m is not None])[name]
    props = {p: ref.cached_array(f"molprop-{p}{tag}", path, lambda p=p: build(p)) for p in PROPERTIES}
    return MoleculeReference(path, smiles, props)


# ---------------------------------------------------------------- FCD
def fcd_score(smiles: list[str], reference: MoleculeReference, options: MoleculeOptions = MoleculeOptions()) -> float:
    """FCD of canonical SMILES against the reference (its ChemNet statistics cached)."""
    try:
        from fcd import calculate_frechet_distance, get_predictions, load_ref_model
    except ImportError:
        raise InputError("FCD needs the fcd package: pip install 'logos[fcd]'") from None
    model = load_ref_model()
    tag = f"-n{options.fcd_sample}-s{options.seed}"

    def activations():
        return get_predictions(model, _sample(reference.smiles, options.fcd_sample, options.seed))
    acts = None

    def stat(which):
        nonlocal acts
        if acts is None:
            acts = activations()
        return acts.mean(0) if which == "mu" else np.cov(acts.T)
    mu = ref.cached_array(f"fcd-mu{tag}", reference.path, lambda: stat("mu"))
    sigma = ref.cached_array(f"fcd-sigma{tag}", reference.path, lambda: stat("sigma"))
    gen = get_predictions(model, smiles)
    return float(calculate_frechet_distance(gen.mean(0), np.cov(gen.T), mu, sigma))


# ---------------------------------------------------------------- the metrics
def evaluate(smiles: list[str | None], reference: MoleculeReference | str | Path | None = None,
             train: set[str] | str | Path | None = None, options: MoleculeOptions = MoleculeOptions(),
             details: dict | None = None) -> dict:
    """All molecule metrics of raw SMILES in memory (None entries: unreadable records, counted invalid).

    ``reference``: the test set (property distances, FCD); ``train``: canonical SMILES or a file
    (novelty, contamination). ``details``, when given, receives per-stage seconds and the arrays
    the figures need.
    """
    t0 = time.perf_counter()
    if reference is not None and not isinstance(reference, MoleculeReference):
        reference = load_reference(reference, options)
    if train is not None and not isinstance(train, set):
        train = load_train(train, options.train_as_given)
    seconds = {"references": time.perf_counter() - t0}
    n = len(smiles)
    t = time.perf_counter()
    mols, canon = [], []
    for s in smiles:
        mol = None
        if s:
            try:
                mol = parse_smiles(s)
            except RecordError:
                pass
        if mol is not None:
            mols.append(mol)
            canon.append(canonical_smiles(mol))
    unique = list(dict.fromkeys(canon))
    m: dict = {"n": n, "validity": len(mols) / n if n else None}
    for k in options.unique_at:
        m[f"unique@{k}"] = len(set(canon[:k])) / min(k, len(canon)) if canon else None
    m["novelty"] = (len([c for c in unique if c not in train]) / len(unique) if unique else None) if train is not None else None
    seconds["parse"] = time.perf_counter() - t
    t = time.perf_counter()
    m["intdiv1"], m["mean_pairwise_distance"] = internal_diversity(mols, options.fingerprint_radius,
                                                                   options.fingerprint_bits)
    seconds["diversity"] = time.perf_counter() - t
    t = time.perf_counter()
    passed, props = per_molecule(canon, options.workers)
    m["filters"] = sum(passed) / len(mols) if mols else None
    for p in PROPERTIES:
        m[p] = float(props[p].mean()) if len(mols) else None
    for p in PROPERTIES:
        m[f"w_{p}"] = wasserstein(props[p], reference.props[p]) if reference is not None else None
    seconds["filters_properties"] = time.perf_counter() - t
    if options.fcd:
        t = time.perf_counter()
        m["fcd"] = fcd_score(canon, reference, options) if reference is not None and canon else None
        seconds["fcd"] = time.perf_counter() - t
    if reference is not None and train is not None:
        m["test_in_train"] = sum(1 for s in reference.smiles if s in train)
    if details is not None:
        details.update(seconds=seconds, props=props, unique=unique, n_valid=len(mols),
                       reference_props=reference.props if reference is not None else None)
    return {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in m.items()}


def figures(details: dict) -> dict:
    """Figure callables for :func:`logos.evaluate.report.write_report`: a molecule grid and histograms."""
    from logos.evaluate.report import histograms

    refp = details.get("reference_props") or {}

    def grid(path: Path) -> bool:
        from rdkit.Chem import Draw

        mols = [Chem.MolFromSmiles(s) for s in details["unique"][:24]]
        mols = [x for x in mols if x is not None]
        if not mols:
            return False
        Draw.MolsToGridImage(mols, molsPerRow=6, subImgSize=(200, 200)).save(str(path))
        return True
    series = {p: (details["props"][p], refp.get(p)) for p in PROPERTIES}
    return {"molecules": grid, "properties": histograms(series, "valid samples vs reference")}


def molecule_summary(result, reference: Path | None = None) -> str:
    """Validity, uniqueness, (with a reference SMILES file) novelty, and MOSES's IntDiv, filters, QED and SA of
    generated molecules (``result``: a :class:`logos.generate.GenerateResult`): the numbers of ``logos evaluate --task
    molecule`` (:func:`evaluate`)."""
    smiles = []
    for s in result.samples:
        try:
            smiles.append(molecules_in_text(s.text)[0] if s.written else None)
        except (RecordError, IndexError):
            smiles.append(None)
    r = evaluate(smiles, train=reference)
    valid = round(r["validity"] * r["n"])
    unique = round(r["unique@10000"] * valid)
    line = f"valid {valid} ({r['validity']:.1%}), unique {unique} ({r['unique@10000']:.1%})"
    if reference is not None and r.get("novelty") is not None:
        line += f", novel {round(r['novelty'] * unique)} ({r['novelty']:.1%} of unique)"
    if valid:
        line += (f"; IntDiv {r['intdiv1']:.3f}, filters {r['filters']:.1%}, QED {r['qed']:.3f}, SA {r['sa']:.2f}"
                 " (as logos evaluate)")
    return line
