"""Molecule encoder/detokenizer on real molecule sets: canonical round trips, readers, options."""

from __future__ import annotations

import csv

import pytest
from rdkit import Chem

from conftest import ASSETS, records
from logos.domains import molecule
from logos.language.grammar import validate

MOLS = ASSETS / "molecules"
SMI_SETS = ["moses_test_200.smi", "chembl_actives_50.smi", "pubchem_charged_stereo_120.smi"]


def canon(smiles: str) -> str:
    return Chem.MolToSmiles(Chem.MolFromSmiles(smiles))


def input_smiles(path) -> list[str]:
    return [line.split()[0] for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("name", SMI_SETS)
def test_smiles_round_trip_is_canonical(tmp_path, run_cli, name):
    src = MOLS / name
    out = tmp_path / "mols.jsonl"
    code, err = run_cli("tokenize", src, "-o", out, "-q")
    assert code == 0, err
    recs = records(out)
    originals = input_smiles(src)
    assert len(recs) == len(originals)
    for rec in recs:
        validate(rec["text"])
        assert rec["domain"] == "molecule"
    back = tmp_path / "back.smi"
    code, err = run_cli("detokenize", out, "-o", back, "-q")
    assert code == 0, err
    decoded = [line.split("\t")[0] for line in back.read_text().splitlines()]
    assert [canon(s) for s in decoded] == [canon(s) for s in originals]


def test_sdf_input_and_sdf_output_round_trip(tmp_path, run_cli):
    src = MOLS / "cdk2.sdf"
    out = tmp_path / "cdk2.jsonl"
    assert run_cli("tokenize", src, "-o", out, "-q")[0] == 0
    recs = records(out)
    expected = [Chem.MolToSmiles(m) for m in Chem.SDMolSupplier(str(src))]
    assert len(recs) == len(expected) == 47
    assert recs[0]["id"] == "ZINC03814457" and recs[0]["source"].endswith("cdk2.sdf:1")
    sdf = tmp_path / "back.sdf"
    assert run_cli("detokenize", out, "-o", sdf, "-q")[0] == 0
    mols = list(Chem.SDMolSupplier(str(sdf)))
    assert [Chem.MolToSmiles(m) for m in mols] == expected
    assert all(m.GetConformer().Is3D() is False for m in mols)  # 2D depiction by default
    assert mols[0].GetProp("_Name") == "ZINC03814457"


def test_sdf_3d_output_has_real_conformers(tmp_path, run_cli):
    out = tmp_path / "m.jsonl"
    src = tmp_path / "few.smi"
    # Specified stereo must survive embedding; unspecified centres get whichever the conformer has.
    src.write_text("N[C@@H](C)C(=O)O L-alanine\nC/C=C/C(=O)O crotonic\n"
                   + "".join(MOLS.joinpath("moses_test_200.smi").read_text().splitlines(True)[:3]))
    assert run_cli("tokenize", src, "-o", out, "-q")[0] == 0
    sdf = tmp_path / "m3d.sdf"
    assert run_cli("detokenize", out, "-o", sdf, "--3d", "-q")[0] == 0
    mols = [m for m in Chem.SDMolSupplier(str(sdf), removeHs=False)]
    assert len(mols) == 5
    for k, (mol, original) in enumerate(zip(mols, input_smiles(src))):
        assert mol.GetConformer().Is3D()
        assert any(a.GetAtomicNum() == 1 for a in mol.GetAtoms())
        heavy = Chem.RemoveHs(mol)
        if k < 2:
            assert Chem.MolToSmiles(heavy) == canon(original)
        else:
            assert Chem.MolToSmiles(heavy, isomericSmiles=False) == Chem.MolToSmiles(
                Chem.MolFromSmiles(original), isomericSmiles=False)


def test_csv_column_detected_and_explicit(tmp_path, run_cli):
    src = MOLS / "lipophilicity_100.csv"
    out = tmp_path / "lipo.jsonl"
    assert run_cli("tokenize", src, "-o", out, "-q", "--id-column", "CMPD_CHEMBLID")[0] == 0
    recs = records(out)
    rows = list(csv.DictReader(src.open()))
    assert len(recs) == len(rows) == 100
    assert recs[0]["id"] == "CHEMBL596271"
    assert [r["text"] for r in recs] == [molecule.span(canon(row["smiles"])) for row in rows]
    out2 = tmp_path / "lipo2.jsonl"
    assert run_cli("tokenize", src, "-o", out2, "-q", "--column", "smiles")[0] == 0
    assert [r["text"] for r in records(out2)] == [r["text"] for r in recs]


def test_missing_column_is_one_clear_error(tmp_path, run_cli):
    out = tmp_path / "x.jsonl"
    code, err = run_cli("tokenize", MOLS / "lipophilicity_100.csv", "-o", out, "-q", "--column", "nope")
    assert code == 1
    assert "column 'nope' not found" in err and "Traceback" not in err
    assert records(out) == []


def test_augment_gives_distinct_equivalent_smiles(tmp_path, run_cli):
    out = tmp_path / "aug.jsonl"
    src = MOLS / "chembl_actives_50.smi"
    assert run_cli("tokenize", src, "-o", out, "-q", "--augment", "3")[0] == 0
    recs = records(out)
    by_source: dict[str, list[str]] = {}
    for r in recs:
        validate(r["text"])
        by_source.setdefault(r["source"], []).append(molecule.molecules_in_text(r["text"])[0])
    assert len(by_source) == 50
    for variants in by_source.values():
        assert len(set(variants)) == len(variants) == 4
        assert len({canon(v) for v in variants}) == 1
    out2 = tmp_path / "aug2.jsonl"
    run_cli("tokenize", src, "-o", out2, "-q", "--augment", "3")
    assert [r["text"] for r in records(out2)] == [r["text"] for r in recs]  # seeded: reproducible


def test_kekule_form(tmp_path, run_cli):
    out = tmp_path / "k.jsonl"
    src = MOLS / "moses_test_200.smi"
    assert run_cli("tokenize", src, "-o", out, "-q", "--kekule")[0] == 0
    recs = records(out)
    smiles = [molecule.molecules_in_text(r["text"])[0] for r in recs]
    for s in smiles:  # written without aromatic atoms or bonds
        raw = Chem.MolFromSmiles(s, sanitize=False)
        assert not any(a.GetIsAromatic() for a in raw.GetAtoms())
        assert not any(b.GetIsAromatic() for b in raw.GetBonds())
    assert any("=" in s and "c" not in s for s in smiles)
    assert [canon(s) for s in smiles] == [canon(s) for s in input_smiles(src)]


def test_golden_text():
    mol = molecule.parse_smiles("OC(=O)[C@@H](N)C")
    assert molecule.encode_mol(mol, molecule.MoleculeOptions()) == ["<MoleculeS>C[C@H](N)C(=O)O<MoleculeE>"]
    salt = molecule.parse_smiles("[Na+].[O-]C(=O)c1ccccc1")
    assert molecule.encode_mol(salt, molecule.MoleculeOptions()) == ["<MoleculeS>O=C([O-])c1ccccc1.[Na+]<MoleculeE>"]
