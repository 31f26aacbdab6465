"""MOF split on real CoRE MOF 2019 frameworks: hand-checked nodes and linkers, errors, writers, validity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rdkit import Chem

from logos.science import materials
from logos.science.materials import framework
from logos.cli import main
from logos.domains import mof
from logos.language.grammar import validate
from logos.util.records import RecordError, WorkItem

ASSETS = Path(__file__).parent / "assets" / "mof"
BDC = "O=C([O-])c1ccc(C(=O)[O-])cc1"  # terephthalate (1,4-benzenedicarboxylate)
BTC = "O=C([O-])c1cc(C(=O)[O-])cc(C(=O)[O-])c1"  # trimesate (1,3,5-benzenetricarboxylate)
BIPY = "c1cc(-c2ccncc2)ccn1"  # 4,4'-bipyridine

# Hand-checked against the published structures: EDUSIF is a MOF-5 (IRMOF-1) analogue, Zn4O(BDC)3;
# FIQCEN is HKUST-1, Cu paddle-wheels Cu2(BTC); ECIWUJ is a Zn(BDC)(4,4'-bipy) pillared framework.
EXPECTED = {
    "EDUSIF_clean": ("Zn4O", [BDC]),
    "FIQCEN_clean": ("Cu2", [BTC]),
    "ECIWUJ_clean": ("Zn", [BDC, BIPY]),
    "FUTYEA_clean": ("Zn", [BTC]),
}
BROKEN = {
    "DAYCAI_clean": "Angstrom apart (overlapping or disordered sites)",
}


def split(name: str) -> tuple[str, list[str]]:
    return materials.split_framework(materials.read_cif_block((ASSETS / f"{name}.cif").read_text()))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_hand_checked_frameworks(name):
    node, linkers = split(name)
    assert (node, linkers) == (EXPECTED[name][0], sorted(Chem.CanonSmiles(s) for s in EXPECTED[name][1]))


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_unclean_frameworks_are_rejected_with_reason(name):
    with pytest.raises(RecordError, match=BROKEN[name].replace("(", r"\(").replace(")", r"\)")):
        split(name)


def test_counter_ions_stay_in_the_inorganic_part():
    node, linkers = split("TIMMIM_charged")  # a cationic Ag framework with BF4- counter-ions
    assert node.split(".")[-1] == "BF4" and node.startswith("Ag") and len(linkers) == 1


def node_of_timmim() -> str:
    return split("TIMMIM_charged")[0]


def test_matching_fallback_agrees_with_xyz2mol(monkeypatch):
    monkeypatch.setattr(framework, "MAX_VALENCE_CHOICES", 0)  # force the matching path
    for name, expected in EXPECTED.items():
        assert split(name) == (expected[0], sorted(Chem.CanonSmiles(s) for s in expected[1]))


def test_not_a_mof():
    nacl = (Path(__file__).parent / "assets" / "crystal" / "NaCl.cif").read_text()
    with pytest.raises(RecordError, match="no organic linker"):
        mof.MofDomain().encode(WorkItem("x", nacl), mof.MofOptions())


def test_cli_tokenize_and_detokenize(tmp_path, capsys):
    out = tmp_path / "mof.jsonl"
    files = sorted(ASSETS.glob("*.cif"))
    code = main(["tokenize", *map(str, files), "--domain", "mof", "-o", str(out), "-q"])
    assert code == 1  # the unclean framework
    err = capsys.readouterr().err
    assert "DAYCAI_clean" in err and "TIMMIM_charged" not in err
    recs = [json.loads(l) for l in out.read_text().splitlines()[1:]]
    assert len(recs) == len(EXPECTED) + 1
    for rec in recs:
        validate(rec["text"])
        assert rec["domain"] == "mof"
    edusif = next(r for r in recs if r["id"] == "EDUSIF_clean")
    assert edusif["text"] == f"<MaterialS><MetalS>Zn4O<MetalE><MoleculeS>{BDC}<MoleculeE><MaterialE>"

    assert materials.known_nodes([out]) == {"Zn4O", "Cu2", "Zn", node_of_timmim()}

    assert main(["detokenize", str(out), "-o", str(tmp_path / "mof.json"), "-q"]) == 0
    objs = json.loads((tmp_path / "mof.json").read_text())
    assert {o["id"]: (o["node"], o["linkers"]) for o in objs}["FIQCEN_clean"] == ("Cu2", [BTC])

    assert main(["detokenize", str(out), "-o", str(tmp_path / "linkers.sdf"), "-q"]) == 0
    mols = [m for m in Chem.SDMolSupplier(str(tmp_path / "linkers.sdf"))]
    assert len(mols) == sum(len(v[1]) for v in EXPECTED.values()) + 1 and all(m is not None for m in mols)


def test_mof_validity():
    good = f"<MaterialS><MetalS>Zn4O<MetalE><MoleculeS>{BDC}<MoleculeE><MaterialE>"
    assert materials.mof_validity(good, {"Zn4O", "Cu2"})["valid"]
    r = materials.mof_validity(good.replace("Zn4O", "Zn9"), {"Zn4O"})
    assert not r["valid"] and "not seen" in r["reasons"][0]
    bad = good.replace(BDC, "c1ccc1C(")
    assert not materials.mof_validity(bad, {"Zn4O"})["valid"]


def test_validity_report_sorts_crystals_and_mofs():
    from logos.science.materials.validity import validity_report

    good = f"<MaterialS><MetalS>Zn4O<MetalE><MoleculeS>{BDC}<MoleculeE><MaterialE>"
    nacl = ("<CrystalS><sg225> 5.640 5.640 5.640 90.00 90.00 90.00 "
            "Na<wa> 0.0000 0.0000 0.0000 Cl<wb> 0.0000 0.0000 0.5000<CrystalE>")
    report = validity_report([good, good.replace("Zn4O", "Cu2"), nacl, "<MaterialS>"], known_nodes={"Zn4O"})
    assert report["crystal"]["n"] == 1 and report["crystal"]["valid"] == 1.0
    assert report["mof"]["n"] == 3 and report["mof"]["valid"] == pytest.approx(1 / 3)
    assert report["mof"]["linkers_valid"] == pytest.approx(2 / 3)
