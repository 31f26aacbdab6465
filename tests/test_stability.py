"""Crystal stability (logos.evaluate.stability): known answers on Materials Project structures with CHGNet.

The reference set is two DFT-relaxed Materials Project structures of the fixtures (HgS, cinnabar; CsGeCl3).
The "generated" structures are those two moved to another origin (relaxed on their own, so their energy
is recomputed, not read from the cache), a rattled and a strained copy, an absurd low-density cell, and two
structures the potential cannot take (unreadable, disordered). One relaxation pass (module fixture)
serves every test; the cache is the module's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow  # CHGNet relaxations: make test-slow

ASSETS = Path(__file__).parent / "assets"
MP = [ASSETS / "crystal" / "mp_dielectric_3639.cif", ASSETS / "crystal" / "mp_dielectric_10.vasp"]  # HgS, CsGeCl3
BROKEN = ASSETS / "crystal" / "broken_missing_cell.cif"
OPTIONS = dict(fmax=0.05, steps=200, seconds=60.0, workers=2)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stability_cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOGOS_CACHE", str(folder))
        yield folder


def _copy(item, ident, matrix=None, frac=None):
    from logos.evaluate.crystals import Item

    return Item(ident, 1, matrix if matrix is not None else item.matrix, list(item.species),
                frac if frac is not None else item.frac)


@pytest.fixture(scope="module")
def scored(cache):
    from logos.evaluate.crystals import Item, read_items
    from logos.evaluate.stability import RelaxOptions, evaluate_stability
    from logos.util.records import ErrorLog

    reference = [_copy(read_items(p)[0], name) for p, name in zip(MP, ("HgS", "CsGeCl3"))]
    hgs, csgecl3 = reference
    rng = np.random.default_rng(0)
    m_hgs = np.array(hgs.matrix)
    shifted = [_copy(r, f"{r.id}-shifted", frac=(np.array(r.frac) + [0.13, 0.29, 0.41]) % 1.0) for r in reference]
    cart = np.array(hgs.frac) @ m_hgs + rng.normal(0, 0.2, (len(hgs.frac), 3))
    rattled = _copy(hgs, "HgS-rattled", frac=(cart @ np.linalg.inv(m_hgs)) % 1.0)
    strained = _copy(csgecl3, "CsGeCl3-strained", matrix=(np.array(csgecl3.matrix) * 1.08).tolist())
    absurd = _copy(hgs, "HgS-absurd", matrix=(m_hgs * 3.0).tolist())
    disordered = Item("disordered", 1, hgs.matrix, [{"Hg": 0.5, "Cd": 0.5}] + hgs.species[1:], hgs.frac)
    broken = read_items(BROKEN)[0]
    items = shifted + [rattled, strained, absurd, disordered, broken]
    errors = ErrorLog(cache / "errors.jsonl", echo=lambda line: None)
    m, rows, provenance, relaxed = evaluate_stability(items, [reference], RelaxOptions(**OPTIONS), errors)
    errors.close()
    return {"metrics": m, "rows": {r["id"]: r for r in rows}, "provenance": provenance, "relaxed": relaxed,
            "items": items, "errors": cache / "errors.jsonl"}


def test_materials_project_structures_relax_in_place_and_sit_on_the_hull(scored):
    for name in ("HgS-shifted", "CsGeCl3-shifted"):
        row = scored["rows"][name]
        assert row["converged"], row
        assert row["rmsd"] is not None and row["rmsd"] < 0.1, row
        assert abs(row["volume_change"]) < 0.05 and row["e_drop"] < 0.02, row
        assert abs(row["e_hull"]) < 2e-3, row  # the same phase relaxed from another origin: on the hull
        assert row["stable"] and row["metastable"] and row["near_minimum"], row
        assert row["novel"] is False and row["sun"] is False  # it is the known phase itself


def test_rattled_and_strained_copies_are_flagged_far_from_a_minimum(scored):
    rattled, strained = scored["rows"]["HgS-rattled"], scored["rows"]["CsGeCl3-strained"]
    for row in (rattled, strained):
        assert not row["near_minimum"], row
        assert row["e_drop"] > 0.02, row  # relaxation found a much lower energy: it was not at a minimum
    assert rattled["rmsd"] is None or rattled["rmsd"] > 0.1
    assert abs(strained["volume_change"]) > 0.1
    # relaxed, both come back to the known phase: on the hull again, and not novel
    assert abs(rattled["e_hull"]) < 0.02 and abs(strained["e_hull"]) < 0.02


def test_an_absurd_low_density_cell_is_unstable(scored):
    from logos.evaluate.crystals import to_structure

    absurd = next(it for it in scored["items"] if it.id == "HgS-absurd")
    assert to_structure(absurd).density < 0.5  # g/cm^3; cinnabar is 8.1
    row = scored["rows"]["HgS-absurd"]
    assert row["e_hull"] > 0.5 and not row["stable"] and not row["metastable"], row


def test_structures_the_potential_cannot_take_are_one_line_each(scored):
    lines = [json.loads(x) for x in scored["errors"].read_text().splitlines()]
    assert len(lines) == 2 and "disordered#1" in [x["source"] for x in lines]
    reasons = " ".join(x["reason"] for x in lines)
    assert "disordered" in reasons and "unreadable" in reasons
    assert scored["rows"]["disordered"]["error"] and scored["rows"]["disordered"]["e_hull"] is None


def test_rates_count_every_structure_and_carry_intervals(scored):
    m = scored["metrics"]
    n = len(scored["items"])  # 7: the two that failed count as neither stable nor near a minimum
    assert m["relaxed"] == 5
    stable = sum(bool(r["stable"]) for r in scored["rows"].values())
    assert m["stable"] == pytest.approx(stable / n)
    low, high = m["stable_ci95"]
    assert low < m["stable"] < high
    assert m["sun"] == 0.0 and m["sun_ci95"][0] == 0.0 < m["sun_ci95"][1]  # nothing new here
    assert m["e_hull_ci95"][0] <= m["e_hull"] <= m["e_hull_ci95"][1]
    assert m["hull_with_compounds"] == 1.0  # every hull here holds HgS or CsGeCl3 besides the elements
    assert scored["rows"]["HgS-rattled"]["hull_compounds"] == 1
    p = scored["provenance"]
    assert p["potential"] == "CHGNet 0.3.0" and len(p["weights_sha256"]) == 64
    assert "not DFT" in p["hull"]
    assert set(p["elemental_states"]) == {"Hg", "S", "Cs", "Ge", "Cl"}
    assert p["known_phases"] == 2 + 5  # the two reference crystals and five elemental states


def test_relaxations_are_cached_per_structure(scored, cache):
    from logos.evaluate.stability import RelaxOptions, relax_items

    items = [it for it in scored["items"] if it.id.endswith("-shifted")]
    results, counts = relax_items(items, RelaxOptions(**OPTIONS))
    assert counts == {"cached": 2, "relaxed": 0, "failed": 0}
    first = {r["id"]: r for r in scored["rows"].values()}
    assert results[0]["e_relaxed"] == pytest.approx(first["HgS-shifted"]["e_relaxed"])


def test_evaluate_cli_stability_writes_relaxed_cifs_errors_and_provenance(scored, cache, tmp_path):
    from logos.cli import main

    folder = tmp_path / "generated"
    folder.mkdir()
    for p in MP[:1]:
        (folder / p.name).write_text(p.read_text())
    (folder / BROKEN.name).write_text(BROKEN.read_text())
    out = tmp_path / "report"
    code = main(["evaluate", "--task", "crystal", "--predictions", str(folder), "--references", str(MP[0]),
                 "-o", str(out), "--stability", "--workers", "2"])
    assert code == 1  # one structure could not be relaxed: listed, the rest scored
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["provenance"]["stability"]["potential"] == "CHGNet 0.3.0"
    assert doc["metrics"]["relaxed"] == 1 and doc["metrics"]["stable"] == pytest.approx(0.5)
    rows = doc["tables"]["stability per structure"]
    assert sorted(r["error"] is None for r in rows) == [False, True]
    assert len((out / "stability.errors.jsonl").read_text().splitlines()) == 1
    relaxed = list((out / "relaxed").glob("*.cif"))
    assert len(relaxed) == 1
    from pymatgen.core import Structure

    assert Structure.from_file(relaxed[0]).composition.reduced_formula == "HgS"
    assert "ML-potential hull" in (out / "report.md").read_text()


def test_stability_flag_is_refused_for_other_tasks(tmp_path, capsys):
    from logos.cli import main

    smi = tmp_path / "x.smi"
    smi.write_text("CCO\n")
    assert main(["evaluate", "--task", "molecule", "--predictions", str(smi), "-o", str(tmp_path / "r"),
                 "--stability"]) == 2
    assert "--stability goes with" in capsys.readouterr().err



def test_generated_cifs_are_relaxed_beside_them(scored, cache, tmp_path):
    """What ``logos generate --task crystal --relax`` does after writing ``OUT/``: ``OUT.relaxed/`` with the same
    file names, a table of energies and RMSD, and one error line per CIF that could not be relaxed."""
    from pymatgen.core import Structure

    from logos.evaluate.stability import RelaxOptions, relax_cif_output
    from logos.util.records import ErrorLog

    folder = tmp_path / "crystal"
    folder.mkdir()
    (folder / "000001_HgS_1.cif").write_text(MP[0].read_text())
    (folder / "000002_bad_1.cif").write_text(BROKEN.read_text())
    errors = ErrorLog(tmp_path / "crystal.relaxed.errors.jsonl", echo=lambda line: None)
    summary = relax_cif_output(tmp_path / "crystal.cif", RelaxOptions(**OPTIONS), errors)
    errors.close()
    assert summary["structures"] == 2 and summary["relaxed"] == 1 and summary["converged"] == 1
    assert sorted(p.name for p in (tmp_path / "crystal.relaxed").iterdir()) == ["000001_HgS_1.cif"]
    relaxed = Structure.from_file(tmp_path / "crystal.relaxed" / "000001_HgS_1.cif")
    assert relaxed.composition.reduced_formula == "HgS" and len(relaxed) == 6
    rows = [json.loads(x) for x in (tmp_path / "crystal.relaxed.jsonl").read_text().splitlines()]
    assert [r["file"] for r in rows] == ["000001_HgS_1.cif", "000002_bad_1.cif"]
    assert rows[0]["rmsd"] < 0.1 and "error" in rows[1]
    assert len((tmp_path / "crystal.relaxed.errors.jsonl").read_text().splitlines()) == 1


def test_relax_flag_needs_a_crystal_task_and_a_cif_output(tmp_path, capsys):
    from logos.cli import main

    assert main(["generate", "--task", "molecule", "-n", "1", "-o", str(tmp_path / "m.smi"), "--relax"]) == 2
    assert "--relax goes with --task crystal" in capsys.readouterr().err


def test_a_relaxation_past_the_hard_limit_costs_that_structure_only(scored, cache):
    """A relaxation that runs on (here: a force tolerance it cannot reach, steps and seconds unbounded) is killed at
    ``timeout`` and written as one error; the structure relaxed before it keeps its result."""
    from logos.evaluate.crystals import Item
    from logos.evaluate.stability import RelaxOptions, relax_items

    done = next(it for it in scored["items"] if it.id == "HgS-absurd")  # isolated atoms: no force, done at once
    hgs = next(it for it in scored["items"] if it.id == "HgS-rattled")
    endless = Item("endless", 1, (np.array(hgs.matrix) * 1.03).tolist(), list(hgs.species), hgs.frac)
    options = RelaxOptions(fmax=1e-9, steps=10**6, seconds=10**6, timeout=8.0, workers=1)
    results, counts = relax_items([done, endless], options)
    assert "error" not in results[0] and results[0]["converged"]
    assert "stopped after 8 s" in results[1]["error"]
    assert counts["failed"] == 1
