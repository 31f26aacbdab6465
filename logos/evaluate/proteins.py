"""Protein generation metrics: uniqueness, amino-acid composition and length against a reference, identity to training.

- ``uniqueness``: distinct sequences / sequences;
- ``aa_js_divergence``: Jensen-Shannon divergence (base 2, in [0, 1]) between the amino-acid
  composition of the samples and of the reference (the 20 standard residues; others ignored);
- ``length_mean``, ``length_w1``: mean length and the Wasserstein-1 distance of the length
  distribution to the reference's;
- ``identity_mean`` (and ``identity_max``): per sample, the identity to its nearest training sequence,
  averaged (and the largest). Identity is that of a global alignment (Biopython ``PairwiseAligner``,
  BLOSUM62, gap open -10, extend -0.5): identical aligned pairs / alignment columns (gaps included).
  Only a shortlist is aligned: the ``shortlist`` training sequences sharing the most distinct 3-mers
  with the sample (a k-mer prefilter, as MMseqs2 and BLAST do), so the nearest is exact whenever it
  is in the shortlist.

Inputs: FASTA, or grammar JSONL (``<ProteinS>...<ProteinE>``; the first chain of each record).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from logos.evaluate import reference as ref
from logos.evaluate.stats import js_divergence, wasserstein
from logos.util.records import InputError, RecordError

__all__ = ["ProteinOptions", "SCHEMA_VERSION", "DEFINITIONS", "read_sequences", "load_set", "identity",
           "nearest_identity", "evaluate"]

SCHEMA_VERSION = 1
AMINO = "ACDEFGHIKLMNPQRSTVWY"
DEFINITIONS = {
    "n": "sequences", "uniqueness": "distinct sequences / sequences",
    "aa_js_divergence": "Jensen-Shannon divergence (base 2) of amino-acid composition to the reference",
    "length_mean": "mean length", "length_w1": "Wasserstein-1 distance of lengths to the reference",
    "identity_mean": "mean global-alignment identity to the nearest training sequence (3-mer shortlist)",
    "identity_max": "largest identity to a training sequence",
    "test_in_train": "reference sequences occurring verbatim in the training set",
}


@dataclass(frozen=True)
class ProteinOptions:
    k: int = 3
    shortlist: int = 10


def read_sequences(path: Path) -> list[str]:
    path = Path(path)
    if path.name.endswith(".jsonl"):
        from logos.domains.protein import parse_chains

        out = []
        for _, rec in ref.jsonl_records(path):
            try:
                chains = parse_chains(rec.get("text", ""))
                out.append(chains[0].sequence if chains else "")
            except RecordError:
                out.append("")
        return out
    from Bio import SeqIO

    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    out = []
    for f in files:
        with ref.open_any(f) as fh:
            out += [str(r.seq).upper().rstrip("*") for r in SeqIO.parse(fh, "fasta")]
    if not out:
        raise InputError(f"{path}: no FASTA records")
    return out


def load_set(spec: str | Path) -> list[str]:
    path = ref.resolve_reference(spec)
    return ref.cached_keys("proteins", path, lambda: read_sequences(path))


def _composition(seqs: list[str]) -> np.ndarray:
    c = Counter("".join(seqs))
    v = np.array([c[a] for a in AMINO], dtype=float)
    return v / v.sum() if v.sum() else v


_ALIGNER = None


def identity(a: str, b: str) -> float:
    """Identical aligned pairs / alignment columns of the best global alignment (BLOSUM62, -10/-0.5)."""
    global _ALIGNER
    if _ALIGNER is None:
        from Bio.Align import PairwiseAligner, substitution_matrices

        _ALIGNER = PairwiseAligner(mode="global", substitution_matrix=substitution_matrices.load("BLOSUM62"),
                                   open_gap_score=-10, extend_gap_score=-0.5)
    if not a or not b:
        return 0.0
    aln = _ALIGNER.align(a, b)[0]
    counts = aln.counts()
    return counts.identities / aln.length if aln.length else 0.0


class _KmerIndex:
    def __init__(self, seqs: list[str], k: int):
        self.seqs, self.k = seqs, k
        self.index: dict[str, list[int]] = defaultdict(list)
        for i, s in enumerate(seqs):
            for kmer in {s[j:j + k] for j in range(len(s) - k + 1)}:
                self.index[kmer].append(i)

    def shortlist(self, query: str, n: int) -> list[int]:
        hits: Counter = Counter()
        for kmer in {query[j:j + self.k] for j in range(len(query) - self.k + 1)}:
            hits.update(self.index.get(kmer, ()))
        return [i for i, _ in hits.most_common(n)]


def nearest_identity(queries: list[str], train: list[str], options: ProteinOptions = ProteinOptions()) -> list[float]:
    index = _KmerIndex(train, options.k)
    out = []
    for q in ref.progress(queries, len(queries), "nearest training sequence", enabled=len(queries) > 200 or None):
        out.append(max((identity(q, train[i]) for i in index.shortlist(q, options.shortlist)), default=0.0))
    return out


def evaluate(seqs: list[str], reference: list[str] | None = None, train: list[str] | None = None,
             options: ProteinOptions = ProteinOptions()) -> dict:
    seqs = [s for s in seqs]
    n = len(seqs)
    m: dict = {"n": n, "uniqueness": len(set(seqs)) / n if n else None,
               "length_mean": float(np.mean([len(s) for s in seqs])) if n else None}
    if reference:
        m["aa_js_divergence"] = js_divergence(_composition(seqs), _composition(reference)) if n else None
        m["length_w1"] = wasserstein([len(s) for s in seqs], [len(s) for s in reference]) if n else None
    if train:
        ids = nearest_identity([s for s in seqs if s], train, options)
        m["identity_mean"] = float(np.mean(ids)) if ids else None
        m["identity_max"] = float(np.max(ids)) if ids else None
    return m
