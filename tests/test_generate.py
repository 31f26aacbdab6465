"""logos generate: every task from one command, constraints that hold on a random model, files, ranks, metrics.

Validity is recomputed here with plain RDKit from the texts, never with logos's own metrics.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from rdkit import Chem, rdBase

from conftest import ASSETS, REPO
from train_fixtures import random_checkpoint
from logos.generate import GenerateOptions, Sampling, generate
from logos.decoding.chemistry import SmilesState
from logos.decoding.constraints import TokenTable
from logos.language.grammar import is_valid

SHIPPED = REPO / "checkpoints" / "logos-tiny"
TOKENIZER = REPO / "tokenizers" / "default"


def _canonical(smiles: str) -> str | None:
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles)
    return Chem.MolToSmiles(mol) if mol is not None and mol.GetNumAtoms() else None


def _samples(out) -> list[dict]:
    return [json.loads(line) for line in out.with_name(out.name.split(".")[0] + ".samples.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    """A randomly initialised tiny Llama with the LOGOS tokenizer: constraints must hold whatever it samples."""
    from transformers import AutoTokenizer

    path = random_checkpoint(tmp_path_factory.mktemp("random") / "ckpt")
    assert len(AutoTokenizer.from_pretrained(str(TOKENIZER))) == 2394
    return path


def test_token_table_bans_what_a_task_never_writes():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    table = TokenTable(tok, 2432)
    close = tok.convert_tokens_to_ids("<MoleculeE>")
    banned = table.banned({"<MoleculeE>"}, keep={close})
    for t in ("<s>", "</s>", "<pad>", "<unk>", "<MoleculeS>", "<ProteinS>", "<React>", "<0x43>"):
        assert banned[tok.convert_tokens_to_ids(t)], t
    assert not banned[close] and not banned[tok.convert_tokens_to_ids("C")]
    assert banned[len(tok):].all()  # padded vocabulary rows
    assert table.text[tok.convert_tokens_to_ids("C")] == "C"


def test_crystal_sites_must_add_up_to_the_prompt_composition():
    """Pm-3m (221): a, b hold 1 atom, c, d 3, e 6. CaTiO3 as Ca<wa> Ti<wb> O<wc> closes; other counts never do."""
    from transformers import AutoTokenizer

    from logos.decoding.composition import CompositionRows

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    table = TokenTable(tok, len(tok))
    rows = CompositionRows(table, ["<CrystalS>Ca1O3Ti1", "<CrystalS>"])
    head = "<CrystalS>Ca1O3Ti1<sg221>3.905"
    assert rows.feasible(0, head + " Ca<wa> Ti<wb> O<wc>", final=True)
    assert not rows.feasible(0, head + " Ca<wa> Ti<wb>", final=True)  # oxygens missing
    assert not rows.feasible(0, head + " Ca<wa> O<we>", final=False)  # 6 oxygens > 3
    assert not rows.feasible(0, head + " Ca<wa> Ca<wb>", final=False)  # a second calcium
    assert not rows.feasible(0, head + " Ca<wa> N", final=False)  # no nitrogen in the composition
    assert rows.feasible(0, head + " Ca<wa> O", final=False)  # oxygen (or osmium) may start
    close = tok.convert_tokens_to_ids("<CrystalE>")
    rows.texts[0] = head + " Ca<wa> Ti<wb> O<wc>"
    assert rows.check(0, close)
    rows.texts[0] = head + " Ca<wa>"
    assert not rows.check(0, close)
    assert rows.check(1, close)  # no composition header: not counted


def test_smiles_state_accepts_real_molecules_and_refuses_broken_ones():
    with open(ASSETS / "molecules" / "pubchem_charged_stereo_120.smi") as fh:
        real = [line.split()[0] for line in fh if line.strip()]
    for smi in real:  # charges, stereo, salts, brackets: every real molecule is accepted to the end
        state = SmilesState()
        state.feed(smi)
        assert state.can_close(), smi
    for broken in ("C1CC", "C(C", "FC(F)(F)(F)F", "O=O=O", "C1CC1C1", "N(C)(C)(C)C", "cc"):
        state = SmilesState()
        try:
            state.feed(broken)
            ok = state.can_close()
        except ValueError:
            ok = False
        assert not ok and _canonical(broken) is None, broken


@pytest.mark.parametrize("constrained", [True, False])
def test_shipped_model_molecules_files_ranks_and_errors(tmp_path, constrained):
    out = tmp_path / "gen.smi"
    options = GenerateOptions(n=16, batch_size=8, seed=0, constrained=constrained)
    result = generate(SHIPPED, out, options, progress=False)
    samples = _samples(out)
    assert len(samples) == len(result.samples) == 16 and [s["rank"] for s in samples] == list(range(1, 17))
    valid = [(f"gen#{s['rank']}", _canonical(s["text"][len("<MoleculeS>"):-len("<MoleculeE>")]))
             for s in samples if re.fullmatch(r"<MoleculeS>[^<]+<MoleculeE>", s["text"])]
    valid = [(i, c) for i, c in valid if c is not None]
    written = [tuple(reversed(line.split("\t"))) for line in out.read_text().splitlines()]
    assert written == [(i, c) for i, c in valid]  # exactly the RDKit-valid samples, in generation order
    errors = out.with_name("gen.smi.errors.jsonl")
    logged = [json.loads(l)["source"] for l in errors.read_text().splitlines()] if errors.exists() else []
    assert sorted(logged + [i for i, _ in written]) == sorted(f"gen#{k}" for k in range(1, 17))
    if constrained:
        assert len(written) == 16  # the chemistry constraint (and resampling) leaves no invalid molecule
    again = generate(SHIPPED, tmp_path / "again.smi", options, progress=False)
    assert again.texts == result.texts  # one seed, one result
    other = generate(SHIPPED, tmp_path / "other.smi", GenerateOptions(n=16, batch_size=8, seed=1), progress=False)
    assert other.texts != result.texts


def test_unconditional_samples_keep_generation_order_so_unique_at_k_is_an_unbiased_draw(tmp_path):
    import random
    import statistics

    from logos.evaluate.molecules import ranked_by_likelihood, read_molecules

    out = tmp_path / "m.smi"
    generate(SHIPPED, out, GenerateOptions(task="molecule", n=200, batch_size=64, seed=3), progress=False)
    logps = [s["logprob"] for s in _samples(out)]
    assert logps != sorted(logps, reverse=True) and not ranked_by_likelihood(out)  # not ranked
    canon = [c for c in map(_canonical, filter(None, read_molecules(out))) if c]
    assert len(canon) == 200
    k, rng = 50, random.Random(0)
    draws = [len(set(rng.sample(canon, k))) / k for _ in range(400)]  # unique@k of random subsets of the file
    first = len(set(canon[:k])) / k
    assert abs(first - statistics.mean(draws)) <= 3 * statistics.pstdev(draws) + 1e-9


def test_retro_ranks_and_merges_canonical_answers(tmp_path):
    products = tmp_path / "products.smi"
    products.write_text("CC(=O)Oc1ccccc1C(=O)O aspirin\nnot_a_smiles bad\nc1ccc(-c2ccccc2)cc1 biphenyl\n")
    out = tmp_path / "retro.rsmi"
    result = generate(SHIPPED, out, GenerateOptions(task="retro", n=6, batch_size=6), inputs=products,
                      progress=False)
    samples = _samples(out)
    assert {s["id"] for s in samples} == {"aspirin", "biphenyl"}  # the bad input is logged, not sampled
    assert result.exit_code == 1
    for ident in ("aspirin", "biphenyl"):
        mine = [s for s in samples if s["id"] == ident]
        assert [s["rank"] for s in mine] == list(range(1, len(mine) + 1))
        assert sum(s.get("count", 1) for s in mine) == 6  # merged answers keep their counts
        answers = [s["answer"] for s in mine if s.get("answer")]
        assert len(answers) == len(set(answers))  # one line per canonical answer
        for s in mine:
            assert s["text"].startswith("<MoleculeS>") and "<ReverseReact>" in s["text"] and is_valid(s["text"])
    lines = out.read_text().splitlines()
    assert len(lines) == sum(s["written"] for s in samples)
    for line in lines:  # reactants>agents>product, every component RDKit-canonical
        rxn, ident = line.split("\t")
        reactants, _, product = rxn.split(">")
        assert product == _canonical("CC(=O)Oc1ccccc1C(=O)O" if ident.startswith("aspirin") else "c1ccc(-c2ccccc2)cc1")
        assert all(_canonical(r) == r for r in reactants.split("."))


@pytest.mark.parametrize("task,n,suffix,source", [
    ("molecule", 12, ".smi", None),
    ("retro", 3, ".rsmi", "products"),
    ("forward", 3, ".rsmi", "reactants"),
    ("protein", 4, ".fasta", None),
    ("antibody", 2, ".fasta", None),
    ("pocket", 2, ".fasta", "fasta"),
    ("ligand", 2, ".sdf", "marked"),
    ("mof", 3, ".json", None),
])
def test_every_task_ends_and_parses_from_a_random_model(random_model, tmp_path, task, n, suffix, source):
    inputs = None
    if source == "products":
        inputs = tmp_path / "in.smi"
        inputs.write_text("CC(=O)Oc1ccccc1C(=O)O\n")
    elif source == "reactants":
        inputs = tmp_path / "in.smi"
        inputs.write_text("CC(=O)O.OCC\n")
    elif source == "fasta":
        inputs = tmp_path / "in.fasta"
        inputs.write_text(">p1\nMKTAYIAKQR\n")
    elif source == "marked":
        inputs = tmp_path / "in.jsonl"
        inputs.write_text(json.dumps({"text": "<ProteinS>MK<PocketS>T<PocketE>AY<PocketS>I<PocketE>AK<ProteinE>",
                                      "id": "site"}) + "\n")
    out = tmp_path / f"out{suffix}"
    sampling = Sampling(max_new_tokens=48 if task in ("molecule", "ligand", "protein", "antibody") else 96)
    options = GenerateOptions(task=task, n=n, batch_size=4, sampling=sampling, resamples=12)  # kekulé failures
    result = generate(random_model, out, options, inputs=inputs, progress=False)
    assert len(result.samples) == n
    # A random model wanders into states the constraint cannot close (a documented limit of the
    # chemistry check, resampled up to 12 times); none may run past its budget unclosed, some end,
    # and every one that ends is a valid object. (The shipped model's rate is measured by
    # benchmarks/generate_bench.py.)
    assert all(s.status in ("done", "dead-end", "kekulize") for s in result.samples), [s.status for s in result.samples]
    done = [s for s in result.samples if s.status == "done"]
    assert done, [(s.status, s.text) for s in result.samples]
    for s in done:
        assert is_valid(s.text), s.text                # ends, and parses under the grammar
        for smi in re.findall(r"<MoleculeS>([^<]+)<MoleculeE>", s.text):
            assert _canonical(smi) is not None, smi    # no ring, valence or kekulization error
    if task == "pocket":
        for s in done:  # the output side spells the input exactly; only marks are free
            assert re.sub(r"<[^>]+>", "", s.text.split("<Search>")[1]) == "MKTAYIAKQR"
    if task in ("protein", "antibody"):
        for s in done:
            assert re.fullmatch(r"<(Protein|Antibody)S>[ACDEFGHIKLMNPQRSTVWY]+<(Protein|Antibody)E>", s.text)
    if task != "pocket":
        assert result.written == len(done) and out.exists()


def test_retro_samples_at_its_task_temperature_unless_one_is_asked(tmp_path, run_cli):
    """Retrosynthesis ranks answers, and samples at 0.7 unless asked (more of its samples are distinct likely
    answers): ``logos generate --task retro`` without ``--temperature`` writes what ``--temperature 0.7`` writes,
    and not what 1.0 writes."""
    products = tmp_path / "products.smi"
    products.write_text("CC(=O)Oc1ccccc1C(=O)O aspirin\nCc1ccc(-c2ccccc2)cc1 methylbiphenyl\n")
    runs = {}
    for name, flag in (("default", []), ("0.7", ["--temperature", "0.7"]), ("1.0", ["--temperature", "1.0"])):
        out = tmp_path / name / "r.rsmi"
        code, err = run_cli("generate", "--task", "retro", "--input", products, "-n", "6", "--seed", "3",
                            "-o", out, "-q", *flag)
        assert code == 0, err
        runs[name] = [(s["id"], s["text"], s["logprob"]) for s in _samples(out)]
    assert runs["default"] == runs["0.7"]
    assert runs["default"] != runs["1.0"]


def test_cli_generate_exit_status_and_summary(tmp_path, run_cli):
    code, err = run_cli("generate", "-n", "8", "-o", tmp_path / "g.smi", "-q", "--batch-size", "8")
    assert code == 0 and re.search(r"generate: 8 samples, 8 written .* valid 8 \(100.0%\)", err), err
    code, err = run_cli("generate", "--task", "retro", "-n", "2", "-o", tmp_path / "r.rsmi", "-q")
    assert code == 2 and "needs --input" in err


def test_a_checkpoint_of_an_unknown_grammar_is_refused(tmp_path, run_cli):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(SHIPPED, ckpt)
    (ckpt / "logos_run.json").write_text(json.dumps({"grammar": "v9"}))
    code, err = run_cli("generate", "--checkpoint", ckpt, "-n", "2", "-o", tmp_path / "g.smi", "-q")
    assert code == 2 and "trained on grammar v9" in err and len(err.strip().splitlines()) == 1


def test_summary_counts_novelty_against_a_reference_in_other_spellings(tmp_path):
    from logos.evaluate.molecules import molecule_summary
    result = generate(SHIPPED, tmp_path / "g.smi", GenerateOptions(n=8, batch_size=8), progress=False)
    written = [re.search(r"<MoleculeS>([^<]+)<MoleculeE>", s.text).group(1) for s in result.samples if s.written]
    unique = {_canonical(s) for s in written}
    known = sorted(unique)[:3]
    reference = tmp_path / "train.smi"  # the same molecules, spelled from another atom
    reference.write_text("".join(Chem.MolToSmiles(Chem.MolFromSmiles(s), rootedAtAtom=1) + "\n" for s in known))
    assert all(line.strip() not in known for line in reference.read_text().splitlines())
    line = molecule_summary(result, reference)
    assert f"unique {len(unique)} " in line and f"novel {len(unique) - 3} " in line, line


def test_molecules_are_whole_records_not_the_first_span_of_a_reaction(tmp_path):
    """The shipped model also writes molecules as the first span of reactions: its corpus holds thousands of
    retrosynthesis records of one Suzuki coupling that open with its product. A molecule sample is kept with the
    model's probability of the end of document after it (rejection sampling), so that product, which the model
    almost never ends a record with, is drawn again instead of making up a share of the molecules."""
    product = _canonical("Cc1ccc2c(cnn2C2CCCCO2)c1-c1ccc2ncccc2c1")
    out = tmp_path / "m.smi"
    result = generate(SHIPPED, out, GenerateOptions(task="molecule", n=48, batch_size=16, seed=0), progress=False)
    smiles = [_canonical(line.split()[0]) for line in out.read_text().splitlines()]
    assert len(smiles) == 48 and None not in smiles
    assert result.not_whole > 0 and result.stats.end_draws >= 48
    assert smiles.count(product) <= 1  # (the last draw is kept when the model refuses to end MAX_WHOLE_DRAWS times)
    assert len(set(smiles)) >= 46
    first = generate(SHIPPED, tmp_path / "f.smi", GenerateOptions(task="molecule", n=16, seed=0, whole_draws=0),
                     progress=False)  # the first finished molecule of each row, as the model wrote it
    assert first.not_whole == 0 and first.stats.end_draws == 0 and first.written == 16
