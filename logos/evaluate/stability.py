"""Crystal stability with a universal ML potential: relaxation, RMSD, energy above the hull of known phases, S.U.N.

Validity is guaranteed by the decoder, so it cannot tell a good crystal model from a bad one; the
field scores generated crystals by what relaxation does to them (MatterGen's protocol, with DFT
there and an ML potential here, as FlowMM and others pre-relax):

1. **Relaxation.** Each structure is relaxed, cell and positions together (ASE ``FIRE`` on a
   ``FrechetCellFilter``), with the CHGNet 0.3.0 potential whose weights ship inside the ``chgnet``
   wheel (``pip install 'logos[stability]'``; read with ``torch.load(weights_only=True)``, never
   unpickled), until every force and stress component is below ``fmax`` or a bound is reached:
   ``steps`` optimizer steps or ``seconds`` of wall time (then the structure counts as not converged
   and its last energy is used: an upper bound of its minimum). Relaxations run in isolated worker
   processes (:func:`logos.util.isolate.imap_isolated`, spawned): one that crashes the potential or
   runs past ``timeout`` costs that structure only, written as one line in the errors file.
2. **Per structure**: energy per atom before and after (eV/atom), the energy drop, the RMSD between
   the generated and the relaxed structure (pymatgen ``StructureMatcher`` alignment without volume
   scaling or primitive reduction: the normalized RMS displacement times the mean volume per site
   to the 1/3, in Angstrom; no RMSD when the matcher cannot align them), the relative volume change,
   the largest initial force, and the energy above the hull (``e_hull``).
3. **The hull of known phases**: the same potential's relaxed energies of the reference set's
   crystals (and the training corpus's, when given) plus elemental reference states (the 71
   elemental ground states of the Delta benchmark shipped by ASE as ``ase.collections.dcdft``;
   ``ase.build.bulk`` reference states for the lanthanides and actinides it lacks). Only phases whose
   elements are a subset of a generated structure's chemical system are relaxed; each relaxation
   is cached under ``$LOGOS_CACHE/evaluate/`` by structure and settings, so the hull of a reference
   set costs its relaxations once. ``pymatgen.analysis.phase_diagram`` builds one hull per chemical
   system. **This is an ML-potential hull of known phases, not DFT**, and not the 600k-phase
   Alex-MP-20 hull that MatterGen's DFT figures use: the rates are comparable between models scored
   here, not one-to-one with published DFT numbers.
4. **Rates** over all structures read (an unreadable or failed one counts as neither stable nor
   near a minimum), each with its 95% Wilson interval; means with their 95% t interval:
   ``stable`` (``e_hull <= 0`` within ``HULL_TOLERANCE``, the relaxations' numerical noise),
   ``metastable`` (``e_hull <= 0.1`` eV/atom, MatterGen's "stable" threshold), ``sun`` (stable,
   unique among the relaxed structures, and novel: matching no known phase, by ``StructureMatcher``
   with default tolerances), ``msun`` (the same with metastable), ``near_minimum`` (the relaxation
   moved the atoms by at most 0.1 Angstrom RMSD and the volume by at most 5%).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import statistics
import time
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from logos.evaluate.crystals import Item, composition_of, formula_of, known_structures, to_structure
from logos.evaluate.stats import mean_interval, wilson
from logos.util.files import atomic_path, cache_dir
from logos.util.isolate import Failure, imap_isolated
from logos.util.records import ErrorLog, InputError, bounded, safe_name

__all__ = ["RelaxOptions", "DEFINITIONS", "HULL_TOLERANCE", "METASTABLE", "potential_info", "relax_items",
           "relaxation_rmsd", "elemental_states", "evaluate_stability", "write_relaxed", "relax_cif_output"]

POTENTIAL = "CHGNet"
MODEL_VERSION = "0.3.0"
_WEIGHTS = "pretrained/0.3.0/chgnet_0.3.0_e29f68s314m37.pth.tar"  # inside the chgnet package
HULL_TOLERANCE = 1e-3  # eV/atom: stable means e_hull <= this (the same crystal relaxed twice differs by ~1e-4)
METASTABLE = 0.1  # eV/atom (MatterGen's stability threshold)
NEAR_RMSD = 0.1  # Angstrom
NEAR_VOLUME = 0.05  # relative volume change
RMSD_MATCHER = {"ltol": 0.2, "stol": 0.3, "angle_tol": 5, "primitive_cell": False, "scale": False,
                "attempt_supercell": False}
CACHE_SCHEMA = 1
ROW_COLUMNS = ("id", "rank", "formula", "atoms", "e_initial", "e_relaxed", "e_drop", "e_hull", "hull_compounds", "rmsd",
               "volume_change",
               "fmax_initial", "steps", "converged", "seconds", "unique", "novel", "stable", "metastable",
               "near_minimum", "sun", "msun", "hull", "error")

DEFINITIONS = {
    "relaxed": "structures the potential relaxed (converged or stopped at a bound); the rest are in the errors file",
    "converged": "share of structures whose relaxation reached fmax within the step and time bounds",
    "e_initial": "mean energy per atom of the structures as generated (eV/atom, relaxed structures only)",
    "e_relaxed": "mean energy per atom after relaxation (eV/atom)",
    "e_drop": "mean energy lost on relaxation (eV/atom): how far from a minimum the structures were",
    "rmsd": "mean RMSD generated -> relaxed (Angstrom; StructureMatcher alignment, matched structures only)",
    "rmsd_matched": "share of relaxed structures that StructureMatcher aligns with their relaxed form",
    "volume_change": "mean |relative volume change| on relaxation",
    "e_hull": "mean energy above the ML-potential hull of known phases (eV/atom; structures with a hull)",
    "e_hull_median": "median energy above the hull (eV/atom)",
    "hull_available": "share of relaxed structures whose chemical system has a hull (all its elements known)",
    "hull_with_compounds": "share of those hulls holding a known compound besides the elements (the rest: stable "
                           "only means below the elemental references, i.e. a negative formation energy)",
    "near_minimum": "share of all structures moved by <= 0.1 A RMSD and <= 5% volume on relaxation",
    "stable": "share of all structures with e_hull <= 0 (within 1 meV/atom) on the ML-potential hull",
    "metastable": "share of all structures with e_hull <= 0.1 eV/atom",
    "unique_relaxed": "share of relaxed structures distinct from every earlier one (StructureMatcher)",
    "novel_relaxed": "share of relaxed structures matching no known phase (reference and training sets)",
    "sun": "share of all structures stable, unique and novel (S.U.N.)",
    "msun": "share of all structures metastable, unique and novel",
}
for _k in ("near_minimum", "stable", "metastable", "sun", "msun", "converged"):
    DEFINITIONS[f"{_k}_ci95"] = f"95% Wilson interval of {_k}"
for _k in ("e_initial", "e_relaxed", "e_drop", "rmsd", "e_hull"):
    DEFINITIONS[f"{_k}_ci95"] = f"95% t interval of the mean {_k}"


@dataclass(frozen=True)
class RelaxOptions:
    """How structures are relaxed (every field is part of the cache key except the limits and workers)."""

    fmax: float = 0.05  # eV/Angstrom: largest force (and stress, in the filter's units) at convergence
    steps: int = 300  # FIRE steps at most
    seconds: float = 60.0  # wall seconds per structure, then it stops unconverged (its last energy counts)
    timeout: float = 0.0  # hard limit per structure (the worker is killed); 0: seconds + 120
    workers: int = 1  # isolated worker processes (one thread each)
    max_atoms: int = 200  # larger cells are not relaxed (one line in the errors file)

    def __post_init__(self):
        if self.fmax <= 0 or self.steps < 1 or self.seconds <= 0 or self.workers < 1 or self.max_atoms < 1:
            raise InputError("relaxation bounds must be positive (fmax, steps, seconds, workers, max atoms)")

    @property
    def hard_timeout(self) -> float:
        return self.timeout or self.seconds + 120.0


# ---------------------------------------------------------------- the potential (worker side)
_CALC = None


def _weights_path() -> Path:
    try:
        import chgnet
    except ImportError:
        raise InputError("crystal stability needs the chgnet package: pip install 'logos[stability]'") from None
    path = Path(chgnet.__file__).parent / _WEIGHTS
    if not path.is_file():
        raise InputError(f"{path}: the CHGNet {MODEL_VERSION} weights are missing from the chgnet package")
    return path


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


def potential_info() -> dict:
    """What produced the energies: the potential, its weights' digest, the package versions (provenance)."""
    path = _weights_path()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"potential": f"{POTENTIAL} {MODEL_VERSION}", "weights": f"chgnet/{_WEIGHTS}", "weights_sha256": digest,
            "chgnet": _version("chgnet"), "ase": _version("ase"), "pymatgen": _version("pymatgen"),
            "optimizer": "ase.optimize.FIRE on ase.filters.FrechetCellFilter (cell and positions)"}


def _start_worker() -> None:
    """Worker start: one torch thread, the CHGNet calculator loaded once (its chatter on stdout swallowed)."""
    global _CALC
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    from chgnet.model import CHGNet
    from chgnet.model.dynamics import CHGNetCalculator

    state = torch.load(_weights_path(), map_location="cpu", weights_only=True)
    with contextlib.redirect_stdout(io.StringIO()):
        model = CHGNet.from_dict(state["model"], version=MODEL_VERSION)
        _CALC = CHGNetCalculator(model=model, use_device="cpu", on_isolated_atoms="ignore")


def _relax_one(task: dict) -> dict:
    """Relax one structure (worker side); every failure is returned as ``{"error": reason}``."""
    try:
        return _relax(task)
    except Exception as e:  # noqa: BLE001 - the potential or ASE failing on one structure costs that one only
        return {"error": bounded(f"{type(e).__name__}: {e}")}


def _relax(task: dict) -> dict:
    import numpy as np
    from ase.filters import FrechetCellFilter
    from ase.optimize import FIRE
    from pymatgen.io.ase import AseAtomsAdaptor

    structure = to_structure(Item(**{k: task[k] for k in ("id", "rank", "matrix", "species", "frac")}))
    atoms = AseAtomsAdaptor.get_atoms(structure)
    atoms.calc = _CALC
    n = len(atoms)
    start = time.monotonic()
    e0 = float(atoms.get_potential_energy()) / n
    f0 = float(np.sqrt((atoms.get_forces() ** 2).sum(1)).max())
    if not (math.isfinite(e0) and math.isfinite(f0)):
        raise ValueError("the potential gives a non-finite energy or force for this structure")
    optimizer = FIRE(FrechetCellFilter(atoms), logfile=None)
    converged, stopped = False, None
    for converged in optimizer.irun(fmax=task["fmax"], steps=task["steps"]):
        if not converged and time.monotonic() - start > task["seconds"]:
            stopped = "time"
            break
    if not converged and stopped is None:
        stopped = "steps"
    e1 = float(atoms.get_potential_energy()) / n
    if not math.isfinite(e1):
        raise ValueError("relaxation diverged (non-finite energy)")
    relaxed = AseAtomsAdaptor.get_structure(atoms)
    return {"e_initial": e0, "e_relaxed": e1, "fmax_initial": f0, "steps": int(optimizer.nsteps),
            "converged": bool(converged), "stopped": stopped, "seconds": round(time.monotonic() - start, 3),
            "matrix": relaxed.lattice.matrix.tolist(), "species": [str(s.specie) for s in relaxed],
            "frac": relaxed.frac_coords.tolist()}


# ---------------------------------------------------------------- relaxing many (parent side)
def _key(item: Item, options: RelaxOptions, weights: str) -> str:
    body = json.dumps([weights[:16], options.fmax, options.steps, CACHE_SCHEMA,
                       [[round(x, 6) for x in row] for row in item.matrix], item.species,
                       [[round(x % 1.0, 6) % 1.0 for x in f] for f in item.frac]], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


def _cache_file(key: str) -> Path:
    return cache_dir() / "evaluate" / f"relaxed-chgnet-{MODEL_VERSION}" / key[:2] / f"{key}.json"


def _problem(item: Item, options: RelaxOptions) -> str | None:
    """Why a structure cannot be relaxed at all (before any worker sees it), or None."""
    if item.error is not None:
        return f"unreadable: {item.error}"
    if any(isinstance(sp, dict) for sp in item.species):
        return "disordered sites (occupancy < 1): the potential needs an ordered structure"
    if len(item.species) > options.max_atoms:
        return f"{len(item.species)} atoms, more than the {options.max_atoms} relaxed per structure"
    return None


def relax_items(items: list[Item], options: RelaxOptions = RelaxOptions(), weights: str | None = None,
                progress: Callable[[int, int], None] | None = None) -> tuple[list[dict], dict]:
    """One result per item (``{"error": reason}`` for a failure), relaxations cached by structure and settings.

    Returns the results and counts (``cached``, ``relaxed``, ``failed``). A result stopped by the time
    bound is not cached (a later run with more time may go further)."""
    weights = weights or potential_info()["weights_sha256"]
    results: list[dict | None] = [None] * len(items)
    todo: dict[str, list[int]] = defaultdict(list)
    counts = {"cached": 0, "relaxed": 0, "failed": 0}
    for i, item in enumerate(items):
        problem = _problem(item, options)
        if problem is not None:
            results[i] = {"error": problem}
            counts["failed"] += 1
            continue
        key = _key(item, options, weights)
        cached = _cache_file(key)
        if cached.is_file():
            try:
                results[i] = json.loads(cached.read_text(encoding="utf-8"))
                counts["cached"] += 1
                continue
            except (OSError, ValueError):  # a damaged cache file is recomputed
                pass
        todo[key].append(i)
    tasks = [{**items[idx[0]].as_json(), "key": key, "fmax": options.fmax, "steps": options.steps,
              "seconds": options.seconds} for key, idx in todo.items()]
    done = 0
    workers = min(options.workers, len(tasks))
    for task, res in (imap_isolated(tasks, _relax_one, workers=workers, timeout=options.hard_timeout, batch=1,
                                    init=_start_worker, context="spawn") if tasks else ()):
        if isinstance(res, Failure):
            res = {"error": (f"relaxation stopped after {options.hard_timeout:g} s: the worker ran past the hard limit "
                             "and was killed" if res.reason.startswith("timed out") else f"relaxation {res.reason}")}
        if "error" in res:
            counts["failed"] += len(todo[task["key"]])
        else:
            counts["relaxed"] += len(todo[task["key"]])
            if res["stopped"] != "time":
                path = _cache_file(task["key"])
                path.parent.mkdir(parents=True, exist_ok=True)
                with atomic_path(path) as tmp:
                    tmp.write_text(json.dumps(res), encoding="utf-8")
        for i in todo[task["key"]]:
            results[i] = res
        done += 1
        if progress is not None:
            progress(done, len(tasks))
    return results, counts  # type: ignore[return-value]


def relaxation_rmsd(initial: Item, relaxed: dict) -> float | None:
    """RMSD (Angstrom) between a structure and its relaxed form under ``RMSD_MATCHER``; None when they do not align."""
    from pymatgen.analysis.structure_matcher import StructureMatcher

    a = to_structure(initial)
    b = to_structure(Item(initial.id, initial.rank, relaxed["matrix"], relaxed["species"], relaxed["frac"]))
    try:
        found = StructureMatcher(**RMSD_MATCHER).get_rms_dist(a, b)
    except Exception:  # noqa: BLE001 - pymatgen raises on degenerate lattices: no alignment
        return None
    if found is None:
        return None
    per_site = ((a.volume + b.volume) / 2 / len(a)) ** (1 / 3)  # the matcher normalizes by (V/N)^(1/3)
    return float(found[0]) * per_site


# ---------------------------------------------------------------- known phases and the hull
def _elements(item: Item) -> frozenset[str]:
    out: set[str] = set()
    for sp in item.species:
        out.update(sp if isinstance(sp, dict) else [sp])
    return frozenset(out)


def elemental_states(elements: Iterable[str]) -> tuple[list[Item], dict[str, str]]:
    """Primitive cells of the elemental reference states of ``elements``, and where each came from.

    ``ase.collections.dcdft`` (the Delta benchmark's 71 elemental ground states) first, else
    ``ase.build.bulk`` (ASE's reference state of the element); an element with neither is left out."""
    from ase.build import bulk
    from ase.collections import dcdft
    from pymatgen.io.ase import AseAtomsAdaptor

    items, source = [], {}
    for el in sorted(set(elements)):
        try:
            if el in dcdft.names:
                atoms, where = dcdft[el], "ase.collections.dcdft"
            else:
                atoms, where = bulk(el), "ase.build.bulk"
        except Exception:  # noqa: BLE001 - ASE has no reference state for this element
            continue
        s = AseAtomsAdaptor.get_structure(atoms)
        s.remove_site_property("magmom") if "magmom" in s.site_properties else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = s.get_primitive_structure()
        items.append(Item(f"elemental:{el}", 1, s.lattice.matrix.tolist(), [str(x.specie) for x in s],
                          s.frac_coords.tolist()))
        source[el] = where
    return items, source


def _hulls(systems: set[frozenset], phases: list[tuple[Item, dict]]):
    """One ``PhaseDiagram`` per chemical system (or the reason there is none)."""
    from pymatgen.analysis.phase_diagram import PDEntry, PhaseDiagram

    entries = [(_elements(it), PDEntry(composition_of(it), r["e_relaxed"] * len(it.species), name=it.id)) for it, r in phases]
    out, compounds = {}, {}
    for system in systems:
        mine = [e for els, e in entries if els <= system]
        have = {str(e.composition.elements[0]) for e in mine if e.is_element}
        compounds[system] = sum(not e.is_element for e in mine)
        missing = sorted(system - have)
        if missing:
            out[system] = f"no elemental reference state for {', '.join(missing)}"
            continue
        try:
            out[system] = PhaseDiagram(mine)
        except Exception as e:  # noqa: BLE001 - a degenerate hull: no e_hull for this system
            out[system] = bounded(f"hull failed: {e}")
    return out, compounds


def _e_hull(hull, item: Item, energy_per_atom: float) -> float:
    from pymatgen.analysis.phase_diagram import PDEntry

    entry = PDEntry(composition_of(item), energy_per_atom * len(item.species))
    return float(hull.get_e_above_hull(entry, allow_negative=True))


# ---------------------------------------------------------------- the metrics
def _rate(flags: list[bool], n: int, name: str, m: dict) -> None:
    hits = sum(flags)
    m[name] = hits / n if n else None
    m[f"{name}_ci95"] = list(wilson(hits, n)) if n else None


def _mean(values: list[float], name: str, m: dict) -> None:
    m[name], m[f"{name}_ci95"] = mean_interval(values)


def evaluate_stability(items: list[Item], known: list[list[Item]], options: RelaxOptions = RelaxOptions(),
                       errors: ErrorLog | None = None) -> tuple[dict, list[dict], dict, list[tuple[Item, dict]]]:
    """Stability metrics of ``items`` (see the module docstring) against the known phases of ``known`` (the
    reference set, the training corpus: lists of structures). Returns (metrics, per-structure rows,
    provenance, [(item, relaxation result)] of the relaxed structures)."""
    t0 = time.perf_counter()
    info = potential_info()
    problems = {i: _problem(it, options) for i, it in enumerate(items)}
    systems = {_elements(it) for i, it in enumerate(items) if problems[i] is None}
    needed = set().union(*systems) if systems else set()
    elemental, sources = elemental_states(needed)
    phases = [it for group in known for it in group
              if not any(isinstance(sp, dict) for sp in it.species) and any(_elements(it) <= s for s in systems)]
    phases += elemental
    everything = list(items) + phases
    results, counts = relax_items(everything, options, info["weights_sha256"])
    mine, theirs = results[:len(items)], results[len(items):]
    known_ok = [(it, r) for it, r in zip(phases, theirs) if "error" not in r]
    hulls, compounds = _hulls(systems, known_ok)
    rows: list[dict] = []
    relaxed: list[tuple[Item, dict]] = []
    for it, res in zip(items, mine):
        row = {"id": it.id, "rank": it.rank, "formula": formula_of(it) if it.error is None else None,
               "atoms": len(it.species) if it.error is None else None}
        if "error" in res:
            if errors is not None:
                errors.add(f"{it.id}#{it.rank}", res["error"])
            rows.append({**row, "error": res["error"]})
            continue
        rmsd = relaxation_rmsd(it, res)
        v0 = to_structure(it).volume
        v1 = to_structure(Item(it.id, it.rank, res["matrix"], res["species"], res["frac"])).volume
        hull = hulls.get(_elements(it))
        e_hull = _e_hull(hull, it, res["e_relaxed"]) if hull is not None and not isinstance(hull, str) else None
        row.update(e_initial=res["e_initial"], e_relaxed=res["e_relaxed"], e_drop=res["e_initial"] - res["e_relaxed"],
                   e_hull=e_hull, hull_compounds=compounds.get(_elements(it)), rmsd=rmsd, volume_change=(v1 - v0) / v0, fmax_initial=res["fmax_initial"],
                   steps=res["steps"], converged=res["converged"], seconds=res["seconds"])
        if isinstance(hull, str):
            row["hull"] = hull
        rows.append(row)
        relaxed.append((it, res))
    relaxed_rows = [r for r in rows if "error" not in r]
    # uniqueness and novelty of the relaxed structures (MatterGen scores the relaxed ones)
    rs = [Item(it.id, it.rank, r["matrix"], r["species"], r["frac"]) for it, r in relaxed]
    unique, novel = known_structures(rs, [t for group in known for t in group])
    for row, u, nv in zip(relaxed_rows, unique, novel):
        row["unique"], row["novel"] = u, nv
        eh = row["e_hull"]
        row["stable"] = eh is not None and eh <= HULL_TOLERANCE
        row["metastable"] = eh is not None and eh <= METASTABLE
        row["near_minimum"] = (row["rmsd"] is not None and row["rmsd"] <= NEAR_RMSD
                               and abs(row["volume_change"]) <= NEAR_VOLUME)
        row["sun"] = row["stable"] and u and nv
        row["msun"] = row["metastable"] and u and nv
    rows = [{c: r.get(c) for c in ROW_COLUMNS} for r in rows]
    n = len(items)
    m: dict = {"relaxed": len(relaxed_rows)}
    _rate([r["converged"] for r in relaxed_rows], n, "converged", m)
    for name in ("e_initial", "e_relaxed", "e_drop"):
        _mean([r[name] for r in relaxed_rows], name, m)
    _mean([r["rmsd"] for r in relaxed_rows if r["rmsd"] is not None], "rmsd", m)
    m["rmsd_matched"] = (sum(r["rmsd"] is not None for r in relaxed_rows) / len(relaxed_rows)) if relaxed_rows else None
    m["volume_change"] = (sum(abs(r["volume_change"]) for r in relaxed_rows) / len(relaxed_rows)
                          if relaxed_rows else None)
    hulled = [r["e_hull"] for r in relaxed_rows if r["e_hull"] is not None]
    _mean(hulled, "e_hull", m)
    m["e_hull_median"] = float(statistics.median(hulled)) if hulled else None
    m["hull_available"] = len(hulled) / len(relaxed_rows) if relaxed_rows else None
    with_compounds = [r for r in relaxed_rows if r["e_hull"] is not None and r["hull_compounds"]]
    m["hull_with_compounds"] = len(with_compounds) / len(hulled) if hulled else None
    for name in ("near_minimum", "stable", "metastable"):
        _rate([r[name] for r in relaxed_rows], n, name, m)
    m["unique_relaxed"] = sum(unique) / len(unique) if unique else None
    m["novel_relaxed"] = sum(novel) / len(novel) if novel else None
    _rate([r["sun"] for r in relaxed_rows], n, "sun", m)
    _rate([r["msun"] for r in relaxed_rows], n, "msun", m)
    known_failed = len(phases) - len(known_ok)
    provenance = {
        **info, "relaxation": {k: v for k, v in asdict(options).items() if k != "workers"},
        "hull": ("ML-potential (CHGNet) convex hull of known phases, not DFT: the reference set's crystals (and the "
                 "training corpus's) in the chemical systems the structures touch, plus elemental reference states, "
                 "each relaxed with the settings above"),
        "known_phases": len(known_ok), "known_phases_failed": known_failed,
        "elemental_states": sources,
        "chemical_systems": len(systems),
        "no_hull": sorted({"-".join(sorted(s)): h for s, h in hulls.items() if isinstance(h, str)}.items()),
        "cache": str(cache_dir() / "evaluate" / f"relaxed-chgnet-{MODEL_VERSION}"),
        "relaxations": counts, "seconds": round(time.perf_counter() - t0, 1),
    }
    return m, rows, provenance, relaxed


# ---------------------------------------------------------------- relaxed files
def _cif(item: Item, res: dict, name: str) -> str:
    from pymatgen.io.cif import CifWriter

    text = str(CifWriter(to_structure(Item(item.id, item.rank, res["matrix"], res["species"], res["frac"]))))
    lines = text.splitlines()
    for k, line in enumerate(lines):
        if line.startswith("data_"):
            lines[k] = f"data_{safe_name(name, 'crystal')}"
            break
    return "\n".join(lines) + "\n"


def write_relaxed(relaxed: list[tuple[Item, dict]], folder: Path) -> int:
    """One CIF per relaxed structure (``ID_RANK.cif``, P1 as relaxed) in ``folder``; returns how many."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.cif"):  # an earlier run's files would be taken for this one's
        old.unlink()
    for it, res in relaxed:
        name = f"{it.id}_{it.rank}"
        (folder / f"{safe_name(name, 'crystal')}.cif").write_text(_cif(it, res, name), encoding="utf-8")
    return len(relaxed)


def relax_cif_output(out: Path, options: RelaxOptions = RelaxOptions(), errors: ErrorLog | None = None) -> dict:
    """Relax the CIFs ``logos generate`` wrote for ``out`` (the folder ``OUT/`` or the multi-block ``OUT``) into
    ``OUT.relaxed/`` (same file names) or the multi-block ``OUT.relaxed.cif``; per-structure numbers into
    ``OUT.relaxed.jsonl``. Returns a summary (counts, mean energy drop and RMSD)."""
    from logos.evaluate.crystals import read_items

    out = Path(out)
    folder = out.with_suffix("")
    if folder.is_dir():
        files = sorted(p for p in folder.iterdir() if p.suffix == ".cif")
        pairs = [(f, it) for f in files for it in read_items(f)]
    elif out.is_file():
        pairs = [(None, it) for it in read_items(out)]
    else:
        raise InputError(f"{out}: no CIFs to relax")
    items = [it for _, it in pairs]
    results, counts = relax_items(items, options)
    target_dir = folder.with_name(folder.name + ".relaxed")
    multi = out.with_name(folder.name + ".relaxed.cif")
    table = out.with_name(folder.name + ".relaxed.jsonl")
    blocks, rows = [], []
    if target_dir.exists() and folder.is_dir():
        for old in target_dir.glob("*.cif"):
            old.unlink()
    for (f, it), res in zip(pairs, results):
        if "error" in res:
            if errors is not None:
                errors.add(str(f) if f is not None else f"{out}:{it.id}", res["error"])
            rows.append({"id": it.id, "file": f.name if f is not None else None, "error": res["error"]})
            continue
        rmsd = relaxation_rmsd(it, res)
        rows.append({"id": it.id, "file": f.name if f is not None else None, "e_initial": res["e_initial"],
                     "e_relaxed": res["e_relaxed"], "rmsd": rmsd, "steps": res["steps"], "converged": res["converged"]})
        if f is not None:
            target_dir.mkdir(parents=True, exist_ok=True)
            (target_dir / f.name).write_text(_cif(it, res, it.id), encoding="utf-8")
        else:
            blocks.append(_cif(it, res, it.id))
    if blocks:
        multi.write_text("".join(blocks), encoding="utf-8")
    table.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    ok = [r for r in rows if "error" not in r]
    drops = [r["e_initial"] - r["e_relaxed"] for r in ok]
    rmsds = [r["rmsd"] for r in ok if r["rmsd"] is not None]
    return {"structures": len(rows), "relaxed": len(ok), "converged": sum(r["converged"] for r in ok),
            "e_drop": sum(drops) / len(drops) if drops else None, "rmsd": sum(rmsds) / len(rmsds) if rmsds else None,
            "folder": str(target_dir if folder.is_dir() else multi), "table": str(table), "relaxations": counts}
