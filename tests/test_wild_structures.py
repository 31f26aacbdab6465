"""Structures from the wild: a covalent ligand, a predicted complex with an unknown ligand code, hemes, an NMR ensemble."""

from __future__ import annotations

import json

from rdkit import Chem
from rdkit.Chem.rdMolDescriptors import CalcMolFormula

from conftest import ASSETS, records
from logos.science.chemistry import molecules_in_text
from logos.language.grammar import validate

PROT = ASSETS / "protein"


def _canon(smiles: str) -> str:
    return Chem.MolToSmiles(Chem.MolFromSmiles(smiles))


def _ligand(rec: dict) -> str:
    return molecules_in_text(rec["text"])[-1]


def test_covalent_acyl_enzyme_keeps_the_ligand_atoms_the_model_has(tmp_path, run_cli):
    """1GBT: 4-guanidinobenzoyl on Ser195 of trypsin, old atom names (CD, OD, C21...) not in the CCD entry GBS."""
    out = tmp_path / "out.jsonl"
    code, err = run_cli("tokenize", PROT / "1gbt_covalent_GBS.pdb", "-o", out, "-q")
    assert code == 0, err
    (rec,) = records(out)
    validate(rec["text"])
    lig = rec["meta"]["ligand"]
    assert lig["name"] == "GBS" and lig["bond_orders"] == "ccd-graph"
    assert lig["unmodelled_atoms"] == 1  # the acid's OH, lost to the ester bond with Ser195 OG
    # The acyl group as modelled: the CCD's 4-guanidinobenzoic acid less one oxygen.
    assert _canon(_ligand(rec)) == _canon("NC(=N)Nc1ccc(cc1)C=O")
    assert len(lig["atoms"]) == 12 and {"CD", "OD"} <= set(lig["atoms"])


def test_hemes_are_written_with_dative_bonds(tmp_path, run_cli):
    """19HC (nine-haem cytochrome c), cut to one haem's neighbourhood: three HEM ligands."""
    out = tmp_path / "out.jsonl"
    code, err = run_cli("tokenize", PROT / "19hc_heme.pdb", "-o", out, "-q")
    assert code == 0, err
    recs = records(out)
    assert [r["meta"]["ligand"]["name"] for r in recs] == ["HEM", "HEM", "HEM"]
    for rec in recs:
        validate(rec["text"])
        smiles = _ligand(rec)
        assert "->" in smiles or "<-" in smiles
        assert rec["meta"]["ligand"]["dative_bonds"] is True
        assert CalcMolFormula(Chem.MolFromSmiles(smiles)) == "C34H32FeN4O4"  # heme b
    smi = tmp_path / "ligands.smi"
    code, err = run_cli("detokenize", out, "-o", smi, "-q")
    assert code == 0, err
    assert len(smi.read_text().splitlines()) == 3


def test_predicted_complex_with_unknown_ligand_code(tmp_path, run_cli):
    """7ZTL with its ligand JWG renamed LIG1 (as structure-prediction models write it): refused by default,
    bond orders from a template or from geometry on request, each flagged in meta."""
    golden = (PROT / "7ztl_JWG.golden.txt").read_text()
    jwg = molecules_in_text(golden.strip())[-1]  # the CCD-derived ligand of the unrenamed entry
    src = PROT / "7ztl_LIG1_predicted.cif.gz"

    out = tmp_path / "plain.jsonl"
    code, err = run_cli("tokenize", src, "-o", out, "-q")
    assert code == 1 and "--ligand-smiles LIG1=SMILES" in err and "--perceive-bonds" in err
    assert [r["meta"]["ligand"]["name"] for r in records(out)] == ["ADP"]  # the other ligand is still written

    for flags, how in ((["--ligand-smiles", f"LIG1={jwg}"], "template"), (["--perceive-bonds"], "perceived")):
        out = tmp_path / f"{how}.jsonl"
        code, err = run_cli("tokenize", src, "-o", out, "-q", *flags)
        assert code == 0, err
        (rec,) = [r for r in records(out) if r["meta"]["ligand"]["name"] == "LIG1"]
        validate(rec["text"])
        assert rec["meta"]["ligand"]["bond_orders"] == how
        assert _canon(_ligand(rec)) == _canon(jwg)


def test_template_that_does_not_fit_is_one_error_line(tmp_path, run_cli):
    out = tmp_path / "out.jsonl"
    code, err = run_cli("tokenize", PROT / "7ztl_LIG1_predicted.cif.gz", "-o", out, "-q",
                        "--ligand-smiles", "LIG1=c1ccccc1")
    assert code == 1
    errors = [json.loads(l) for l in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert len(errors) == 1 and "do not match the template" in errors[0]["reason"]


def test_nmr_ensemble_says_which_model_was_read(tmp_path, run_cli):
    out = tmp_path / "out.jsonl"
    code, err = run_cli("tokenize", PROT / "1LCD.pdb.gz", "-o", out, "-q")
    assert code == 0, err
    (rec,) = records(out)
    assert rec["meta"]["model"] == "1 of 3"


def test_ccd_index_agrees_with_biotite_and_lists_leaving_atoms():
    """The prebuilt CCD index (heavy atoms, charges, bonds, leaving flags) says what biotite's CCD says."""
    import biotite.structure.info as info

    from logos.domains.ccd_index import component

    for code in ("HEM", "ADP", "NAG", "SF4", "GBS"):
        ref = info.residue(code)
        heavy = [i for i, e in enumerate(ref.element) if e not in ("H", "D")]
        local = {i: k for k, i in enumerate(heavy)}
        comp = component(code)
        assert comp.atom_names == tuple(str(ref.atom_name[i]) for i in heavy)
        assert comp.charges == tuple(int(ref.charge[i]) for i in heavy)
        bonds = {(*sorted((local[int(i)], local[int(j)])), int(t)) for i, j, t in ref.bonds.as_array()
                 if int(i) in local and int(j) in local}
        assert {(*sorted((i, j)), t) for i, j, t in comp.bonds} == bonds
    assert component("GBS").leaving == frozenset({"O1"})  # the acid oxygen the CCD flags as leaving
    assert component("HEM").elements.count("FE") == 1
    assert component("ZZZ9") is None
