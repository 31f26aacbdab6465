"""Crystal metrics: unconditional generation (CDVAE's protocol as CrystaLLM reports it) and structure prediction.

Unconditional (``--task crystal``), from :mod:`logos.science.materials.validity` (reused, not rewritten):

- ``structural_validity``: every interatomic distance >= 0.5 Angstrom (periodic images included)
  and volume >= 0.1 Angstrom^3; ``compositional_validity``: CDVAE's SMACT rules
  (:func:`~logos.science.materials.validity.cdvae_compositional_validity`); ``validity``: both;
- ``space_group_consistency`` / ``multiplicity_consistency``: for grammar text only (the text
  states a space group and Wyckoff letters; a CIF states neither in a checkable way: n/a);
- ``uniqueness``: distinct valid structures / valid structures, by pymatgen ``StructureMatcher``
  (default tolerances ``ltol=0.2, stol=0.3, angle_tol=5``) within groups of equal reduced formula;
- ``novelty``: share of the distinct valid structures that match no structure of the training
  corpus (same matcher, candidates of equal reduced formula);
- ``w_density`` / ``w_num_elements``: Wasserstein-1 distance between the valid samples' density
  (g/cm^3) / number of distinct elements and the reference set's (CDVAE's property statistics);
- ``cov_recall`` / ``cov_precision`` (with ``coverage``): CDVAE's COV-R and COV-P. Each crystal gets a
  structure fingerprint (the mean over its sites of matminer's ``CrystalNNFingerprint`` "ops"
  preset) and a composition fingerprint (matminer's Magpie ``ElementProperty``), as CDVAE computes
  them; COV-R is the share of reference crystals whose nearest generated structure fingerprint lies
  within 0.4 and nearest generated composition fingerprint within 10 (Euclidean; CDVAE's MP-20
  cutoffs, an option), COV-P the share of all generated crystals whose nearest reference
  fingerprints do (CDVAE takes the two minima separately, and so does this). Composition
  fingerprints are standardized feature by feature (missing values 0, as CDVAE's scaler): CDVAE
  uses fixed MP-20 training statistics written into its code, this uses the reference set's own
  mean and standard deviation, so the composition scale follows the reference given. Fingerprints
  run in isolated workers (a structure CrystalNN cannot handle has none, as in CDVAE); the
  reference's are cached.

Structure prediction (``--task csp``): for each reference structure, candidates ``id#1..id#n``;
``match_rate@n``: share of reference structures matched by any of the first n candidates under
``StructureMatcher(stol=0.5, angle_tol=10, ltol=0.3)`` (CrystaLLM's and DiffCSP's tolerances);
``rmse@n``: mean over matched structures of the smallest normalized RMS displacement
(``get_rms_dist``, normalized by (V/N)^(1/3)). Reported for n = 1 and n = 20.

Inputs: a folder of CIFs, a multi-block CIF (block ``data_ID`` or ``data_ID#R``), a pymatgen JSON,
a CSV with ``material_id`` and ``cif`` columns (CDVAE's Perov-5), or a grammar JSONL (``text``,
``id``, optional ``rank``). References and training corpora are cached as JSON (lattice matrix,
species, fractional coordinates) by :mod:`logos.evaluate.reference`.
"""

from __future__ import annotations

import csv
import warnings
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from logos.evaluate import reference as ref
from logos.evaluate.stats import wasserstein
from logos.science.materials.crystal import Crystal, load, read_crystal_file
from logos.science.materials.validity import cdvae_compositional_validity, check_crystal, structural_validity
from logos.util.records import InputError, RecordError

__all__ = ["CrystalOptions", "Item", "SCHEMA_VERSION", "DEFINITIONS", "CSP_TOLERANCES", "COV_CUTOFFS", "read_items",
           "load_set", "fingerprints", "reference_fingerprints", "coverage",
           "to_structure", "composition_of", "formula_of", "known_structures", "evaluate", "evaluate_csp",
           "contamination"]

SCHEMA_VERSION = 1
CSP_TOLERANCES = {"stol": 0.5, "angle_tol": 10, "ltol": 0.3}
DEFINITIONS = {
    "n": "structures read (unreadable ones count as invalid)",
    "structural_validity": "share with all interatomic distances >= 0.5 A (and volume >= 0.1 A^3)",
    "compositional_validity": "share passing CDVAE's SMACT charge-neutrality + Pauling test (alloys valid)",
    "validity": "share structurally and compositionally valid",
    "space_group_consistency": "grammar text: share whose stated space group spglib finds (symprec 0.1 A)",
    "multiplicity_consistency": "grammar text: share whose Wyckoff letters expand to the written composition",
    "uniqueness": "distinct valid structures / valid (StructureMatcher ltol 0.2, stol 0.3, angle_tol 5)",
    "novelty": "share of distinct valid structures matching no training structure (same matcher)",
    "w_density": "Wasserstein-1 distance of density (g/cm^3) to the reference",
    "w_num_elements": "Wasserstein-1 distance of the number of elements to the reference",
    "test_in_train": "reference structures matching a training structure (StructureMatcher)",
    "cov_recall": "CDVAE COV-R: share of reference crystals with a generated one within the structure and "
                  "composition fingerprint cutoffs",
    "cov_precision": "CDVAE COV-P: share of generated crystals with a reference one within both cutoffs",
}
COV_CUTOFFS = (0.4, 10.0)  # CDVAE's structure and composition fingerprint cutoffs for MP-20
for _n in (1, 20):
    DEFINITIONS[f"match_rate@{_n}"] = (f"share of reference structures matched by one of the first {_n} candidates "
                                       "(StructureMatcher stol 0.5, angle_tol 10, ltol 0.3)")
    DEFINITIONS[f"rmse@{_n}"] = f"mean normalized RMS displacement of the best match among {_n} (matched only)"


@dataclass(frozen=True)
class CrystalOptions:
    ns: tuple[int, ...] = (1, 20)


@dataclass
class Item:
    """One structure: its id and rank, the pymatgen-ready arrays, the grammar text (if any), or the error."""

    id: str
    rank: int
    matrix: list | None = None
    species: list | None = None
    frac: list | None = None
    text: str | None = None
    error: str | None = None

    def as_json(self) -> dict:
        return {"id": self.id, "rank": self.rank, "matrix": self.matrix, "species": self.species, "frac": self.frac}


def _split_rank(ident: str, default: int) -> tuple[str, int]:
    base, sep, r = ident.rpartition("#")
    return (base, int(r)) if sep and r.isdigit() else (ident, default)


def _from_crystal(ident: str, rank: int, cell: Crystal, text: str | None = None) -> Item:
    species = [s.element if s.occ >= 0.999 else {s.element: s.occ} for s in cell.sites]
    return Item(ident, rank, cell.matrix().tolist(), species, [list(s.frac) for s in cell.sites], text)


def _from_text(ident: str, rank: int, text: str) -> Item:
    from logos.science.materials.symmetry import expand, unit_cell
    from logos.science.materials.text import parse_crystal_text

    try:
        asym, _ = expand(parse_crystal_text(text))
        return _from_crystal(ident, rank, unit_cell(asym), text)
    except RecordError as e:
        return Item(ident, rank, text=text, error=str(e))


def read_items(path: Path) -> list[Item]:
    """Every structure of a folder, CIF, pymatgen JSON, CDVAE CSV (``cif`` column) or grammar JSONL."""
    path = Path(path)
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    out: list[Item] = []
    for f in files:
        name = f.name.lower()
        counter: dict[str, int] = defaultdict(int)
        if name.endswith(".jsonl"):
            for lineno, rec in ref.jsonl_records(f):
                ident = str(rec.get("id", lineno))
                counter[ident] += 1
                out.append(_from_text(ident, int(rec.get("rank", counter[ident])), rec.get("text", "")))
        elif ".csv" in name:
            with ref.open_any(f) as fh:
                for lineno, row in enumerate(csv.DictReader(fh), 2):
                    if "cif" not in row:
                        raise InputError(f"{f}: no 'cif' column")
                    ident = str(row.get("material_id") or lineno)
                    out.append(_load_block(ident, 1, row["cif"], f"{f}:{lineno}"))
        else:
            try:
                for k, item in enumerate(read_crystal_file(f), 1):
                    ident, rank = _split_rank(item.id or (f.stem if len(files) > 1 else str(k)), 1)
                    if ident == item.id and len(files) > 1 and item.id is None:
                        ident = f.stem
                    try:
                        out.append(_from_crystal(ident, rank, load(item)))
                    except RecordError as e:
                        out.append(Item(ident, rank, error=f"{item.source}: {e}"))
            except InputError as e:
                raise InputError(f"{f}: {e}") from None
    return out


def _load_block(ident: str, rank: int, text: str, source: str) -> Item:
    from logos.science.materials.crystal import read_cif_block

    try:
        return _from_crystal(ident, rank, read_cif_block(text))
    except RecordError as e:
        return Item(ident, rank, error=f"{source}: {e}")


def load_set(spec: str | Path) -> list[Item]:
    """A reference set or training corpus (bundled name or path), read once and cached as JSON."""
    path = ref.resolve_reference(spec)
    rows = ref.cached_json("crystals", path, lambda: [i.as_json() for i in read_items(path) if i.error is None])
    return [Item(**r) for r in rows]


def to_structure(item: Item):
    from pymatgen.core import Lattice, Structure

    return Structure(Lattice(item.matrix), item.species, item.frac)


def _crystal(item: Item) -> Crystal:
    from logos.science.materials.crystal import Site, lattice_parameters

    sites = []
    for sp, fr in zip(item.species, item.frac):
        for el, occ in (sp.items() if isinstance(sp, dict) else [(sp, 1.0)]):
            sites.append(Site(el, tuple(fr), occ))
    return Crystal(lattice_parameters(np.array(item.matrix)), sites)


def _matcher(**kw):
    from pymatgen.analysis.structure_matcher import StructureMatcher

    return StructureMatcher(**kw)


def composition_of(item: Item):
    """The cell composition of an item (a pymatgen ``Composition``), from its species (no Structure built)."""
    from pymatgen.core import Composition

    counts: dict[str, float] = defaultdict(float)
    for sp in item.species:
        for el, occ in (sp.items() if isinstance(sp, dict) else [(sp, 1.0)]):
            counts[el] += occ
    return Composition(counts)


def formula_of(item: Item) -> str:
    """The reduced formula of an item."""
    return composition_of(item).reduced_formula



class _Comparer:
    """StructureMatcher over sets of structures: each structure reduced once (primitive cell, Niggli), as
    pymatgen's own ``group_structures`` does, and compared only with structures of the same reduced formula and the
    same number of sites in the primitive cell (without supercells the matcher never matches across either). A
    corpus of thousands of structures of one formula (Carbon-24) costs one reduction each, not one per pair."""

    def __init__(self, matcher):
        self.matcher = matcher

    def key_and_reduced(self, structure) -> tuple[tuple[str, int], object]:
        reduced = self.matcher._get_reduced_structure(structure, self.matcher._primitive_cell, True)
        return (structure.composition.reduced_formula, len(reduced)), reduced

    def fit(self, a, b) -> bool:
        try:
            return self.matcher.fit(a, b, skip_structure_reduction=True)
        except Exception:  # noqa: BLE001 - pymatgen raises on degenerate lattices: no match
            return False

    def distinct(self, structures: list) -> list[int]:
        """Indices of the first structure of each matcher class."""
        firsts: dict[tuple[str, int], list[tuple[int, object]]] = defaultdict(list)
        for i, s in enumerate(ref.progress(structures, len(structures), "uniqueness", None)):
            key, r = self.key_and_reduced(s)
            if not any(self.fit(r, other) for _, other in firsts[key]):
                firsts[key].append((i, r))
        return sorted(i for group in firsts.values() for i, _ in group)

    def found_in(self, structures: list, corpus: list[Item]) -> list[bool]:
        """For each structure, whether it matches one of the corpus; only corpus items of a queried formula are built."""
        queries = [self.key_and_reduced(s) for s in structures]
        formulas = {k[0] for k, _ in queries}
        pool: dict[tuple[str, int], list] = defaultdict(list)
        wanted = [t for t in corpus if formula_of(t) in formulas]
        for t in ref.progress(wanted, len(wanted), "training structures of the same formulas", None):
            key, r = self.key_and_reduced(to_structure(t))
            pool[key].append(r)
        return [any(self.fit(r, other) for other in pool.get(key, [])) for key, r in queries]


def evaluate(items: list[Item], reference: list[Item] | None = None, train: list[Item] | None = None) -> dict:
    """Unconditional crystal metrics of structures in memory (see the module docstring)."""
    warnings.filterwarnings("ignore", module="pymatgen")
    n = len(items)
    struct, comp, sg, mult, valid = [], [], [], [], []
    for it in items:
        if it.error is not None:
            struct.append(False), comp.append(False), valid.append(False)
            continue
        cell = _crystal(it)
        ok_s = structural_validity(cell)[0]
        counts: dict[str, float] = defaultdict(float)
        for s in cell.sites:
            counts[s.element] += s.occ
        ok_c = cdvae_compositional_validity(counts)
        struct.append(ok_s), comp.append(ok_c), valid.append(ok_s and ok_c)
        if it.text is not None:
            v = check_crystal(it.text)
            sg.append(bool(v.space_group)), mult.append(bool(v.multiplicity))
    rate = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    m: dict = {"n": n, "structural_validity": rate(struct) if n else None, "compositional_validity": rate(comp) if n else None,
               "validity": rate(valid) if n else None,
               "space_group_consistency": rate(sg), "multiplicity_consistency": rate(mult)}
    good = [to_structure(it) for it, ok in zip(items, valid) if ok]
    compare = _Comparer(_matcher())
    distinct = compare.distinct(good) if good else []
    m["uniqueness"] = len(distinct) / len(good) if good else None
    if train is not None:
        seen = compare.found_in([good[i] for i in distinct], train)
        m["novelty"] = (1 - sum(seen) / len(seen)) if seen else None
    if reference is not None:
        rs = [to_structure(r) for r in reference]
        m["w_density"] = wasserstein([s.density for s in good], [s.density for s in rs])
        m["w_num_elements"] = wasserstein([len(s.composition.elements) for s in good],
                                           [len(s.composition.elements) for s in rs])
    return m


def evaluate_csp(candidates: list[Item], reference: list[Item], options: CrystalOptions = CrystalOptions()) -> dict:
    """Match rate and RMSE at each n of ``options.ns`` (CrystaLLM's tolerances)."""
    warnings.filterwarnings("ignore", module="pymatgen")
    matcher = _matcher(**CSP_TOLERANCES)
    by_id: dict[str, list[Item]] = defaultdict(list)
    for c in candidates:
        by_id[c.id].append(c)
    best: dict[int, list[float | None]] = {n: [] for n in options.ns}
    for r in reference:
        target = to_structure(r)
        rms_by_rank: list[float | None] = []
        for c in sorted(by_id.get(r.id, []), key=lambda c: c.rank)[:max(options.ns)]:
            rms = None
            if c.error is None:
                try:
                    d = matcher.get_rms_dist(to_structure(c), target)
                    rms = None if d is None else float(d[0])
                except Exception:  # pymatgen raises on degenerate lattices: a miss
                    rms = None
            rms_by_rank.append(rms)
        for n in options.ns:
            found = [x for x in rms_by_rank[:n] if x is not None]
            best[n].append(min(found) if found else None)
    m: dict = {"n": len(reference)}
    for n in options.ns:
        hit = [x for x in best[n] if x is not None]
        m[f"match_rate@{n}"] = len(hit) / len(reference) if reference else None
        m[f"rmse@{n}"] = float(np.mean(hit)) if hit else None
    return m


def known_structures(structures: list[Item], corpus: list[Item]) -> tuple[list[bool], list[bool]]:
    """For each structure, whether it is the first of its class among ``structures`` (unique) and whether it
    matches no structure of ``corpus`` (novel), by ``StructureMatcher`` with default tolerances."""
    warnings.filterwarnings("ignore", module="pymatgen")
    compare = _Comparer(_matcher())
    built = [to_structure(s) for s in structures]
    firsts = set(compare.distinct(built)) if built else set()
    seen = compare.found_in(built, corpus) if built and corpus else [False] * len(built)
    return [i in firsts for i in range(len(built))], [not x for x in seen]


_FEATURIZERS: list = []


def _featurizers() -> list:
    """matminer's CrystalNN "ops" site fingerprint and Magpie composition featurizer (built once per process)."""
    if not _FEATURIZERS:
        try:
            from matminer.featurizers.composition import ElementProperty
            from matminer.featurizers.site import CrystalNNFingerprint
        except ImportError:
            raise InputError("COV-R/COV-P need matminer: pip install 'logos[materials]'") from None
        _FEATURIZERS.extend([CrystalNNFingerprint.from_preset("ops"), ElementProperty.from_preset("magpie")])
    return _FEATURIZERS


def _fingerprint_one(payload: dict) -> tuple[list | None, list]:
    """(structure fingerprint or None, composition fingerprint) of one structure (worker side)."""
    warnings.filterwarnings("ignore")
    site_fp, comp_fp = _featurizers()
    item = Item(**payload)
    comp = [float(x) for x in comp_fp.featurize(composition_of(item))]
    try:
        s = to_structure(item)
        struct = np.mean([site_fp.featurize(s, i) for i in range(len(s))], axis=0).tolist()
    except Exception:  # noqa: BLE001 - CrystalNN fails on some structures: no fingerprint (CDVAE: invalid)
        struct = None
    return struct, comp


def fingerprints(items: list[Item], workers: int = 1, timeout: float = 120.0) -> tuple[np.ndarray, np.ndarray]:
    """CDVAE's structure (61) and composition (132) fingerprints of each item; NaN rows where there are none (an
    unreadable item, a CrystalNN failure, a crash or a time-out of the isolated worker)."""
    from logos.util.isolate import Failure, imap_isolated

    struct = np.full((len(items), 61), np.nan)
    comp = np.full((len(items), 132), np.nan)
    good = [(i, it) for i, it in enumerate(items) if it.error is None and not any(isinstance(x, dict) for x in it.species)]
    payloads = [dict(it.as_json(), id=str(it.id)) for _, it in good]
    _featurizers()  # built here, so that every forked worker starts with them
    results = imap_isolated(payloads, _fingerprint_one, workers=workers, timeout=timeout, batch=4)
    for (i, _), (_, res) in zip(good, results):
        if isinstance(res, Failure):
            continue
        if res[0] is not None:
            struct[i] = res[0]
        comp[i] = res[1]
    return struct, comp


def reference_fingerprints(spec: str | Path, items: list[Item], workers: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fingerprints` of a reference set (``items``, as :func:`load_set` read ``spec``), cached as ``.npy``."""
    path = ref.resolve_reference(spec)
    built: dict = {}

    def build(k: int) -> np.ndarray:
        if not built:
            built[0], built[1] = fingerprints(items, workers)
        return built[k]
    return (ref.cached_array("crystalfp-cnn-ops", path, lambda: build(0)),
            ref.cached_array("crystalfp-magpie", path, lambda: build(1)))


def coverage(gen: tuple[np.ndarray, np.ndarray], ref_fps: tuple[np.ndarray, np.ndarray],
             cutoffs: tuple[float, float] = COV_CUTOFFS) -> dict:
    """CDVAE's COV-R and COV-P (see the module docstring) from :func:`fingerprints` of generated and reference."""
    from scipy.spatial.distance import cdist

    g_struct, g_comp = gen
    r_struct, r_comp = ref_fps
    n_gen = len(g_struct)
    keep = ~np.isnan(g_struct).any(1) & ~np.isnan(g_comp).all(1)
    rkeep = ~np.isnan(r_struct).any(1) & ~np.isnan(r_comp).all(1)
    if not n_gen or not keep.any() or not rkeep.any():
        return {"cov_recall": 0.0 if rkeep.any() else None, "cov_precision": 0.0 if n_gen else None}
    r_struct, r_comp = r_struct[rkeep], r_comp[rkeep]
    mean = np.nanmean(r_comp, axis=0)
    std = np.nanstd(r_comp, axis=0)
    std[~(std > 0)] = 1.0

    def scale(x):
        z = (x - mean) / std
        return np.where(np.isnan(z), 0.0, z)
    d_struct = cdist(g_struct[keep], r_struct)
    d_comp = cdist(scale(g_comp[keep]), scale(r_comp))
    recall = (d_struct.min(0) <= cutoffs[0]) & (d_comp.min(0) <= cutoffs[1])
    precision = (d_struct.min(1) <= cutoffs[0]) & (d_comp.min(1) <= cutoffs[1])
    return {"cov_recall": float(recall.mean()), "cov_precision": float(precision.sum() / n_gen)}


def contamination(reference: list[Item], train: list[Item]) -> int:
    return sum(_Comparer(_matcher()).found_in([to_structure(r) for r in reference], train))
