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


def test_end_of_document_draw_keeps_rows_with_its_probability(random_model):
    """sample_batch with ``then_id``: a finished row whose next token cannot be the end of document is rejected
    (status NOT_WHOLE), one whose next token must be it is kept."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from logos.decoding.sampler import NOT_WHOLE, sample_batch

    tok = AutoTokenizer.from_pretrained(str(random_model))
    model = AutoModelForCausalLM.from_pretrained(str(random_model)).eval()
    stop, eos = tok.convert_tokens_to_ids("<MoleculeE>"), tok.eos_token_id

    class EndsAfterStop(torch.nn.Module):  # the real model, with the end of document's logit set after <MoleculeE>
        def __init__(self, end_logit: float):
            super().__init__()
            self.inner, self.end_logit = model, end_logit

        def forward(self, input_ids, **kw):
            out = self.inner(input_ids=input_ids, **kw)
            after_stop = input_ids[:, -1] == stop
            out.logits[after_stop, -1, eos] = self.end_logit
            out.logits[~after_stop, -1, stop] = 50.0  # close at once
            return out

    banned = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    prompts = [[tok.bos_token_id, tok.convert_tokens_to_ids("<MoleculeS>"), tok.convert_tokens_to_ids("C")]] * 4
    for end_logit, status in ((float("-inf"), NOT_WHOLE), (1e4, "done")):
        results = sample_batch(EndsAfterStop(end_logit), prompts, tok.pad_token_id, stop, banned,
                               Sampling(max_new_tokens=8), torch.Generator().manual_seed(0), then_id=eos)
        assert [r.status for r in results] == [status] * 4


def test_a_refused_end_of_span_follows_the_planned_ending(random_model):
    """A model that wants to end its molecule where the span cannot end (a ring and a branch open) ends it by the
    row's planned ending, not by writing on from the unlikely rest of its distribution until the budget."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from logos.decoding.constraints import TokenTable
    from logos.decoding.rows import SmilesRow, SmilesVocab
    from logos.decoding.sampler import StepStats, sample_batch

    tok = AutoTokenizer.from_pretrained(str(random_model))
    model = AutoModelForCausalLM.from_pretrained(str(random_model)).eval()
    stop = tok.convert_tokens_to_ids("<MoleculeE>")

    class WantsToEnd(torch.nn.Module):  # the real model, with the closing tag always the likeliest token
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, input_ids, **kw):
            out = self.inner(input_ids=input_ids, **kw)
            out.logits[:, -1, stop] = 20.0
            return out

    vocab = SmilesVocab(TokenTable(tok, model.config.vocab_size))
    body = "C1CC(C"
    prompt = [tok.bos_token_id, tok.convert_tokens_to_ids("<MoleculeS>")] + tok(body, add_special_tokens=False)[
        "input_ids"]
    rows = [SmilesRow(vocab, "<MoleculeS>" + body) for _ in range(4)]
    plan = rows[0].ending(64)
    banned = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    stats = StepStats()
    results = sample_batch(WantsToEnd(), [prompt] * 4, tok.pad_token_id, stop, banned, Sampling(max_new_tokens=64),
                           torch.Generator().manual_seed(0), rows=rows, stats=stats)
    assert [r.status for r in results] == ["done"] * 4 and stats.closed_by_plan == 4
    for r in results:
        assert r.tokens == list(plan), tok.decode(r.tokens)
        assert Chem.MolFromSmiles(body + tok.decode(r.tokens[:-1])) is not None


def test_a_yielded_step_leaves_the_row_as_if_it_had_not_happened():
    """A row whose constraint spends its step's work before a token is decided writes nothing in that step (a masked
    padding, its position not taken) and draws again from the same distribution in the next: with greedy draws,
    every row writes the tokens, with the same log-probabilities, that it writes when no row yields."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from logos.decoding.rows import RowConstraint
    from logos.decoding.sampler import StepStats, sample_batch

    class Yields(RowConstraint):  # allows every token, but its work is spent at the given token counts, once each
        def __init__(self, at):
            self.at, self.written, self.refused = set(at), 0, False

        def check(self, token, remaining):
            self.refused = self.written in self.at
            return not self.refused

        def spent(self):
            return self.refused

        def renew(self, work=None):
            if self.refused:
                self.at.discard(self.written)
            self.refused = False

        def advance(self, token):
            self.written += 1

    tok = AutoTokenizer.from_pretrained(str(SHIPPED))
    model = AutoModelForCausalLM.from_pretrained(str(SHIPPED)).eval()
    start, stop = tok.convert_tokens_to_ids("<MoleculeS>"), tok.convert_tokens_to_ids("<MoleculeE>")
    prompts = [[tok.bos_token_id, start], [tok.bos_token_id, start] + tok("CC", add_special_tokens=False)["input_ids"],
               [tok.bos_token_id, start] + tok("c1ccccc1", add_special_tokens=False)["input_ids"]]
    banned = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    sampling = Sampling(temperature=1e-6, max_new_tokens=20, row_work=32)
    plain = sample_batch(model, prompts, tok.pad_token_id, stop, banned, sampling, torch.Generator().manual_seed(0))
    stats = StepStats()
    rows = [Yields({0, 3, 4}), None, Yields({1, 2})]
    yielded = sample_batch(model, prompts, tok.pad_token_id, stop, banned, sampling, torch.Generator().manual_seed(0),
                           rows=rows, stats=stats)
    assert stats.yields == 5 and all(not row.at for row in rows if row is not None)
    for a, b in zip(plain, yielded):
        assert a.tokens == b.tokens and a.status == b.status, (tok.decode(a.tokens), tok.decode(b.tokens))
        assert abs(a.logprob - b.logprob) < 1e-3


def test_a_row_that_decides_nothing_fails_once_it_has_had_the_work_of_a_token():
    """A row whose constraint spends every step's work without deciding a token yields until it has had the work a
    row that does not yield gets for one token, then fails (the caller resamples it): it does not hold its batch for
    the whole step allowance. The other rows write what they write alone."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from logos.decoding.rows import WORK_NO_YIELD, RowConstraint
    from logos.decoding.sampler import StepStats, sample_batch

    class Stuck(RowConstraint):  # refuses everything once the row has written two tokens, its work always spent
        def __init__(self):
            self.written = 0

        def check(self, token, remaining):
            return self.written < 2

        def spent(self):
            return self.written >= 2

        def advance(self, token):
            self.written += 1

    tok = AutoTokenizer.from_pretrained(str(SHIPPED))
    model = AutoModelForCausalLM.from_pretrained(str(SHIPPED)).eval()
    start, stop = tok.convert_tokens_to_ids("<MoleculeS>"), tok.convert_tokens_to_ids("<MoleculeE>")
    prompts = [[tok.bos_token_id, start], [tok.bos_token_id, start] + tok("CC", add_special_tokens=False)["input_ids"]]
    banned = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    sampling = Sampling(temperature=1e-6, max_new_tokens=40, row_work=32)
    alone = sample_batch(model, prompts[1:], tok.pad_token_id, stop, banned, sampling, torch.Generator().manual_seed(0))
    stats = StepStats()
    out = sample_batch(model, prompts, tok.pad_token_id, stop, banned, sampling, torch.Generator().manual_seed(0),
                       rows=[Stuck(), None], stats=stats)
    assert out[0].status == "dead-end" and len(out[0].tokens) == 2
    assert stats.yields == WORK_NO_YIELD // sampling.row_work - 1  # the step that uses the last units fails it
    assert stats.idle_steps > 0  # alone, its yielded steps needed no forward pass
    assert out[1].tokens == alone[0].tokens and out[1].status == alone[0].status


def _greedy_setup():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(SHIPPED))
    model = AutoModelForCausalLM.from_pretrained(str(SHIPPED)).eval()
    start, stop = tok.convert_tokens_to_ids("<MoleculeS>"), tok.convert_tokens_to_ids("<MoleculeE>")
    banned = torch.zeros(model.config.vocab_size, dtype=torch.bool)
    return tok, model, start, stop, banned


def test_a_row_at_a_dead_end_takes_back_its_last_token_and_draws_again_there():
    """A row whose constraint refuses everything after its third token (a dead end its checks let through) takes
    that token back and draws again there without it: with greedy draws it writes the second likeliest third token
    and goes on as the model would after it - the model's cache no longer sees the token taken back, and the score
    is the model's log-probability of what the row wrote. The other row writes what it writes alone."""
    import torch

    from logos.decoding.rows import RowConstraint
    from logos.decoding.sampler import StepStats, sample_batch

    class Trap(RowConstraint):  # once it has written three tokens (the first time only) it refuses every token
        def __init__(self):
            self.written, self.sprung, self.trapped = 0, False, False

        def check(self, token, remaining):
            return not self.trapped

        def advance(self, token):
            self.written += 1
            if self.written == 3 and not self.sprung:
                self.sprung = self.trapped = True

        def undo(self):
            self.written -= 1
            self.trapped = False
            return True

    tok, model, start, stop, banned = _greedy_setup()
    prompts = [[tok.bos_token_id, start], [tok.bos_token_id, start] + tok("CC", add_special_tokens=False)["input_ids"]]
    sampling = Sampling(temperature=1e-6, max_new_tokens=24)
    plain = sample_batch(model, prompts, tok.pad_token_id, stop, banned, sampling, torch.Generator().manual_seed(0))
    stats = StepStats()
    out = sample_batch(model, prompts, tok.pad_token_id, stop, banned, sampling, torch.Generator().manual_seed(0),
                       rows=[Trap(), None], stats=stats)
    assert stats.undos == 1 and out[0].status == "done"
    assert out[0].tokens[:2] == plain[0].tokens[:2] and out[0].tokens[2] != plain[0].tokens[2]
    with torch.no_grad():
        logits = model(torch.tensor([prompts[0] + out[0].tokens[:2]])).logits[0, -1]
        second = torch.topk(logits, 2).indices.tolist()
        assert second[0] == plain[0].tokens[2] and out[0].tokens[2] == second[1]
        after = sample_batch(model, [prompts[0] + out[0].tokens[:3]], tok.pad_token_id, stop, banned, sampling,
                             torch.Generator().manual_seed(0))[0]
        assert out[0].tokens[3:] == after.tokens  # the model's cache holds no trace of the token taken back
        whole = torch.log_softmax(model(torch.tensor([prompts[0] + out[0].tokens])).logits[0].float(), -1)
        n = len(prompts[0])
        expected = sum(float(whole[n - 1 + k, t]) for k, t in enumerate(out[0].tokens))
    assert abs(out[0].logprob - expected) < 1e-3
    assert out[1].tokens == plain[1].tokens and abs(out[1].logprob - plain[1].logprob) < 1e-3


def test_a_row_short_of_work_takes_what_the_other_rows_of_its_step_left():
    """A row whose checks need more than a row's share of a step's work gets what the other rows left, in the same
    step: beside rows that need none it yields no step and writes what it writes without a constraint; alone it
    yields (and fails once it has had a token's work)."""
    import torch

    from logos.decoding.rows import RowConstraint
    from logos.decoding.sampler import StepStats, sample_batch

    class Hungry(RowConstraint):  # every check takes 60 units at once, counted
        def __init__(self):
            self.left = 0

        def check(self, token, remaining):
            if self.left < 60:
                self.left = 0
                return False
            self.left -= 60
            return True

        def spent(self):
            return self.left <= 0

        def work_left(self):
            return self.left

        def renew(self, work=None):
            self.left = self.step_work if work is None else work

        def advance(self, token):
            self.left = self.step_work

    tok, model, start, stop, banned = _greedy_setup()
    prompts = [[tok.bos_token_id, start]] * 3
    sampling = Sampling(temperature=1e-6, max_new_tokens=64, row_work=32)  # (the molecule ends well within it)
    plain = sample_batch(model, prompts, tok.pad_token_id, stop, banned, sampling, torch.Generator().manual_seed(0))
    stats = StepStats()
    out = sample_batch(model, prompts, tok.pad_token_id, stop, banned, sampling, torch.Generator().manual_seed(0),
                       rows=[Hungry(), None, None], stats=stats)
    assert plain[0].status == "done" and len(plain[0].tokens) < 64 - sampling.closing_slack
    assert stats.yields == 0 and out[0].tokens == plain[0].tokens and out[0].status == plain[0].status
    alone = StepStats()
    out = sample_batch(model, prompts[:1], tok.pad_token_id, stop, banned, sampling, torch.Generator().manual_seed(0),
                       rows=[Hungry()], stats=alone)
    assert out[0].status == "dead-end" and not out[0].tokens and alone.yields > 0 and alone.idle_steps > 0


def test_a_row_that_yields_decides_the_same_draw_before_drawing_again():
    """Rejection sampling stays exact when a check takes more than a step's work: a row that yields checks the same
    draw again in the next step (its search going on) instead of drawing afresh, which would favour the tokens that
    are cheap to check. Two equally likely tokens, one decided at once, the other after three steps' work: each is
    written by about half the rows."""
    import torch

    from logos.decoding.rows import RowConstraint
    from logos.decoding.sampler import StepStats, sample_batch

    class Fixed(torch.nn.Module):  # the same distribution at every position: tokens 0 and 1 equally likely
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=True, past_key_values=None):
            logits = torch.full((input_ids.shape[0], input_ids.shape[1], 4), -30.0)
            logits[..., :2] = 0.0
            return type("Out", (), {"logits": logits, "past_key_values": None})()

    class Slow(RowConstraint):  # token 0 is accepted once checked in three steps, token 1 at once
        def __init__(self):
            self.tries, self.out = 0, False

        def check(self, token, remaining):
            if token == 1:
                return True
            self.tries += 1
            self.out = self.tries < 3
            return not self.out

        def spent(self):
            return self.out

        def renew(self, work=None):
            self.out = False

    n = 400
    banned = torch.tensor([False, False, True, True])
    stats = StepStats()
    out = sample_batch(Fixed(), [[3]] * n, 3, 2, banned, Sampling(max_new_tokens=1, row_work=8),
                       torch.Generator().manual_seed(0), rows=[Slow() for _ in range(n)], stats=stats)
    written = [r.tokens for r in out]
    assert all(len(w) == 1 for w in written) and stats.yields > 0
    zeros = sum(w[0] == 0 for w in written)
    assert abs(zeros / n - 0.5) < 0.08, zeros  # (drawn afresh after each yield: about 1 in 8)
