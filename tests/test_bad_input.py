"""Bad input: every good record is written, every bad one gets one clear line, never a traceback."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

from conftest import ASSETS, records

GOOD = (ASSETS / "molecules" / "moses_test_200.smi").read_text().splitlines()[:20]


def test_mixed_file_keeps_good_records_and_reports_each_bad_one(tmp_path):
    lines = list(GOOD[:10]) + ["C1CC unclosed_ring", "", "c1cccc1 bad_aromatic", "C(C(C missing_paren",
                               "CN(C)(C)(C)C hypervalent"] + list(GOOD[10:])
    src = tmp_path / "mixed.smi"
    src.write_text("\n".join(lines) + "\n")
    binary = tmp_path / "image.smi"
    binary.write_bytes(bytes(range(256)) * 8)
    fake_gz = tmp_path / "fake.smi.gz"
    fake_gz.write_text("CCO\n")
    real_gz = tmp_path / "real.smi.gz"
    real_gz.write_bytes(gzip.compress(("\n".join(GOOD[:3]) + "\n").encode()))
    out = tmp_path / "out.jsonl"
    proc = subprocess.run([sys.executable, "-m", "logos.cli", "tokenize", src, binary, fake_gz, real_gz,
                           tmp_path / "missing.smi", "-o", out], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    recs = records(out)
    assert len(recs) == 23  # 20 good lines + 3 from the real gzip
    errors = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    by_source = {e["source"]: e["reason"] for e in errors}
    assert set(by_source) == {f"{src}:11", f"{src}:12", f"{src}:13", f"{src}:14", f"{src}:15",
                              str(binary), str(fake_gz), str(tmp_path / "missing.smi")}
    assert "unclosed ring" in by_source[f"{src}:11"]
    assert by_source[f"{src}:12"] == "empty line"
    assert "kekulize" in by_source[f"{src}:13"]
    assert "valence" in by_source[f"{src}:15"].lower()
    assert "binary" in by_source[str(binary)]
    assert "not gzip" in by_source[str(fake_gz)]
    assert "No such file" in by_source[str(tmp_path / "missing.smi")]
    stderr_lines = [l for l in proc.stderr.splitlines() if not l.startswith("tokenize:")]
    assert len(stderr_lines) == len(errors)  # exactly one line per bad record or file


def test_workers_give_identical_output(tmp_path, run_cli):
    src = ASSETS / "molecules" / "pubchem_charged_stereo_120.smi"
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert run_cli("tokenize", src, "-o", one, "-q")[0] == 0
    assert run_cli("tokenize", src, "-o", two, "-q", "--workers", "2")[0] == 0
    assert records(one) == records(two)


def test_detokenize_reports_ungrammatical_and_invalid_records(tmp_path, run_cli):
    src = tmp_path / "gen.jsonl"
    rows = [{"text": "<MoleculeS>CCO<MoleculeE>"},
            {"text": "<MoleculeS>CC(=O<MoleculeE>"},           # does not parse: position reported
            {"text": "<MoleculeS>c1cccc1<MoleculeE>"},          # parses, but RDKit rejects it
            {"text": "<MoleculeS>c1ccccc1<MoleculeE>", "id": "benzene"}]
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    out = tmp_path / "out.smi"
    code, err = run_cli("detokenize", src, "-o", out, "-q")
    assert code == 1 and "Traceback" not in err
    assert out.read_text().splitlines() == ["CCO\tgen.jsonl:1".replace("gen.jsonl", str(src)), "c1ccccc1\tbenzene"]
    errors = [json.loads(l) for l in (tmp_path / "out.smi.errors.jsonl").read_text().splitlines()]
    assert [e["source"] for e in errors] == [f"{src}:2", f"{src}:3", f"{src}:5"]
    assert "position 16" in errors[0]["reason"]
    assert "kekulize" in errors[1]["reason"]


def test_unknown_output_suffix_is_a_usage_error(tmp_path, run_cli):
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps({"text": "<MoleculeS>C<MoleculeE>"}) + "\n")
    code, err = run_cli("detokenize", src, "-o", tmp_path / "out.xyz")
    assert code == 2 and "no detokenizer writes" in err


def test_byte_order_mark_latin1_and_huge_fields(tmp_path, run_cli):
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffid,smiles\nm1,CCO\nm2,c1ccccc1\n".encode("utf-8"))
    latin = tmp_path / "latin.csv"
    latin.write_bytes("smiles,name\nCCO,\xe9thanol\n".encode("latin-1"))
    huge = tmp_path / "huge.csv"
    huge.write_text("smiles,note\nCCO,a\nCCN," + "x" * 200_000 + "\nCCC,b\n")
    out = tmp_path / "out.jsonl"
    code, err = run_cli("tokenize", bom, latin, huge, "-o", out, "-q")
    assert code == 0, err
    recs = records(out)
    assert [(r.get("id"), r["text"]) for r in recs[:2]] == [("m1", "<MoleculeS>CCO<MoleculeE>"),
                                                              ("m2", "<MoleculeS>c1ccccc1<MoleculeE>")]
    assert recs[2]["id"] == "\xe9thanol"
    assert len(recs) == 6


def test_detokenize_keeps_the_tokenize_error_log(tmp_path, run_cli):
    src = tmp_path / "m.smi"
    src.write_text("CCO\nC1CC\n")
    out = tmp_path / "c.jsonl"
    assert run_cli("tokenize", src, "-o", out, "-q")[0] == 1
    assert run_cli("detokenize", out, "-o", tmp_path / "c.smi", "-q")[0] == 0
    assert (tmp_path / "c.errors.jsonl").exists()


def test_unwritable_output_is_one_line(tmp_path, run_cli):
    src = tmp_path / "m.smi"
    src.write_text("CCO\n")
    code, err = run_cli("tokenize", src, "-o", tmp_path, "-q")
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_dative_bonds_round_trip(tmp_path, run_cli):
    """RDKit writes coordination bonds as -> / <-; the grammar and the reaction splitter accept them."""
    from logos.language.grammar import validate
    src = tmp_path / "pt.smi"
    src.write_text("[NH3]->[Pt](<-[NH3])(Cl)Cl cisplatin\n")
    rxn = tmp_path / "pt.rsmi"
    rxn.write_text("[NH3]->[Pt](Cl)Cl.O>>[OH2]->[Pt](Cl)Cl aqua\n")
    out = tmp_path / "pt.jsonl"
    assert run_cli("tokenize", src, rxn, "-o", out, "-q")[0] == 0
    recs = records(out)
    assert [r["domain"] for r in recs] == ["molecule", "reaction"]
    for r in recs:
        validate(r["text"])
    assert run_cli("detokenize", out, "-o", tmp_path / "back.smi", "-q")[0] == 1  # the reaction is not a .smi
    assert (tmp_path / "back.smi").read_text().split("\t")[0] == "[NH3]->[Pt](<-[NH3])([Cl])[Cl]"
