"""The built-in sampling loop (``sample_batch``): what its steps guarantee, on the shipped model and a random one.

A finished row is kept with the model's probability of the end of document after it; a refused end of span follows
the planned ending; a row whose work runs out waits a step and leaves no trace of it; a row that decides nothing
fails once it has had a token's work; a row at a dead end takes its last token back; rows share a step's work; a row
that waits decides the same draw first. (The policy each row follows is tested in ``test_policy.py``.)
"""

from __future__ import annotations

import pytest
from rdkit import Chem

from conftest import REPO
from train_fixtures import random_checkpoint
from logos.generate import Sampling

SHIPPED = REPO / "checkpoints" / "logos-tiny"


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    """A randomly initialised tiny Llama with the LOGOS tokenizer."""
    return random_checkpoint(tmp_path_factory.mktemp("random") / "ckpt")


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
