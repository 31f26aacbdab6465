"""The built-in sampling loop: batched, with the model's KV cache, masks on the logits' device and one policy per row.

One step for a batch of B rows reads forward -> mask -> decide -> commit:

1. **forward**: a forward pass over the newest token (the prompt on the first step; left padding, explicit position
   ids). A step after one in which no row wrote a token has none (every distribution stands): a lone row at the tail
   of its batch pays only for its own work;
2. **mask**: the logits are scaled by the temperature and masked: the task's static bans (padding rows, byte pieces,
   symbols the task never writes), the grammar (:class:`~logos.decoding.constraints.GrammarRows`) and, for a row
   drawing again where it took tokens back, those tokens;
3. **decide**: each row's policy (:class:`~logos.decoding.policy.RowPolicy`, the one the vLLM engine calls too:
   planned endings, draws, checks, redraws, the scan) turns its distribution into a token, a wait or its end. The
   policies propose their candidates first and the constraints check them one after another (the constraint code
   stays in the core's caches: tensor operations between two checks push it out). The checks' work is bounded per
   step (by default ``Sampling.row_work``, 32 units of :func:`~logos.decoding.ending.cost`, a few hundred
   microseconds, a row): a step's rows share it - every row gets its own first, and rows still undecided then take,
   in turns, what the others left. A row that finds none left before its token is decided *waits*: it writes a
   padding token that the attention mask hides and that takes no position, keeps its distribution (the logits of its
   last real step) and in the next step checks the same draw again;
4. **commit**: the tokens written advance the grammar matchers and the policies (their row constraints); a row that
   took its last token back at a dead end has it hidden from the model's cache (the attention mask; its next token
   takes the position freed) and rolled back in its grammar matcher; a row ends at its stop token.

Once the batch has ended, each finished row's constraint checks what no step did
(:meth:`~logos.decoding.rows.RowConstraint.settle`: RDKit's parse of the molecules it wrote); a row that
fails gets the reason as its status (the caller resamples it). Those checks count in the constraint time,
not in any step's.

Each row's score is the sum of the model's own log-probabilities (temperature 1, before any mask)
of the tokens it wrote, the likelihood conditional tasks are ranked by. A row that runs out of
budget, or whose finished span its constraint refuses, is reported as failed (the caller may
resample it). :class:`StepStats` records the time in the grammar masks and in the rows' policies,
per step and per row-step. The grammar masks of a step are computed in a worker thread during the
model's forward pass (they depend only on the tokens written before it); their time is what the
step waits for them after the forward pass.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from logos.decoding.constraints import GrammarRows, worker
from logos.decoding.policy import (BACK, MIN_SHARE, WAIT, Distribution, PolicyCounts, RowPolicy, RowResult, Sampling,
                                   Uniforms, distributions)
from logos.decoding.rows import RowConstraint

__all__ = ["Sampling", "RowResult", "StepStats", "sample_batch", "NOT_WHOLE"]

NOT_WHOLE = "not-whole"  # a finished row the model would not end the document after (drawn again)


@dataclass
class StepStats:
    """Where sampling time goes: steps, row-steps (rows that wrote, summed over steps), seconds in the grammar masks
    and in the rows' policies (their constraints' checks, their draws), the worst step's policy seconds per active
    row, and what the policies did (:class:`~logos.decoding.policy.PolicyCounts`)."""

    steps: int = 0
    mask_seconds: float = 0.0
    check_seconds: float = 0.0
    row_steps: int = 0
    worst_step_row_seconds: float = 0.0
    settle_seconds: float = 0.0  # the row constraints' checks once rows have ended (in check_seconds, in no step)
    end_draws: int = 0  # end-of-document draws of finished rows (``then_id``)
    idle_steps: int = 0  # steps after one in which no row wrote a token: no forward pass (in ``steps``)
    policy: PolicyCounts = field(default_factory=PolicyCounts)

    @property
    def yields(self) -> int:
        """Steps in which a row wrote nothing (its work was spent, or it took a token back) and drew again next."""
        return self.policy.yields

    @property
    def undos(self) -> int:
        """Tokens taken back by rows at a dead end."""
        return self.policy.undos

    @property
    def closed_by_plan(self) -> int:
        """Spans sent to their planned ending (a refused draw of their end, or WANDERING)."""
        return self.policy.closed_by_plan

    def add(self, other: "StepStats") -> None:
        self.steps += other.steps
        self.mask_seconds += other.mask_seconds
        self.check_seconds += other.check_seconds
        self.settle_seconds += other.settle_seconds
        self.row_steps += other.row_steps
        self.end_draws += other.end_draws
        self.idle_steps += other.idle_steps
        self.policy.add(other.policy)
        self.worst_step_row_seconds = max(self.worst_step_row_seconds, other.worst_step_row_seconds)


def sample_batch(model, prompts: list[list[int]], pad_id: int, stop_id: int, banned: torch.Tensor,
                 sampling: Sampling, generator: torch.Generator, grammar: GrammarRows | None = None,
                 rows: list[RowConstraint | None] | None = None, stats: StepStats | None = None,
                 then_id: int | None = None) -> list[RowResult]:
    """Sample one completion per prompt (token ids, without the prompt). With ``then_id`` (the end of document), a
    finished row is kept with the model's probability of ``then_id`` after it and otherwise gets the status
    :data:`NOT_WHOLE` (the caller draws it again): rejection sampling of completions that end the document."""
    stats = stats if stats is not None else StepStats()
    rows = rows if rows is not None else [None] * len(prompts)
    uniforms = Uniforms(generator)  # (shared by the rows, in row order)
    policies = [RowPolicy(row, stop_id, sampling, uniforms, stats.policy, waits=True) for row in rows]
    with frozen_heap(), torch.no_grad():
        _sample_batch(_Batch(model, prompts, pad_id, banned, grammar, rows), policies, sampling, generator, stats,
                      then_id)
    return [p.result for p in policies]


def _sample_batch(batch: "_Batch", policies: list[RowPolicy], sampling: Sampling, generator: torch.Generator,
                  stats: StepStats, then_id: int | None) -> None:
    stop_id, ending = policies[0].stop_id, []  # (ending: rows just closed, waiting for the end-of-document draw)
    last = sampling.max_new_tokens + policies[0].max_waits
    for step in range(last + 1):
        running = [p.running() for p in policies]
        if not any(running) and not ending:
            break
        raw = batch.forward(running)                                                  # [B, V]: the model's logits
        if ending:
            _end_draws(raw, ending, policies, then_id, sampling.divisor, generator, stats)
            ending = []
        if not any(running) or step == last:
            break
        stats.steps += 1
        logits = batch.mask(raw, running, sampling.divisor, policies, stats)          # [B, V]
        dists = distributions(logits, sampling.top_k, sampling.top_p)
        t = time.perf_counter()
        decided = [p.conclude(d) if d is not None else None
                   for p, d in zip(policies, _decide(policies, dists, running, sampling.row_work))]
        spent = time.perf_counter() - t
        logp = torch.log_softmax(raw, dim=-1).cpu().numpy()  # the model's own (temperature 1, no mask): the score
        for i, (p, token) in enumerate(zip(policies, decided)):
            if token == BACK:
                batch.take_back(i, p.taken)
            elif token is not None and token >= 0:
                t = time.perf_counter()
                p.commit(token, float(logp[i, token]), batch.note(i) if p.keeps_trail else None)
                spent += time.perf_counter() - t
                batch.advance(i, token)
                if token == stop_id and then_id is not None:
                    ending.append(i)
        active, waited = sum(running), sum(token in (WAIT, BACK) for token in decided)
        stats.check_seconds += spent
        stats.row_steps += active - waited  # (a step waited is no row-step: the mean is per token written)
        stats.worst_step_row_seconds = max(stats.worst_step_row_seconds, spent / active)
        if not any(p.running() for p in policies) and not ending:
            break
        if not batch.next(decided, stop_id):
            stats.idle_steps += 1  # no row wrote a token: the next step needs no forward pass
    _settle(policies, stats)


def _decide(policies: list[RowPolicy], dists: list[Distribution], running: list[bool], row_work: int) -> list:
    """Each running row's decision (None for the others): candidates proposed, checked one after another, decided;
    then rows whose work ran out take, in turns, what the step's other rows left (while each gets ``MIN_SHARE``)."""
    active = [i for i, run in enumerate(running) if run]
    proposed = [(i, policies[i].propose(dists[i])) for i in active]
    verdicts = {i: policies[i].check(token) for i, token in proposed if token is not None and policies[i].constrained}
    decisions: list = [None] * len(policies)
    for i in active:
        decisions[i] = policies[i].decide(dists[i], verdicts.get(i))
    if not row_work:
        return decisions
    pool = row_work * len(active) - sum(policies[i].used for i in active)
    waiting = [i for i in active if decisions[i] == WAIT and policies[i].constraint.work_left() is not None]
    while waiting and pool >= MIN_SHARE * len(waiting):
        share = pool // len(waiting)
        for i in list(waiting):
            before = policies[i].used
            decision = policies[i].more(dists[i], share)
            if decision is None:  # (its draw waits for a check that runs alone in its next step)
                waiting.remove(i)
                continue
            decisions[i] = decision
            pool -= policies[i].used - before
        waiting = [i for i in waiting if decisions[i] == WAIT]
    return decisions


def _end_draws(raw: torch.Tensor, ending: list[int], policies: list[RowPolicy], then_id: int, divisor: float,
               generator: torch.Generator, stats: StepStats) -> None:
    """Rows that have just closed are kept with the model's probability of the end of document after them, else get
    the status :data:`NOT_WHOLE`."""
    ends = torch.softmax(raw[ending] / divisor, dim=-1)[:, then_id]
    draws = torch.rand(len(ending), generator=generator)
    for i, p_end, u in zip(ending, ends.tolist(), draws.tolist()):
        if u >= p_end:
            policies[i].result.status = NOT_WHOLE
    stats.end_draws += len(ending)


def _settle(policies: list[RowPolicy], stats: StepStats) -> None:
    """Rows still running have run out of budget; finished rows' constraints check what no step did (RDKit's parse of
    the spans): no step waits for it."""
    t = time.perf_counter()
    for p in policies:
        if p.result.status == "running":
            p.result.status = "budget"
        elif p.result.status in ("done", NOT_WHOLE):
            p.settle()
    spent = time.perf_counter() - t
    stats.settle_seconds += spent
    stats.check_seconds += spent


class _Batch:
    """The model's side of a batch: token ids, attention mask, positions and KV cache; the last distributions and
    grammar masks; the rows that wrote nothing in the step before (their distribution stands) or took tokens back."""

    def __init__(self, model, prompts: list[list[int]], pad_id: int, banned: torch.Tensor, grammar: GrammarRows | None,
                 rows: list[RowConstraint | None]):
        self.model, self.grammar, self.rows, self.pad_id = model, grammar, rows, pad_id
        device = self.device = next(model.parameters()).device
        width = max(map(len, prompts))
        self.ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)       # [B, T]
        self.attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        self.positions = (self.attention.cumsum(-1) - 1).clamp(min=0)
        self.banned = banned.to(device)
        self.cache_arg, self.cache = _cache_argument(model), None
        self.raw = self.grammar_mask = None
        self.idle = False     # the step before wrote no token (every row that ran waited)
        self.rolled = False   # a row took a token back in the step before (its grammar mask is computed again)
        self.waited: list[int] = []  # rows that wrote nothing in the step before
        self.back = [0] * len(prompts)  # tokens each row has taken back this step (positions freed)

    def forward(self, running: list[bool]) -> torch.Tensor:
        """The model's logits for each row's next token [B, V] (a row that waited: those of its last real step)."""
        if self.idle:  # no row wrote a token in the step before: every distribution and mask stands, no forward pass
            for row in self.rows:  # (what rows let go of is freed now, outside any check; the collection waits for
                if row is not None:  # the next forward pass)
                    row.tidy()
            return self.raw
        if self.grammar is not None and any(running):  # the masks, while the model runs
            self.grammar.prefetch(running)
        young = collect_young(self.rows, concurrent=self.grammar is not None)
        out = self.model(input_ids=self.ids, attention_mask=self.attention, position_ids=self.positions,
                         use_cache=True, **{self.cache_arg: self.cache})
        self.cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        if young is not None:
            young.result()
        raw = out.logits[:, -1, : self.banned.shape[0]].float()
        if self.waited:  # the forward pass of a waiting row's padding says nothing: the row's last distribution
            raw[self.waited] = self.raw[self.waited]
        self.raw = raw
        return raw

    def mask(self, raw: torch.Tensor, running: list[bool], divisor: float, policies: list[RowPolicy],
             stats: StepStats) -> torch.Tensor:
        """The logits divided by the temperature (``divisor``), less the banned tokens, the grammar's and each row's
        exclusions."""
        logits = (raw / divisor).masked_fill(self.banned, float("-inf"))
        if self.grammar is not None:
            t = time.perf_counter()
            if not self.idle or self.rolled:  # (rolled back since the mask was computed: computed again)
                self.grammar_mask = self.grammar.mask(running)
            logits = logits.masked_fill(~self.grammar_mask, float("-inf"))
            stats.mask_seconds += time.perf_counter() - t
        self.rolled = False
        for i, p in enumerate(policies):
            if running[i]:
                p.restrict(logits[i])
        return logits

    def note(self, row: int) -> tuple:
        """What taking back the token ``row`` writes now needs: its step's logits and its cache column."""
        return self.raw[row], self.attention.shape[1]

    def advance(self, row: int, token: int) -> None:
        if self.grammar is not None:
            self.grammar.advance(row, token)

    def take_back(self, row: int, note: tuple) -> None:
        """The model's and the grammar's part of a token taken back: hidden from the cache (its position freed), rolled
        back in the matcher; the row draws again from that token's distribution."""
        raw, column = note
        if self.grammar is not None:
            self.grammar.rollback(row)
        self.attention[row, column] = 0
        self.raw[row] = raw
        self.back[row] += 1
        self.rolled = True

    def next(self, decided: list[int | None], stop_id: int) -> bool:
        """The next step's input from the step's decisions: each row's token, a padding (masked out, taking no
        position) for a row that wrote nothing and goes on, the stop token for the others; False, and no new input,
        when no row wrote a token (every distribution stands)."""
        self.waited = [i for i, d in enumerate(decided) if d in (WAIT, BACK)]
        self.idle = not any(d is not None and d >= 0 for d in decided)
        if self.idle:
            return False
        chosen = [d if d is not None and d >= 0 else self.pad_id if d in (WAIT, BACK) else stop_id for d in decided]
        self.ids = torch.tensor(chosen, device=self.device)[:, None]
        real = torch.ones(len(chosen), 1, dtype=self.attention.dtype, device=self.device)
        real[self.waited] = 0
        self.attention = torch.cat([self.attention, real], dim=1)
        self.positions = self.positions[:, -1:] + real
        if any(self.back):  # rows that took tokens back: their next token takes the first position freed
            self.positions = self.positions - torch.tensor(self.back, dtype=self.positions.dtype,
                                                           device=self.device)[:, None]
            self.back = [0] * len(chosen)
        return True


@contextmanager
def frozen_heap():
    """The garbage collector kept out of the steps. Objects that exist when sampling starts (the model, the libraries,
    the tokenizer: hundreds of thousands) are left out of its collections (:func:`gc.freeze`): a full collection
    would otherwise scan them all, a pause of a few hundred milliseconds in whichever step triggers it. Automatic
    collection is off while sampling runs: a collection of the young generations, which the row constraints'
    states fill, would otherwise pause whichever check triggers it (a millisecond or more); instead
    :func:`collect_young` runs once per step, during the model's forward pass. Both are restored afterwards."""
    enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


def collect_young(rows: list[RowConstraint | None], concurrent: bool):
    """Between steps: the rows' litter freed (:meth:`~logos.decoding.rows.RowConstraint.tidy`) and the young
    generations collected (what the last step allocated), in the grammar's worker thread while the model's forward
    pass runs (``concurrent``; the caller waits for the returned future after the pass), else now. Cycles are rare
    here (states, plans and searches are freed by reference counting); either way the work stays out of every
    check."""
    def tidy():
        for row in rows:
            if row is not None:
                row.tidy()
        gc.collect(1)

    if not concurrent:
        tidy()
        return None
    return worker().submit(tidy)


def _cache_argument(model) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (older), whichever the model's forward takes."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
