"""``logos evaluate``: one entry point per task, from files to ``metrics.json``, ``report.md`` and figures.

Each task reads the predictions (any generator's files), the reference set and optionally the
model's training corpus, calls its field module's in-memory ``evaluate`` (the same function
generation calls), adds contamination (``test_in_train``: test items whose canonical key occurs in
the training corpus) when a training corpus is given, and writes the report
(:mod:`logos.evaluate.report`). Reference defaults: MOSES test (molecule), Materials Project
dielectric set (crystal), pyhmmer's proteins (protein); the others need ``--references``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from logos.evaluate import crystals, ligands, mofs, molecules, pockets, proteins, reactions, stats
from logos.evaluate import reference as ref
from logos.evaluate.stability import RelaxOptions
from logos.evaluate.report import Report, write_report
from logos.tasks import TASKS as TASKS_BY_NAME, get, names
from logos.util.records import InputError

__all__ = ["EvaluateOptions", "TASKS", "DEFAULT_REFERENCES", "run"]

TASKS = tuple(names("evaluate", aliases=False))  # the registry's tasks that this module scores
DEFAULT_REFERENCES = {name: TASKS_BY_NAME[name].reference for name in TASKS if TASKS_BY_NAME[name].reference}
SCAFFOLD_REFERENCE = "moses-test-scaffolds"  # the *_testsf similarities, with the default molecule reference


@dataclass(frozen=True)
class EvaluateOptions:
    fcd: bool = False  # molecule: FCD (needs logos[fcd])
    vina: bool = False  # ligand: Vina scores (needs logos[docking])
    limit: int | None = None  # first N reference items (retro/forward/csp), e.g. a slice for tests
    train_as_given: bool = False  # molecule: training SMILES as stored (MOSES's novelty), not canonicalized
    fcd_sample: int = 10_000
    property_sample: int = 10_000
    workers: int = 1  # molecule: processes for filters and properties; crystal/csp stability: relaxation workers
    scaffold_references: str | Path | None = None  # molecule: MOSES's scaffold-split test set (*_testsf metrics)
    coverage: bool = False  # crystal: CDVAE COV-R/COV-P against the reference (matminer fingerprints, cached)
    cov_cutoffs: tuple[float, float] = crystals.COV_CUTOFFS  # structure, composition fingerprint cutoffs
    stability: bool = False  # crystal, csp: relax with an ML potential, energy above the hull, S.U.N. (logos[stability])
    relax: RelaxOptions = RelaxOptions()  # the relaxation's bounds (its workers: ``workers``)
    stability_ranks: int = 1  # csp: the first N candidates of each composition are relaxed


def _molecule(pred, refs, train, opt, out):
    mo = molecules.MoleculeOptions(fcd=opt.fcd, fcd_sample=opt.fcd_sample, property_sample=opt.property_sample,
                                   train_as_given=opt.train_as_given, workers=opt.workers)
    details: dict = {}
    scaffolds = opt.scaffold_references
    if scaffolds is None and refs is not None and str(refs) == DEFAULT_REFERENCES.get("molecule"):
        scaffolds = SCAFFOLD_REFERENCE  # MOSES's scaffold-split test set goes with its test set
    m = molecules.evaluate(molecules.read_molecules(pred), refs, train, mo, details, scaffolds=scaffolds)
    rep = Report("molecule", molecules.SCHEMA_VERSION, m, molecules.DEFINITIONS, seconds=details["seconds"])
    if molecules.ranked_by_likelihood(pred):
        warning = (f"{pred}: samples are sorted by likelihood (its .samples.jsonl), so unique@k over the first k "
                   "is biased; MOSES reads samples in generation order")
        print(f"logos evaluate: warning: {warning}", file=sys.stderr)
        rep.notes.append(warning)
    if 0 < details["n_valid"] < 10_000:
        rep.notes.append(f"unique@10000 is over the {details['n_valid']:,} valid samples available (MOSES warns the same)")
    if scaffolds is not None:
        rep.inputs["scaffold_references"] = str(ref.resolve_reference(scaffolds))
    if train is not None and opt.train_as_given:
        rep.notes.append("novelty against the training SMILES as stored (MOSES's definition), not re-canonicalized")
    return rep, molecules.figures(details)


def _reactions(task):
    def run(pred, refs, train, opt, out):
        if refs is None:
            raise InputError(f"--task {task} needs --references (e.g. USPTO-50k's raw_test.csv.xz)")
        path = ref.resolve_reference(refs)
        if opt.limit:
            test = reactions.read_reference(path, opt.limit)
        else:
            test = [reactions.Reaction(**r) for r in ref.cached_json(
                "reactions-v2", path, lambda: [r.__dict__ for r in reactions.read_reference(path)])]
        m, rows = reactions.evaluate(test, reactions.read_predictions(pred, task), reactions.ReactionOptions(task),
                                     source=str(pred))
        if train is not None:
            m["test_in_train"] = reactions.contamination(test, ref.resolve_reference(train))
        n = m["n"]
        intervals = [{"metric": k, "value": m[k], **dict(zip(("low", "high"), stats.wilson(round(m[k] * n), n)))}
                     for k in m if k.startswith("top-") and m[k] is not None]
        return Report(task, reactions.SCHEMA_VERSION, m, reactions.DEFINITIONS,
                      tables={"per reaction class": rows, "95% intervals (Wilson)": intervals}), {}
    return run


def _stability(report: Report, items: list, known: list[list], opt: EvaluateOptions, out: Path) -> None:
    """Relax ``items`` and add the stability metrics, per-structure table, provenance and notes to ``report``."""
    from dataclasses import replace

    from logos.evaluate import stability
    from logos.util.records import ErrorLog

    out.mkdir(parents=True, exist_ok=True)
    errors = ErrorLog(out / "stability.errors.jsonl")
    try:
        m, rows, provenance, relaxed = stability.evaluate_stability(
            items, known, replace(opt.relax, workers=max(1, opt.workers)), errors)
    finally:
        errors.close()
    report.metrics.update(m)
    report.definitions.update(stability.DEFINITIONS)
    report.tables["stability per structure"] = rows
    report.provenance["stability"] = provenance
    report.seconds["stability"] = provenance["seconds"]
    stability.write_relaxed(relaxed, out / "relaxed")
    report.notes.append(
        f"Stability: each structure relaxed with {provenance['potential']} (cell and positions, fmax "
        f"{opt.relax.fmax} eV/A, at most {opt.relax.steps} steps and {opt.relax.seconds:g} s); e_hull is above an "
        f"ML-potential hull of {provenance['known_phases']} known phases (the reference set's crystals in the "
        "chemical systems touched, plus elemental reference states), not a DFT hull: compare these rates between "
        "models scored here, not one-to-one with published DFT figures. Relaxed CIFs in relaxed/.")
    if m.get("hull_with_compounds") is not None and m["hull_with_compounds"] < 1:
        report.notes.append(
            f"Only {m['hull_with_compounds']:.0%} of the structures with a hull have a known compound of their chemical "
            "system in it; for the rest the hull is the elemental references alone, and stable means only a negative "
            "formation energy. A fuller set of known phases (--references, --train) makes the hull stricter.")
    if errors.count:
        report.notes.append(f"{errors.count} structure(s) could not be relaxed: see stability.errors.jsonl")


def _crystal(pred, refs, train, opt, out):
    reference = crystals.load_set(refs) if refs is not None else None
    trainset = crystals.load_set(train) if train is not None else None
    items = crystals.read_items(pred)
    m = crystals.evaluate(items, reference, trainset)
    if reference is not None and trainset is not None:
        m["test_in_train"] = crystals.contamination(reference, trainset)
    if opt.coverage:
        if reference is None:
            raise InputError("--coverage needs --references (the set generated crystals should cover)")
        m.update(crystals.coverage(crystals.fingerprints(items, opt.workers),
                                   crystals.reference_fingerprints(refs, reference, opt.workers), opt.cov_cutoffs))
    report = Report("crystal", crystals.SCHEMA_VERSION, m, dict(crystals.DEFINITIONS))
    if opt.coverage:
        report.notes.append(f"COV-R/COV-P: CDVAE's fingerprints and cutoffs ({opt.cov_cutoffs[0]:g} structure, "
                            f"{opt.cov_cutoffs[1]:g} composition); composition fingerprints standardized with the "
                            "reference set's statistics (CDVAE: fixed MP-20 training statistics)")
    if opt.stability:
        _stability(report, items, [x for x in (reference, trainset) if x is not None], opt, out)
    return report, {}


def _csp(pred, refs, train, opt, out):
    if refs is None:
        raise InputError("--task csp needs --references (e.g. CDVAE's perov_5_test.csv.xz)")
    reference = crystals.load_set(refs)[:opt.limit or None]
    items = crystals.read_items(pred)
    m = crystals.evaluate_csp(items, reference)
    trainset = crystals.load_set(train) if train is not None else None
    if trainset is not None:
        m["test_in_train"] = crystals.contamination(reference, trainset)
    report = Report("csp", crystals.SCHEMA_VERSION, m, dict(crystals.DEFINITIONS))
    if opt.stability:  # the first stability_ranks candidates of each reference composition
        wanted = {r.id for r in reference}
        chosen = [c for c in items if c.id in wanted and c.rank <= opt.stability_ranks]
        _stability(report, chosen, [x for x in (reference, trainset) if x is not None], opt, out)
        report.notes.append(f"csp stability: the first {opt.stability_ranks} candidate(s) of each of the "
                            f"{len(reference)} compositions ({len(chosen)} structures); the hull holds the true "
                            "structures, so stable means as low as the known answer or lower")
    return report, {}


def _mof(pred, refs, train, opt, out):
    corpus = mofs.load_corpus(train) if train is not None else None
    m = mofs.evaluate(mofs.read_texts(Path(pred)), corpus)
    if refs is not None and corpus is not None:
        m["test_in_train"] = len(mofs.load_corpus(refs).keys & corpus.keys)
    rep = Report("mof", mofs.SCHEMA_VERSION, m, mofs.DEFINITIONS)
    if corpus is None:
        rep.notes.append("no --train: node_known, novel and VNU need the training corpus; validity omits the node check")
    return rep, {}


def _pocket(pred, refs, train, opt, out):
    if refs is None:
        raise InputError("--task pocket needs --references: complexes (X_protein.pdb + X_ligand.sdf), PDBs, or a .ds list")
    m = pockets.evaluate(pockets.read_sites(Path(refs)), pockets.read_predictions(Path(pred)))
    return Report("pocket", pockets.SCHEMA_VERSION, m, pockets.DEFINITIONS), {}


def _ligand(pred, refs, train, opt, out):
    sites = structures = None
    if refs is not None:
        files = pockets.structure_files(Path(refs))
        sites = pockets.read_sites(Path(refs))
        structures = {pockets.site_name(f): f for f in files}
    m = ligands.evaluate(ligands.read_ligands(Path(pred)), sites, structures, ligands.LigandOptions(vina=opt.vina))
    return Report("ligand", ligands.SCHEMA_VERSION, m, ligands.DEFINITIONS), {}


def _protein(pred, refs, train, opt, out):
    reference = proteins.load_set(refs) if refs is not None else None
    trainset = proteins.load_set(train) if train is not None else None
    m = proteins.evaluate(proteins.read_sequences(Path(pred)), reference, trainset)
    if reference is not None and trainset is not None:
        known = set(trainset)
        m["test_in_train"] = sum(s in known for s in reference)
    return Report("protein", proteins.SCHEMA_VERSION, m, proteins.DEFINITIONS), {}


_RUNNERS = {"molecule": _molecule, "retro": _reactions("retro"), "forward": _reactions("forward"),
            "crystal": _crystal, "csp": _csp, "mof": _mof, "pocket": _pocket, "ligand": _ligand, "protein": _protein}


def run(task: str, predictions: Path, out_dir: Path, references: str | Path | None = None,
        train: str | Path | None = None, options: EvaluateOptions = EvaluateOptions()) -> dict:
    """Evaluate ``predictions`` for ``task`` and write the report into ``out_dir``; returns metrics.json's content."""
    task = get(task, "evaluate").name
    predictions = Path(predictions)
    if not predictions.exists():
        raise InputError(f"{predictions}: no such file or folder")
    references = references if references is not None else get(task).reference
    t0, c0 = time.perf_counter(), time.process_time()
    report, figures = _RUNNERS[task](predictions, references, train, options, Path(out_dir))
    report.seconds["total"] = time.perf_counter() - t0
    report.seconds["cpu_total"] = time.process_time() - c0  # this process's CPU time: what a free core would take
    report.inputs["predictions"] = str(predictions)
    if references is not None:
        report.inputs["references"] = str(ref.resolve_reference(references))
    if train is not None:
        report.inputs["train"] = str(ref.resolve_reference(train))
    return write_report(report, Path(out_dir), figures)
