"""Golden outputs: run the CLI over the test assets and print the sha256 of every file it writes.

Used to show that a refactoring changes no output: run it before and after, compare the digests::

    python scripts/golden_outputs.py OUT_DIR > before.txt   # ... change the code ...
    python scripts/golden_outputs.py OUT_DIR2 > after.txt && diff before.txt after.txt

What varies between identical runs is left out before hashing: the output folder's path, the creation
time in JSONL headers, timing fields (``seconds``) and the package version in reports.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
A = "tests/assets"
P = f"{A}/protein"
CKPT = "checkpoints/logos-tiny"

TOKENIZE = [
    ("molecules", [f"{A}/molecules/moses_test_200.smi", f"{A}/molecules/lipophilicity_100.csv",
                   f"{A}/molecules/cdk2.sdf", f"{A}/molecules/pubchem_charged_stereo_120.smi"], []),
    ("bad", [f"{A}/bad/long_invalid_smiles.smi", f"{A}/bad/nonascii.smi", f"{A}/bad/moses_utf16.smi"], []),
    ("reactions", [f"{A}/reactions/gauche_60.rsmi"], []),
    ("retro", [f"{A}/reactions/gauche_60.rsmi"], ["--retro"]),
    ("proteins", [f"{P}/LuxC.faa"], []),
    ("complex_sdf_ligand", [f"{P}/1s3v_protein.pdb"], ["--ligand", "auto"]),
    ("complex_hetatm_ligands", [f"{P}/7ztl_protein.cif.gz"], []),
    ("site_search", [f"{P}/7ztl_protein.cif.gz"], ["--form", "search"]),
    ("structure_tokens", [f"{P}/1A8O.pdb.gz"], ["--domain", "protein", "--contacts", "--structure-tokens", "3di"]),
    ("crystals", [f"{A}/crystal/NaCl.cif", f"{A}/crystal/mp_dielectric_142.cif", f"{A}/crystal/mp_dielectric_3.json"],
     []),
    ("mofs", [f"{A}/mof/EDUSIF_clean.cif", f"{A}/mof/FIQCEN_clean.cif"], ["--domain", "mof"]),
]
DETOKENIZE = [("molecules", "molecules.smi"), ("molecules", "molecules.sdf"), ("reactions", "reactions.rsmi"),
              ("retro", "retro.rsmi"), ("proteins", "proteins.fasta"),
              ("complex_hetatm_ligands", "pockets.pocket.csv"), ("complex_hetatm_ligands", "ligands.sdf"),
              ("structure_tokens", "residue_contacts.contacts.csv"), ("crystals", "crystals.cif"),
              ("mofs", "mofs.json"), ("mofs", "mof_linkers.sdf")]
GENERATE = [("molecule", None, ["-n", "6"], "gen_molecule.smi"),
            ("retro", "retro_in.smi", ["-n", "2", "--max-new-tokens", "40"], "gen_retro.rsmi"),
            ("forward", "forward_in.smi", ["-n", "2", "--max-new-tokens", "40"], "gen_forward.rsmi"),
            ("mof", None, ["-n", "2", "--max-new-tokens", "40"], "gen_mof.json"),
            ("crystal", "crystal_in.txt", ["-n", "2", "--max-new-tokens", "40", "--cell-composition"], "gen_crystal.cif"),
            ("protein", None, ["-n", "2", "--max-new-tokens", "30"], "gen_protein.fasta"),
            ("pocket", "pocket_in.fasta", ["-n", "1"], "gen_pocket.pocket.csv")]


def logos(*args: str) -> int:
    cmd = [sys.executable, "-c", "import sys; from logos.cli import main; sys.exit(main(sys.argv[1:]))", *args]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    if r.returncode not in (0, 1):
        sys.stderr.write(f"FAILED ({r.returncode}): {' '.join(args)}\n{r.stderr[-2000:]}\n")
    return r.returncode


def digest(path: Path, out: Path) -> str:
    data = path.read_bytes().replace(str(out).encode(), b"OUT")
    if path.suffix == ".jsonl" and data.startswith(b'{"logos_header"'):  # the header's creation time
        head, _, rest = data.partition(b"\n")
        doc = json.loads(head)
        doc["logos_header"].pop("created", None)
        data = json.dumps(doc).encode() + b"\n" + rest
    if path.name == "report.md":  # run times
        data = b"\n".join(line for line in data.split(b"\n") if b" s " not in line and b"seconds" not in line)
    if path.name == "metrics.json":
        doc = json.loads(data)

        def strip(x):
            if isinstance(x, dict):
                return {k: strip(v) for k, v in x.items() if k not in ("seconds", "logos_version", "version", "inputs")}
            return [strip(v) for v in x] if isinstance(x, list) else x
        data = json.dumps(strip(doc), sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def main(out: Path, skip_generate: bool = False, rehash: bool = False) -> None:
    if rehash:  # only hash the files of an earlier run
        return print_digests(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    codes = {}
    for name, inputs, flags in TOKENIZE:
        codes[f"tokenize {name}"] = logos("tokenize", *inputs, *flags, "-o", str(out / f"{name}.jsonl"), "-q")
    for src, dst in DETOKENIZE:
        codes[f"detokenize {dst}"] = logos("detokenize", str(out / f"{src}.jsonl"), "-o", str(out / dst), "-q")
    codes["validate"] = logos("validate", *sorted(str(p) for p in out.glob("*.jsonl")))
    codes["validate bad"] = logos("validate", f"{A}/bad/malformed_grammar.jsonl")
    if not skip_generate:
        (out / "retro_in.smi").write_text("CC(=O)Oc1ccccc1C(=O)O aspirin\nc1ccccc1N aniline\n")
        (out / "forward_in.smi").write_text("CC(=O)O.OCC ester\n")
        (out / "crystal_in.txt").write_text("Na4Cl4 225 nacl\nTiO2 - rutile\n")
        (out / "pocket_in.fasta").write_text(">p1\nMKTAYIAKQR\n")
        for task, inp, flags, dst in GENERATE:
            args = ["generate", "--checkpoint", CKPT, "--task", task, "--seed", "3", *flags, "-o", str(out / dst), "-q"]
            if inp:
                args += ["--input", str(out / inp)]
            codes[f"generate {task}"] = logos(*args)
        codes["evaluate molecule"] = logos("evaluate", "--task", "molecule", "--predictions",
                                           str(out / "gen_molecule.smi"), "--references", f"{A}/moses_500.smi",
                                           "--output", str(out / "eval_molecule"))
        codes["evaluate retro"] = logos("evaluate", "--task", "retro", "--predictions", str(out / "gen_retro.samples.jsonl"),
                                        "--references", f"{A}/evaluate/uspto50k_test_20.csv", "--output",
                                        str(out / "eval_retro"))
    for key, code in codes.items():
        print(f"exit {code} {key}")
    print_digests(out)


def print_digests(out: Path) -> None:
    for p in sorted(out.rglob("*")):
        if p.is_file() and p.suffix != ".png":
            print(f"{digest(p, out)} {p.relative_to(out)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), skip_generate="--no-generate" in sys.argv, rehash="--rehash" in sys.argv)
