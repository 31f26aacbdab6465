"""Validity of generated crystals and MOFs, for ``logos generate`` summaries and for evaluation.

A crystal text is checked four ways (each independent, each with a reason when it fails):

- structural: every interatomic distance in the expanded cell (periodic images included) is at
  least ``MIN_DISTANCE`` = 0.5 Angstrom and the cell volume at least ``MIN_VOLUME`` = 0.1 Angstrom^3
  (the CDVAE/DiffCSP convention); species sharing one position with occupancies summing to at most
  1 are one disordered site, not a clash;
- compositional: SMACT charge neutrality with the Pauling electronegativity test
  (``smact.screening.smact_validity``; pure metals/alloys count as valid);
  :func:`cdvae_compositional_validity` is CDVAE's own rule set (one element or all metals: valid;
  else some combination of SMACT's default oxidation states is charge-neutral on the reduced
  composition and passes the Pauling test, which counts as passed when an electronegativity is
  missing), written for SMACT 4.0's API (``neutral_ratios`` returns a list, not ``(ok, ratios)``);
  it is what evaluation reports, so numbers compare with CDVAE, DiffCSP and CrystaLLM;
- space-group consistency: spglib, at ``SYMPREC`` = 0.1 Angstrom, finds the stated space group in
  the expanded cell;
- multiplicity consistency: every written Wyckoff letter exists in the stated group and its
  multiplicity (International Tables, :mod:`logos.science.materials.wyckoff`) equals the number of atoms
  the site expands to, so the written letters reproduce the composition. In v2 text a site is
  placed on its position by construction, so this fails only where free coordinates put it on a
  more special position by chance (``Cl<we> 0.0000`` in Fm-3m: 24e on 4a); a letter the group
  lacks is already a parse error.

:func:`check_crystal` runs them on one text; :func:`summarize` gives rates over many texts.
A MOF text (:func:`mof_validity`) is valid when every linker parses as a molecule (RDKit) and its
node is one seen in the training data (:func:`known_nodes` of the tokenized training files).
:func:`validity_report` is the one call a generation summary needs: it sorts texts into crystals and
MOFs and reports both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Iterable

import numpy as np
import spglib

from logos.science.chemistry import parse_smiles
from logos.language.grammar import GrammarError, validate
from logos.science.materials.crystal import MIN_DISTANCE, Crystal, periodic_images, position_groups
from logos.science.materials.framework import METAL_OPEN, OPEN as MOF_OPEN, parse_mof_text
from logos.science.materials.symmetry import expand, quiet_spglib, unit_cell
from logos.science.materials.text import OPEN as CRYSTAL_OPEN, parse_crystal_text
from logos.science.materials.wyckoff import multiplicity
from logos.util.records import RecordError, read_records

__all__ = ["CrystalValidity", "check_crystal", "validity_report", "structural_validity", "compositional_validity",
           "space_group_consistency", "multiplicity_consistency", "cdvae_compositional_validity", "summarize", "mof_validity", "known_nodes",
           "MIN_DISTANCE", "MIN_VOLUME", "SYMPREC"]

MIN_VOLUME = 0.1  # Angstrom^3
SYMPREC = 0.1  # Angstrom


@dataclass
class CrystalValidity:
    """The outcome of every check; ``valid`` is all four. ``None``: not checked (the text did not parse)."""

    parsed: bool = False
    structural: bool | None = None
    compositional: bool | None = None
    space_group: bool | None = None
    multiplicity: bool | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return bool(self.parsed and self.structural and self.compositional and self.space_group and self.multiplicity)

    def as_dict(self) -> dict:
        return {**asdict(self), "valid": self.valid}


def _merged(cell: Crystal) -> tuple[np.ndarray, list[dict[str, float]]]:
    """Distinct positions (fractional, closer than 0.001 A merged) and the species with occupancy on each."""
    frac = np.array([s.frac for s in cell.sites], dtype=float) % 1.0
    positions: list[np.ndarray] = []
    species: list[dict[str, float]] = []
    for members in position_groups(frac, cell.matrix(), 1e-3):
        positions.append(frac[members[0]])
        on_site: dict[str, float] = {}
        for j in members:
            s = cell.sites[j]
            on_site[s.element] = on_site.get(s.element, 0.0) + s.occ
        species.append(on_site)
    return np.array(positions), species


def structural_validity(cell: Crystal, min_distance: float = MIN_DISTANCE,
                        min_volume: float = MIN_VOLUME) -> tuple[bool, str]:
    """(ok, reason) for a full unit cell: all distances >= min_distance, volume >= min_volume."""
    matrix = cell.matrix()
    volume = abs(float(np.linalg.det(matrix)))
    if not np.isfinite(volume) or volume < min_volume:
        return False, f"cell volume {volume:.3g} A^3 < {min_volume}"
    positions, species = _merged(cell)
    for sp in species:
        if sum(sp.values()) > 1.001:
            return False, f"atoms closer than 0.001 A ({', '.join(sp)})"
    cart = positions @ matrix
    # every image within min_distance of the home cell: enough cells to cover the thinnest width
    _, images = periodic_images(cart, matrix, min_distance)
    from scipy.spatial import cKDTree  # lazily: scipy.spatial costs ~0.5 s of start-up in every process

    dist, _ = cKDTree(images).query(cart, k=2)  # nearest is the atom itself
    shortest = float(dist[:, 1].min()) if len(images) > 1 else float("inf")
    if shortest < min_distance:
        i = int(dist[:, 1].argmin())
        return False, f"atoms {shortest:.3f} A apart (< {min_distance} A) near {','.join(species[i])}"
    return True, ""


def _composition(cell: Crystal) -> dict[str, int]:
    counts: dict[str, Fraction] = {}
    for s in cell.sites:
        counts[s.element] = counts.get(s.element, Fraction(0)) + Fraction(s.occ).limit_denominator(1000)
    scale = 1
    for v in counts.values():
        scale = scale * v.denominator // np.gcd(scale, v.denominator)
    return {e: int(v * scale) for e, v in counts.items() if v > 0}


def compositional_validity(composition: dict[str, int] | str) -> tuple[bool, str]:
    """(ok, reason): SMACT charge neutrality + Pauling electronegativity test (alloys valid)."""
    try:
        from pymatgen.core import Composition
        from smact.screening import smact_validity
    except ImportError:  # pragma: no cover
        raise RuntimeError("compositional validity needs smact (pip install 'logos[materials]')") from None
    comp = Composition(composition)
    try:
        ok = bool(smact_validity(comp, use_pauling_test=True, include_alloys=True))
    except Exception as e:  # SMACT lacks data for some elements (noble gases, actinides)
        return False, f"SMACT cannot judge {comp.reduced_formula}: {type(e).__name__}: {e}"
    return ok, "" if ok else f"{comp.reduced_formula}: no charge-neutral, electronegativity-ordered oxidation states"


def cdvae_compositional_validity(composition: dict[str, float]) -> bool:
    """CDVAE's ``smact_validity`` (Xie et al. 2022) on SMACT 4.0: composition {element: count}."""
    import itertools
    from math import gcd

    import smact
    from smact.screening import pauling_test

    elements = sorted(e for e, c in composition.items() if c > 0)
    if len(elements) <= 1:
        return bool(elements)
    if all(e in smact.metals for e in elements):
        return True
    counts = [int(round(composition[e])) for e in elements]
    g = 0
    for c in counts:
        g = gcd(g, c)
    counts = [c // max(g, 1) for c in counts]
    try:
        space = smact.element_dictionary(tuple(elements))
    except (NameError, KeyError):
        return False
    smact_elems = [space[e] for e in elements]
    electronegs = [e.pauling_eneg for e in smact_elems]
    stoichs = [(c,) for c in counts]
    # SMACT lists no oxidation states for some elements (noble gases, the heaviest): no charge-neutral assignment
    for ox_states in itertools.product(*((e.oxidation_states or ()) for e in smact_elems)):
        if smact.neutral_ratios(ox_states, stoichs=stoichs, threshold=max(counts)):
            try:
                ok = pauling_test(ox_states, electronegs)
            except TypeError:  # no electronegativity data: CDVAE assumes it is fine
                ok = True
            if ok:
                return True
    return False


def space_group_consistency(cell: Crystal, stated: int, symprec: float = SYMPREC) -> tuple[bool, str]:
    positions, species = _merged(cell)
    kinds: dict[tuple, int] = {}
    types = [kinds.setdefault(tuple(sorted((e, round(o, 3)) for e, o in sp.items())), len(kinds) + 1) for sp in species]
    try:
        with quiet_spglib():
            ds = spglib.get_symmetry_dataset((cell.matrix(), positions, types), symprec=symprec)
    except Exception as e:
        return False, f"spglib: {e}"
    if ds is None:
        return False, f"spglib finds no symmetry: {spglib.get_error_message()}"
    if int(ds.number) != stated:
        return False, f"stated space group {stated}, spglib finds {ds.number} at symprec {symprec}"
    return True, ""


def multiplicity_consistency(asym: Crystal, sizes: list[int]) -> tuple[bool, str]:
    problems = []
    for site, size in zip(asym.sites, sizes):
        try:
            m = multiplicity(asym.space_group, site.wyckoff)
        except KeyError as e:
            problems.append(str(e.args[0]))
            continue
        if m != size:
            problems.append(f"{site.element} at {site.wyckoff} ({m}) expands to {size} atoms")
    return (not problems), "; ".join(problems[:3])


def check_crystal(text: str) -> CrystalValidity:
    """All four checks on one grammar text (any ``<CrystalS>`` record)."""
    out = CrystalValidity()
    try:
        validate(text)
        asym, sizes = expand(parse_crystal_text(text))
        cell = unit_cell(asym)
    except (GrammarError, RecordError) as e:
        out.reasons.append(str(e))
        return out
    out.parsed = True
    for name, (ok, reason) in (
        ("structural", structural_validity(cell)),
        ("compositional", compositional_validity(_composition(cell))),
        ("space_group", space_group_consistency(cell, asym.space_group)),
        ("multiplicity", multiplicity_consistency(asym, sizes)),
    ):
        setattr(out, name, ok)
        if not ok:
            out.reasons.append(f"{name}: {reason}")
    return out


def summarize(texts: Iterable[str]) -> dict:
    """Rates over many generated crystal texts: parsed, each check, all valid, unique valid."""
    results = [(t, check_crystal(t)) for t in texts]
    n = len(results)
    if not n:
        return {"n": 0}
    rate = lambda f: sum(1 for _, r in results if f(r)) / n  # noqa: E731
    return {
        "n": n,
        "parsed": rate(lambda r: r.parsed),
        "structural": rate(lambda r: r.structural),
        "compositional": rate(lambda r: r.compositional),
        "space_group": rate(lambda r: r.space_group),
        "multiplicity": rate(lambda r: r.multiplicity),
        "valid": rate(lambda r: r.valid),
        "unique_valid": len({t for t, r in results if r.valid}) / n,
    }


# ---------------------------------------------------------------- MOFs
def mof_validity(text: str, known_nodes: set[str] | None = None) -> dict:
    """Validity of a generated MOF: linkers parse (RDKit) and the node was seen in training."""
    node, linkers = parse_mof_text(text)
    bad = []
    for s in linkers:
        try:
            parse_smiles(s)
        except RecordError as e:
            bad.append(str(e))
    result = {"node": node, "linkers_valid": bool(linkers) and not bad,
              "node_known": None if known_nodes is None else node in known_nodes, "reasons": bad}
    result["valid"] = result["linkers_valid"] and result["node_known"] is not False
    if result["node_known"] is False:
        result["reasons"].append(f"node {node!r} not seen in the training data")
    return result


def known_nodes(paths: Iterable[Path]) -> set[str]:
    """The node strings of every MOF record in tokenized JSONL files (the training data)."""
    nodes = set()
    for path in paths:
        for rec in read_records(Path(path)):
            if METAL_OPEN in rec["text"]:
                try:
                    nodes.add(parse_mof_text(rec["text"])[0])
                except RecordError:
                    continue
    return nodes


def validity_report(texts: Iterable[str], known_nodes: set[str] | None = None) -> dict:
    """Validity rates of generated materials: crystal texts (all four checks) and MOF texts
    (linkers parse, node seen in training when ``known_nodes`` is given)."""
    texts = list(texts)
    crystals = [t for t in texts if t.lstrip().startswith(CRYSTAL_OPEN)]
    mofs = [t for t in texts if t.lstrip().startswith(MOF_OPEN)]
    report: dict = {"crystal": summarize(crystals)}
    results = []
    for t in mofs:
        try:
            validate(t)
            results.append(mof_validity(t, known_nodes))
        except (GrammarError, RecordError) as e:
            results.append({"valid": False, "linkers_valid": False, "node_known": None, "reasons": [str(e)]})
    n = len(results)
    report["mof"] = {"n": n} if not n else {
        "n": n,
        "linkers_valid": sum(bool(r["linkers_valid"]) for r in results) / n,
        "node_known": None if known_nodes is None else sum(bool(r["node_known"]) for r in results) / n,
        "valid": sum(bool(r["valid"]) for r in results) / n,
        "unique_valid": len({t for t, r in zip(mofs, results) if r["valid"]}) / n,
    }
    return report
