"""The row policy both engines call: its draws, its redraws, and the same tokens in both engines from the same logits.

- draws invert the cumulative distribution and never take a masked token; the uniform numbers drawn in blocks are the
  generator's own stream, so a row draws the same numbers alone (vLLM: one generator per request) or in a batch;
- redraws sample the model's distribution restricted to the tokens the row's constraint accepts;
- the vLLM processor's rows (:mod:`logos.generate.vllm_processor`, built here without vLLM) choose only accepted
  tokens and keep the built-in engine's ending rule;
- fed the same logits and seed, the built-in loop and the vLLM processor write the same tokens.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from rdkit import Chem

from conftest import REPO
from logos.decoding.constraints import GrammarRows, TokenTable, task_grammar
from logos.decoding.policy import PolicyCounts, RowPolicy, Sampling, Uniforms, distributions
from logos.decoding.rows import RowConstraint, SmilesRow, SmilesVocab
from logos.decoding.sampler import StepStats, sample_batch
from logos.generate.vllm_processor import LogosLogitsProcessorV1, ProcessorCounts, RequestRow, request_args
from logos.tasks import TASKS
from logos.tasks.prompts import Prompt

SHIPPED = REPO / "checkpoints" / "logos-tiny"
VOCAB = 2432


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(SHIPPED))


@pytest.fixture(scope="module")
def vocab(tok):
    return SmilesVocab(TokenTable(tok, VOCAB))


def test_draws_follow_the_distribution_and_never_take_a_masked_token():
    inf = float("-inf")
    logits = torch.tensor([[0.0, inf, 1.0, 2.0, inf], [inf, inf, 0.5, inf, inf]])
    first, second = distributions(logits)
    uniforms = Uniforms(torch.Generator().manual_seed(0))
    n = 10000
    counts = torch.bincount(torch.tensor([first.draw(uniforms) for _ in range(n)]), minlength=5).float() / n
    assert torch.allclose(counts, torch.softmax(logits[0], -1), atol=0.015), counts
    assert counts[1] == 0 and counts[4] == 0
    assert {second.draw(uniforms) for _ in range(100)} == {2}
    assert distributions(torch.full((1, 5), inf))[0].draw(uniforms) is None  # nothing to draw


def test_a_row_draws_the_same_numbers_alone_or_in_a_batch():
    """The blocks of uniform numbers are the generator's own stream, and a row's distribution is the same numbers
    whether it comes alone or among others: a row that shares its batch's generator draws what a vLLM request with
    its own generator of the same seed draws."""
    one, many = Uniforms(torch.Generator().manual_seed(3)), torch.Generator().manual_seed(3)
    assert [one() for _ in range(200)] == [float(torch.rand((), dtype=torch.float64, generator=many))
                                         for _ in range(200)]
    logits = torch.randn(16, VOCAB, generator=torch.Generator().manual_seed(1))
    batch = distributions(logits, top_k=50, top_p=0.9)
    for i in (0, 7, 15):
        alone = distributions(logits[i: i + 1], top_k=50, top_p=0.9)[0]
        assert (alone.cum == batch[i].cum).all() and (alone.probs == batch[i].probs).all()


class _Refuses(RowConstraint):
    def __init__(self, refused):
        self.refused = set(refused)

    def check(self, token, remaining=1 << 30):
        return token not in self.refused


def test_redraws_sample_the_restricted_distribution():
    dist = distributions(torch.log(torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10]])))[0]
    uniforms, counts = Uniforms(torch.Generator().manual_seed(0)), PolicyCounts()
    written = torch.zeros(5)
    n = 4000
    for _ in range(n):
        policy = RowPolicy(_Refuses({0, 2}), 4, Sampling(max_new_tokens=100), uniforms, counts)
        written[policy.decide(dist)] += 1
    assert written[0] == written[2] == 0
    expected = torch.tensor([0.25, 0.15, 0.10]) / 0.5
    assert torch.allclose(written[[1, 3, 4]] / n, expected, atol=0.03), written
    # refused draws per row: the first draw (0.5), then a redraw without it of the other refused token
    assert abs(counts.redraws / n - (0.5 + 0.30 * 0.20 / 0.70 + 0.20 * 0.30 / 0.80)) < 0.03, counts


class _Params:
    temperature, top_k, top_p, seed = 1.0, 0, 1.0, 0


def test_vllm_rows_draw_only_accepted_tokens(vocab):
    """The vLLM processor's rows choose tokens their constraint accepts, from a model that proposes any SMILES
    piece (the policy drops the tokens the row surely refuses after a refusal, as in the built-in engine)."""
    row = SmilesRow(vocab, "<MoleculeS>")
    counts = PolicyCounts()
    request = RequestRow(row, vocab.close_id, 48, 8, _Params(), counts=counts)
    logits = torch.full((VOCAB,), float("-inf"))
    logits[[i for i, ok in enumerate(vocab.smiles) if ok] + [vocab.close_id]] = 0.0
    for _ in range(48):
        before = row.fork()
        request.restrict(logits.clone())
        if request.dead:
            break
        token = request.chosen
        assert before.check(token, request.remaining), (before.smiles, vocab.text[token])
        request.feed(token)
        if token == vocab.close_id:
            break
    assert counts.redraws > 0 and counts.row_steps > 0 and counts.checks > counts.row_steps


def test_vllm_rows_end_a_span_the_model_wants_to_end(tok, vocab):
    """The built-in engine's ending rule holds in the vLLM processor: when the model's draw is the closing tag where
    the span cannot end (a ring and a branch open), the row follows its planned ending to a valid molecule."""
    body = "C1CC(C"
    row = SmilesRow(vocab, "<MoleculeS>" + body)
    plan = row.ending(40)
    counts = PolicyCounts()
    request = RequestRow(row, vocab.close_id, 40, 8, _Params(), counts=counts)
    logits = torch.full((VOCAB,), float("-inf"))
    logits[[i for i, ok in enumerate(vocab.smiles) if ok]] = 0.0
    logits[vocab.close_id] = 30.0  # the model wants to end
    written = []
    for _ in range(len(plan)):
        request.restrict(logits.clone())
        written.append(request.chosen)
        request.feed(request.chosen)
    assert written == list(plan) and counts.closed_by_plan == 1 and not request.dead
    assert Chem.MolFromSmiles(body + tok.decode(written[:-1])) is not None


def test_processor_counts_travel_as_their_dataclass(tmp_path):
    counts = ProcessorCounts(PolicyCounts(row_steps=7, checks=11, redraws=2, closed_by_plan=1, dead_ends=1), 3, 0.25)
    path = tmp_path / "counts.json"
    counts.write(path)
    assert ProcessorCounts.read(path) == counts
    assert ProcessorCounts.read(tmp_path / "none.json") == ProcessorCounts()  # no engine has written yet
    assert ProcessorCounts.read(path).minus(ProcessorCounts(PolicyCounts(row_steps=2), 1, 0.25)) == \
        ProcessorCounts(PolicyCounts(row_steps=5, checks=11, redraws=2, closed_by_plan=1, dead_ends=1), 2, 0.0)


# ---------------------------------------------------------------- the two engines, the same logits
@pytest.fixture(scope="module")
def bigram():
    """Logits that depend only on the last token: the shipped model's, after each token alone ([V, V]). The built-in
    loop (through its KV-cache protocol) and the simulated vLLM engine below read the same numbers."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(SHIPPED)).eval()
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.arange(a, min(a + 256, VOCAB))[:, None]).logits[:, 0, :VOCAB]
                          for a in range(0, VOCAB, 256)]).float()


class _Scripted(torch.nn.Module):
    """A model whose next-token logits are ``table[last token]`` (called as the built-in loop calls a model)."""

    def __init__(self, table):
        super().__init__()
        self.table = table
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=True, past_key_values=None):
        return SimpleNamespace(logits=self.table[input_ids[:, -1]][:, None, :], past_key_values=None)


def _vllm(table, tok, task, prompts, sampling, seeds, budget):
    """The vLLM engine as the processor sees it, without vLLM: a batch of requests (each with its own seed), the
    model's logits masked by the task's bans and the grammar (vLLM's structured outputs), the LOGOS processor, and
    vLLM's sampler taking the one token the processor left (a dead row: the likeliest the grammar allows)."""
    data = TokenTable(tok, VOCAB)
    stop = data.id[task.stop]
    banned = data.banned(set(task.symbols), keep={stop})
    config = SimpleNamespace(model_config=SimpleNamespace(tokenizer=str(SHIPPED), get_vocab_size=lambda: VOCAB))
    processor = LogosLogitsProcessorV1(config, "cpu", False)
    ids = [tok(p.text, add_special_tokens=False)["input_ids"] for p in prompts]
    grammar = GrammarRows(tok, VOCAB, [task_grammar(task.start, task.rules + "\n" + p.rules) for p in prompts], ids,
                          stop, torch.device("cpu"))
    outputs = [[] for _ in prompts]
    params = [SimpleNamespace(extra_args={"logos": request_args(task, p, sampling.closing_slack)},
                              stop_token_ids=[stop], max_tokens=budget, temperature=sampling.temperature,
                              top_k=sampling.top_k, top_p=sampling.top_p, seed=seed) for p, seed in zip(prompts, seeds)]
    processor.update_state(SimpleNamespace(removed=[], moved=[], added=[
        (i, params[i], ids[i], outputs[i]) for i in range(len(prompts))]))
    live = set(range(len(prompts)))
    dead: dict[int, int] = {}  # rows the processor found at a dead end: how many tokens they had written then
    while live:
        logits = table[torch.tensor([(out or ids[i])[-1] for i, out in enumerate(outputs)])].clone()
        logits = logits.masked_fill(banned, float("-inf")).masked_fill(~grammar.mask([i in live for i in
                                                                                     range(len(prompts))]),
                                                                       float("-inf"))
        processor.apply(logits)
        for i in sorted(live):
            token = int(logits[i].argmax())
            if processor.rows[i].dead and i not in dead:
                dead[i] = len(outputs[i])
            outputs[i].append(token)
            grammar.advance(i, token)
            if token == stop or len(outputs[i]) == budget:
                live.discard(i)
                processor.update_state(SimpleNamespace(removed=[i], moved=[], added=[]))
    return outputs, dead, processor.counts


@pytest.mark.parametrize("sampling", [Sampling(temperature=1.0, row_work=0),
                                      Sampling(temperature=0.7, top_k=40, top_p=0.95, row_work=0)])
def test_both_engines_write_the_same_tokens_from_the_same_logits_and_seed(tok, bigram, sampling):
    """The built-in loop and the vLLM processor call one policy: fed the same logits (a model whose logits depend on
    its last token; the task's bans and grammar) and the same seed, each row writes the same tokens in both.

    Where the engines differ, by design: vLLM writes a token for every request in every step, so its rows never wait
    a step - the built-in loop runs here with ``row_work=0``, its rows then doing the work of a row that does not wait,
    as vLLM's do - and never take a token back: a row that reaches a dead end takes its last token back in the
    built-in loop and is left to the grammar (and resampled by the front end) in vLLM. Rows that took a token back
    are compared up to the tokens they took back; the others token for token, to the end."""
    task, budget = TASKS["molecule"], 40
    prompts = [Prompt("m", text) for text in ("<MoleculeS>", "<MoleculeS>CC(", "<MoleculeS>c1ccc(", "<MoleculeS>N")]
    seeds = [11, 12, 13, 14, 15, 16, 17, 18]
    cases = [(prompts[k % len(prompts)], seed) for k, seed in enumerate(seeds)]
    data = TokenTable(tok, VOCAB)
    stop = data.id[task.stop]
    banned = data.banned(set(task.symbols), keep={stop})
    run = Sampling(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, max_new_tokens=budget,
                   row_work=0)
    builtin, undone = [], []
    for prompt, seed in cases:  # one row per run: its generator is its own, as a vLLM request's
        ids = tok(prompt.text, add_special_tokens=False)["input_ids"]
        grammar = GrammarRows(tok, VOCAB, [task_grammar(task.start, task.rules)], [ids], stop, torch.device("cpu"))
        stats = StepStats()
        result, = sample_batch(_Scripted(bigram), [[tok.bos_token_id] + ids], tok.pad_token_id, stop, banned, run,
                               torch.Generator().manual_seed(seed), grammar, task.rows(data, [prompt.text]), stats)
        builtin.append(result.tokens)
        undone.append(stats.undos)
    outputs, dead, counts = _vllm(bigram, tok, task, [p for p, _ in cases], run, seeds, budget)
    compared = 0
    for k, (mine, theirs) in enumerate(zip(builtin, outputs)):
        if undone[k]:  # the built-in row took tokens back where the vLLM row reached a dead end: before it, both
            # wrote the same; each token taken back shortened the built-in row by one
            assert k in dead, (k, tok.decode(mine), tok.decode(theirs))
            kept = dead[k] - undone[k]
            assert mine[:kept] == theirs[:kept], (k, tok.decode(mine), tok.decode(theirs))
            continue
        assert k not in dead and mine == theirs, (k, tok.decode(mine), tok.decode(theirs))
        compared += 1
    assert compared >= 6 and counts.policy.redraws > 0 and counts.requests == len(cases)
    assert sum(t[-1] == stop for t in builtin) >= 4  # rows that ended: the comparison reached their ends
