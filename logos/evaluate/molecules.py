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
  reference's mean and covariance cached as ``.npy``;
- ``snn_test``: MOSES SNN, the mean over valid samples of the Tanimoto similarity to the nearest
  reference molecule (Morgan radius 2, 1024 bits; two empty fingerprints count as similarity 1, as in
  MOSES); ``frag_test``: cosine similarity of the BRICS fragment counts (``FragmentOnBRICSBonds``,
  fragments as canonical SMILES, counted over all valid samples and all reference molecules);
  ``scaf_test``: cosine similarity of the Bemis-Murcko scaffold counts (scaffolds with at least two
  rings, MOSES's ``min_rings=2``). ``*_testsf``: the same against MOSES's scaffold-split test set
  (``moses-test-scaffolds``, used with the default reference). The reference's fingerprints (packed
  bits, ``.npy``), fragment and scaffold counts (JSON) are cached. Nearest-neighbour similarity is an
  integer matrix product of bit matrices (exact intersection counts), chunked over the samples and
  spread over ``workers`` processes with the filters and properties.

:func:`evaluate` is the one implementation: ``logos evaluate --task molecule`` and generation
summaries call it with SMILES in memory.
"""

from __future__ import annotations

import csv
import io
import math
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
from rdkit import Chem, DataStructs, RDConfig
from rdkit.Chem import AllChem, Crippen, Descriptors, rdFingerprintGenerator
from rdkit.Chem.Scaffolds import MurckoScaffold

from logos.science.chemistry import canonical, canonical_smiles, molecules_in_text, parse_smiles
from logos.evaluate import reference as ref
from logos.evaluate.stats import wasserstein
from logos.util.records import InputError, RecordError, open_text, plain_name

__all__ = ["MoleculeOptions", "MoleculeReference", "SCHEMA_VERSION", "DEFINITIONS", "evaluate", "canonical",
           "read_molecules", "load_reference", "load_train", "passes_filters", "sa_score", "properties",
           "internal_diversity", "fcd_score", "figures", "molecule_summary", "SimilarityReference",
           "load_similarity_reference", "fingerprint_bits", "nearest_similarity", "fragments", "scaffold",
           "cosine_similarity"]

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
    "snn_test": "MOSES SNN: mean Tanimoto similarity to the nearest reference molecule, Morgan r=2 1024 bits",
    "frag_test": "MOSES Frag: cosine similarity of BRICS fragment counts to the reference's",
    "scaf_test": "MOSES Scaf: cosine similarity of Bemis-Murcko scaffold counts (>= 2 rings) to the reference's",
    "snn_testsf": "MOSES SNN/TestSF: SNN against the scaffold-split test set",
    "frag_testsf": "MOSES Frag/TestSF: Frag against the scaffold-split test set",
    "scaf_testsf": "MOSES Scaf/TestSF: Scaf against the scaffold-split test set",
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
    workers: int = 1  # processes for the per-molecule scores (filters, QED, SA, logP, MW) and the similarities
    similarity: bool = True  # SNN, Frag, Scaf against the reference (and the scaffold-split set, when given)
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


def _packed(fp: DataStructs.ExplicitBitVect) -> np.ndarray:
    """A bit vector as packed 64-bit words (for subset tests of many patterns at once)."""
    return np.packbits(np.frombuffer(fp.ToBitString().encode("ascii"), np.uint8) - ord("0")).view(np.uint64)


@lru_cache(maxsize=None)
def _screen(kind: str) -> tuple[np.ndarray, tuple[Chem.Mol, ...]]:
    """The pattern fingerprints (packed, one row per pattern) of MOSES's filters or of QED's structural alerts."""
    from rdkit.Chem import QED

    pats = _filters() if kind == "filters" else tuple(QED.StructuralAlerts)
    return np.stack([_packed(Chem.PatternFingerprint(p)) for p in pats]), pats


def _candidates(mol: Chem.Mol, kind: str) -> list[Chem.Mol]:
    """The patterns of ``kind`` whose pattern fingerprint is a subset of ``mol``'s: the only ones that can match
    (RDKit's substructure screen, as ``SubstructLibrary`` uses it: it never drops a match)."""
    bits, pats = _screen(kind)
    mine = _packed(Chem.PatternFingerprint(mol))
    return [pats[i] for i in np.flatnonzero(~(bits & ~mine).any(1))]


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
        if any(h_mol.HasSubstructMatch(p) for p in _candidates(h_mol, "filters")):
            return False
    elif any(h_mol.HasSubstructMatch(p) for p in _filters()):
        return False
    smiles = Chem.MolToSmiles(mol, isomericSmiles=False)
    return bool(smiles) and Chem.MolFromSmiles(smiles) is not None


def qed_properties(mol: Chem.Mol):
    """RDKit's ``QED.properties`` (the same eight numbers), its structural alerts matched only where RDKit's pattern
    fingerprint screen allows (the tests compare it with RDKit's own on real molecules)."""
    from rdkit.Chem import MolSurf, QED
    from rdkit.Chem import rdMolDescriptors as rdmd

    mol = Chem.RemoveHs(mol)
    return QED.QEDproperties(
        MW=rdmd._CalcMolWt(mol), ALOGP=Crippen.MolLogP(mol),
        HBA=sum(len(mol.GetSubstructMatches(p)) for p in QED.Acceptors if mol.HasSubstructMatch(p)),
        HBD=rdmd.CalcNumHBD(mol), PSA=MolSurf.TPSA(mol),
        ROTB=rdmd.CalcNumRotatableBonds(mol, rdmd.NumRotatableBondsOptions.Strict),
        AROM=len(Chem.GetSSSR(Chem.DeleteSubstructs(Chem.Mol(mol), QED.AliphaticRings))),
        ALERTS=sum(1 for alert in _candidates(mol, "alerts") if mol.HasSubstructMatch(alert)))


def properties(mols: list[Chem.Mol]) -> dict[str, np.ndarray]:
    """QED, SA, logP, molecular weight of each molecule (logP and weight from QED's own when the molecule has no
    explicit hydrogen, whose removal QED starts with: the same numbers, computed once)."""
    from rdkit.Chem import QED

    out: dict[str, list] = {p: [] for p in PROPERTIES}
    for m in mols:
        q = qed_properties(m)
        out["qed"].append(QED.qed(m, qedProperties=q))
        out["sa"].append(sa_score(m))
        plain = all(a.GetAtomicNum() != 1 for a in m.GetAtoms())
        out["logp"].append(q.ALOGP if plain else Crippen.MolLogP(m))
        out["mw"].append(q.MW if plain else Descriptors.MolWt(m))
    return {p: np.array(v, dtype=float) for p, v in out.items()}


def fragments(mol: Chem.Mol) -> list[str]:
    """MOSES ``fragmenter``: the BRICS fragments of a molecule as canonical SMILES (with their dummy atoms)."""
    return Chem.MolToSmiles(AllChem.FragmentOnBRICSBonds(mol)).split(".")


def scaffold(mol: Chem.Mol, min_rings: int = 2) -> str | None:
    """MOSES ``compute_scaffold``: the Bemis-Murcko scaffold's canonical SMILES, None below ``min_rings`` rings."""
    try:
        core = MurckoScaffold.GetScaffoldForMol(mol)
    except (ValueError, RuntimeError):
        return None
    smiles = Chem.MolToSmiles(core)
    return smiles if smiles and core.GetRingInfo().NumRings() >= min_rings else None


def cosine_similarity(a: Counter, b: Counter) -> float | None:
    """MOSES ``cos_similarity`` of two count tables (None when either is empty)."""
    if not a or not b:
        return None
    dot = sum(v * b.get(k, 0) for k, v in a.items())
    return dot / (math.sqrt(sum(v * v for v in a.values())) * math.sqrt(sum(v * v for v in b.values())))


def _scores(smiles: list[str]) -> tuple[list[bool], dict[str, np.ndarray], Counter, Counter]:
    mols = [Chem.MolFromSmiles(s) for s in smiles]  # a canonical SMILES RDKit cannot read back fails (as in MOSES)
    good = [m for m in mols if m is not None]
    frags, scafs = Counter(), Counter()
    for m in good:
        frags.update(fragments(m))
        scafs[scaffold(m)] += 1
    scafs.pop(None, None)
    return [m is not None and passes_filters(m) for m in mols], properties(good), frags, scafs


def per_molecule(smiles: list[str], workers: int = 1) -> tuple[list[bool], dict[str, np.ndarray]]:
    """Filter pass and properties of canonical SMILES, in ``workers`` processes (chunks, order kept)."""
    passed, props, _, _ = _run_jobs(smiles, np.zeros((0, 1024), np.uint8), {}, workers, intdiv=False)[:4]
    return passed, props


# ---------------------------------------------------------------- fingerprints and Tanimoto similarity
def fingerprint_bits(mols: list[Chem.Mol], radius: int = 2, bits: int = 1024) -> np.ndarray:
    """Morgan fingerprints (MOSES's: radius 2, 1024 bits) as a (molecules, bits) matrix of 0/1 bytes."""
    gen = rdFingerprintGenerator.GetMorganGenerator(radius=radius, fpSize=bits)
    out = np.zeros((len(mols), bits), dtype=np.uint8)
    for i, m in enumerate(mols):
        out[i] = gen.GetFingerprintAsNumPy(m)
    return out


def _intersections(a, bt):
    """Exact |a_i & b_j| for 0/1 int8 tensors ``a`` (m, k) and ``bt`` (k, n): an int8 matrix product with int32
    sums (``torch._int_mm``, VNNI on CPUs that have it), else a float32 one (exact below 2^24)."""
    import torch

    if a.shape[0] > 16 and a.shape[1] % 8 == 0 and bt.shape[1] % 8 == 0 and hasattr(torch, "_int_mm"):
        try:
            return torch._int_mm(a, bt)
        except RuntimeError:  # an int8 kernel this build lacks
            pass
    return (a.float() @ bt.float()).round().to(torch.int32)


def _tanimoto(inter, na, nb):
    """Tanimoto from intersection counts and bit counts; two empty fingerprints are similar (1), as in MOSES."""
    import torch

    union = na[:, None] + nb[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1), torch.ones((), dtype=torch.float64))


class _Bits:
    """A fingerprint matrix ready for products: transposed int8 bits (padded to a multiple of 8 columns), bit counts,
    and (``by_count``) the columns sorted by bit count with the runs of equal counts (``groups``: start, stop, count)."""

    def __init__(self, bits: np.ndarray, by_count: bool = False):
        import torch

        counts = bits.sum(1, dtype=np.int64)
        self.groups = None
        self._blocks: dict = {}
        if by_count:
            order = np.argsort(counts, kind="stable")
            bits, counts = bits[order], counts[order]
            edges = np.flatnonzero(np.diff(counts)) + 1
            starts = np.concatenate([[0], edges]).astype(int)
            stops = np.concatenate([edges, [len(counts)]]).astype(int)
            self.groups = [(int(a), int(b), int(counts[a])) for a, b in zip(starts, stops)] if len(counts) else []
        n = len(bits)
        pad = (-n) % 8
        full = np.concatenate([bits, np.zeros((pad, bits.shape[1]), np.uint8)]) if pad else bits
        self.n = n
        self.t = torch.from_numpy(np.ascontiguousarray(full.T)).view(torch.int8)
        self.count = torch.from_numpy(np.concatenate([counts, np.zeros(pad, np.int64)])).double()

    def block(self, start: int, width: int):
        """Columns ``start:start + width`` of the transposed bits, contiguous (made once, kept)."""
        key = (start, width)
        if key not in self._blocks:
            self._blocks[key] = self.t[:, start:start + width].contiguous()
        return self._blocks[key]


def nearest_similarity(query: np.ndarray, reference: np.ndarray | _Bits, chunk: int = 512,
                       ref_chunk: int = 32768) -> np.ndarray:
    """For each row of ``query`` (0/1 bits), the largest Tanimoto similarity to a row of ``reference``.

    Among reference rows with the same bit count b, Tanimoto c / (a + b - c) grows with the intersection c, so
    the largest c of each such group decides: the reference is sorted by bit count and only the integer
    intersections are reduced (a max per group), then one exact division per group and query row."""
    import torch

    ref = reference if isinstance(reference, _Bits) else _Bits(reference, by_count=True)
    if ref.groups is None:
        raise ValueError("nearest_similarity needs a reference prepared with by_count=True")
    out = np.zeros(len(query))
    if not len(query) or not ref.n:
        return out
    for i in range(0, len(query), chunk):
        q = query[i:i + chunk]
        pad = max(0, 17 - len(q))  # the int8 product wants more than 16 rows
        qt = torch.from_numpy(np.concatenate([q, np.zeros((pad, q.shape[1]), np.uint8)]) if pad else q).view(torch.int8)
        a = q.sum(1, dtype=np.int64).astype(float)
        best = np.zeros(len(q))
        for j in range(0, ref.t.shape[1], ref_chunk):
            stop = min(j + ref_chunk, ref.n)
            if stop <= j:
                break
            inter = _intersections(qt, ref.block(j, ref_chunk))[:len(q)]
            for lo, hi, b in ref.groups:
                lo, hi = max(lo, j), min(hi, stop)
                if lo >= hi:
                    continue
                c = inter[:, lo - j:hi - j].amax(1).numpy().astype(float)
                union = a + b - c
                sim = np.divide(c, union, out=np.ones_like(c), where=union > 0)  # two empty fingerprints: 1 (MOSES)
                np.maximum(best, sim, out=best)
        out[i:i + len(q)] = best
    return out


def _similarity_sum(bits: np.ndarray, start: int, stop: int, prepared: _Bits | None = None) -> float:
    """Sum of Tanimoto similarities of rows ``start:stop`` with every later row (pairs i < j)."""
    import torch

    ref = prepared or _Bits(bits)
    first = start - start % 8  # columns from here on (a multiple of 8 for the int8 product)
    q = bits[start:stop]
    pad = max(0, 17 - len(q))
    qt = torch.from_numpy(np.concatenate([q, np.zeros((pad, q.shape[1]), np.uint8)]) if pad else q).view(torch.int8)
    inter = _intersections(qt, ref.t[:, first:].contiguous())[:len(q), :ref.n - first].double()
    sim = _tanimoto(inter, torch.from_numpy(q.sum(1, dtype=np.int64)).double(), ref.count[first:ref.n])
    later = torch.arange(first, ref.n)[None, :] > torch.arange(start, stop)[:, None]
    return float((sim * later).sum())


def internal_diversity(mols: list[Chem.Mol], radius: int = 2, bits: int = 1024,
                       total: float | None = None) -> tuple[float, float]:
    """(MOSES IntDiv over all ordered pairs incl. self, mean distance over distinct pairs); ``total``: the sum of
    similarities over pairs i < j when already computed."""
    n = len(mols)
    if n == 0:
        return float("nan"), float("nan")
    if total is None:
        total = _similarity_sum(fingerprint_bits(mols, radius, bits), 0, n)
    intdiv = 1.0 - (2 * total + n) / (n * n)
    pairwise = 1.0 - total / (n * (n - 1) / 2) if n > 1 else float("nan")
    return intdiv, pairwise


# ---------------------------------------------------------------- the work, in worker processes
_SHARED: dict = {}  # per process: the samples' bits and each reference's fingerprints (prepared on first use)


def _share(query: np.ndarray, references: dict[str, np.ndarray], worker: bool = False) -> None:
    if worker:  # a worker process of the pool: one torch thread (the pool is the parallelism)
        import torch

        torch.set_num_threads(1)
    _SHARED.clear()
    _SHARED.update(query=query, refs=references, prepared={})


def _prepared(name: str) -> _Bits:
    cache = _SHARED["prepared"]
    if name not in cache:
        bits = _SHARED["query"] if name == "" else np.unpackbits(_SHARED["refs"][name], axis=1)
        cache[name] = _Bits(bits, by_count=name != "")
    return cache[name]


def _job(job: tuple):
    t = time.process_time()
    kind, arg = job
    if kind == "scores":
        out = _scores(arg)
    elif kind == "snn":
        name, start, stop = arg
        out = nearest_similarity(_SHARED["query"][start:stop], _prepared(name))
    else:  # intdiv
        start, stop = arg
        out = _similarity_sum(_SHARED["query"], start, stop, _prepared(""))
    return kind, arg, out, time.process_time() - t


def _run_jobs(smiles: list[str], query: np.ndarray, references: dict[str, np.ndarray], workers: int,
              intdiv: bool = True):
    """Filters, properties, fragments and scaffolds of ``smiles``; nearest similarities of ``query`` to each
    packed reference; the IntDiv sum: as jobs over ``workers`` processes (in this process when 1)."""
    n = len(smiles)
    jobs: list[tuple] = []
    step_q = 512
    for name in references:
        jobs += [("snn", (name, i, min(i + step_q, len(query)))) for i in range(0, len(query), step_q)]
    if intdiv and len(query):  # rows early in the matrix have more later partners: smaller blocks there
        bounds, i = [], 0
        while i < len(query):
            size = max(64, int(1_000_000 / max(1, len(query) - i)) // 8 * 8)
            bounds.append((i, min(len(query), i + size)))
            i += size
        jobs += [("intdiv", b) for b in bounds]
    step = max(250, -(-n // max(1, workers * 8))) if n else 1
    jobs += [("scores", smiles[i:i + step]) for i in range(0, n, step)]
    cpu: dict[str, float] = Counter()
    results = []
    if workers <= 1 or len(jobs) < 2:
        _share(query, references)
        results = [_job(j) for j in jobs]
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers, mp_context=mp.get_context("fork"), initializer=_share,
                                 initargs=(query, references, True)) as pool:
            results = list(pool.map(_job, jobs))
    passed: list[bool] = []
    props: dict[str, list] = {p: [] for p in PROPERTIES}
    frags, scafs = Counter(), Counter()
    nearest: dict[str, list] = {name: [] for name in references}
    total = 0.0
    for kind, arg, out, seconds in results:
        cpu[kind] += seconds
        if kind == "scores":
            passed += out[0]
            for p in PROPERTIES:
                props[p].append(out[1][p])
            frags.update(out[2])
            scafs.update(out[3])
        elif kind == "snn":
            nearest[arg[0]].append(out)
        else:
            total += out
    merged = {p: np.concatenate(v) if v else np.zeros(0) for p, v in props.items()}
    sims = {name: np.concatenate(v) if v else np.zeros(0) for name, v in nearest.items()}
    return passed, merged, frags, scafs, sims, total, dict(cpu)


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


@dataclass
class SimilarityReference:
    """What SNN, Frag and Scaf compare with: a reference's packed fingerprint bits, fragment and scaffold counts."""

    path: Path
    bits: np.ndarray  # (molecules, bits / 8) uint8, np.packbits of fingerprint_bits
    fragments: Counter
    scaffolds: Counter


def _reference_stats(smiles: list[str], radius: int, bits: int) -> tuple[np.ndarray, Counter, Counter]:
    mols = [m for m in (Chem.MolFromSmiles(s) for s in smiles if s) if m is not None]
    frags, scafs = Counter(), Counter()
    for m in mols:
        frags.update(fragments(m))
        scafs[scaffold(m)] += 1
    scafs.pop(None, None)
    return np.packbits(fingerprint_bits(mols, radius, bits), axis=1), frags, scafs


def load_similarity_reference(spec: str | Path, options: MoleculeOptions = MoleculeOptions()) -> SimilarityReference:
    """A reference set's fingerprints, BRICS fragment and scaffold counts over its readable records as stored (MOSES
    computes them on the test set as given), computed once (in ``options.workers`` processes) and cached."""
    path = ref.resolve_reference(spec)
    tag = f"-r{options.fingerprint_radius}-b{options.fingerprint_bits}"
    built: dict = {}

    def build(key: str):
        if not built:
            raw = [s for s in read_molecules(path) if s]
            step = max(1000, -(-len(raw) // max(1, options.workers * 8)))
            chunks = [raw[i:i + step] for i in range(0, len(raw), step)]
            args = [(c, options.fingerprint_radius, options.fingerprint_bits) for c in chunks]
            if options.workers > 1 and len(chunks) > 1:
                import multiprocessing as mp
                from concurrent.futures import ProcessPoolExecutor

                with ProcessPoolExecutor(options.workers, mp_context=mp.get_context("fork")) as pool:
                    parts = list(pool.map(_reference_stats, *zip(*args)))
            else:
                parts = [_reference_stats(*a) for a in args]
            built["bits"] = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, options.fingerprint_bits // 8),
                                                                                       np.uint8)
            built["fragments"] = sum((p[1] for p in parts), Counter())
            built["scaffolds"] = sum((p[2] for p in parts), Counter())
        return built[key]
    packed = ref.cached_array(f"molfp{tag}", path, lambda: build("bits"))
    frags = Counter(ref.cached_json("molfrag", path, lambda: dict(build("fragments"))))
    scafs = Counter(ref.cached_json("molscaf", path, lambda: dict(build("scaffolds"))))
    return SimilarityReference(path, packed, frags, scafs)


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
             details: dict | None = None, scaffolds: str | Path | None = None) -> dict:
    """All molecule metrics of raw SMILES in memory (None entries: unreadable records, counted invalid).

    ``reference``: the test set (property distances, FCD, SNN/Frag/Scaf); ``train``: canonical SMILES
    or a file (novelty, contamination); ``scaffolds``: MOSES's scaffold-split test set (the ``*_testsf``
    similarities). ``details``, when given, receives per-stage seconds and the arrays the figures need.
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
    query = fingerprint_bits(mols, options.fingerprint_radius, options.fingerprint_bits)
    seconds["parse"] = time.perf_counter() - t
    t = time.perf_counter()
    similar: dict[str, SimilarityReference] = {}
    if options.similarity:
        for name, spec in (("test", reference.path if reference is not None else None), ("testsf", scaffolds)):
            if spec is not None:
                similar[name] = load_similarity_reference(spec, options)
    seconds["similarity_references"] = time.perf_counter() - t
    t = time.perf_counter()
    passed, props, frags, scafs, nearest, total, cpu = _run_jobs(
        canon, query, {k: r.bits for k, r in similar.items()}, options.workers)
    seconds["scores"] = time.perf_counter() - t
    seconds.update({f"cpu_{k}": v for k, v in cpu.items()})
    m["intdiv1"], m["mean_pairwise_distance"] = internal_diversity(mols, total=total)
    m["filters"] = sum(passed) / len(mols) if mols else None
    for p in PROPERTIES:
        m[p] = float(props[p].mean()) if len(mols) else None
    for p in PROPERTIES:
        m[f"w_{p}"] = wasserstein(props[p], reference.props[p]) if reference is not None else None
    for name, r in similar.items():
        m[f"snn_{name}"] = float(nearest[name].mean()) if len(mols) else None
        m[f"frag_{name}"] = cosine_similarity(r.fragments, frags)
        m[f"scaf_{name}"] = cosine_similarity(r.scaffolds, scafs)
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
