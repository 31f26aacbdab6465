"""The sampling loop: batched, with the model's KV cache, masks on the logits' device and per-row constraints.

One step for a batch of B rows: a forward pass over the newest token (the prompt on the first
step; left padding, explicit position ids), then

1. the logits are scaled by the temperature and masked: the task's static bans (padding rows,
   byte pieces, symbols the task never writes), the grammar (:class:`~logos.generate.constraints.GrammarRows`)
   and, once a row's length budget is nearly spent, everything but its stop token when the grammar
   accepts there;
2. a row whose constraint must now follow its planned ending (:meth:`~logos.decoding.rows.RowConstraint.must_close`)
   writes that ending's next token; the others are filtered by top-k / top-p and draw;
3. each draw is checked by the row's constraint (:mod:`logos.decoding.rows`: chemistry, composition,
   copied sequence); a refused token is removed from that row's distribution and the row draws
   again (rejection sampling of the restricted distribution). After ``MAX_REDRAWS`` refusals the
   row follows its planned ending; without one, the ``MAX_SCAN`` likeliest allowed tokens are
   checked and the row draws among those accepted.

   The work of the checks is bounded per step (state updates, planner moves, RDKit checks, counted in
   units: :func:`~logos.decoding.ending.cost`). By default (``Sampling.row_work``, 32 units, a few hundred
   microseconds) a step's rows share ``row_work`` units each: every row gets its own first, and rows still
   undecided then take, in turns, what the others left. A row that finds none left before its token is
   decided *yields* the step: it writes a padding token that the attention mask hides and that takes no
   position, keeps its distribution (the logits of its last real step) and in the next step checks the same
   draw again, its constraint going on with the search it was in (a fresh draw would favour the tokens that are
   cheap to check). A row yields at most ``YIELD_WORK`` units' worth of steps in all, and ``WORK_NO_YIELD`` units
   for one token. A step in which no row wrote a token is followed by one without a forward pass (every
   distribution stands): a lone row at the tail of its batch pays only for its own work.
   With ``row_work=0`` a row does up to ``WORK_NO_YIELD`` units a step, after which it accepts only its
   planned ending's next token.

   A row at a *dead end* - nothing accepted, no planned ending - takes back its last token
   (:meth:`~logos.decoding.rows.RowConstraint.undo`: its constraint, its grammar matcher, its score, its
   place in the model's cache, which the attention mask then hides) and draws again there in the next
   step, from that token's distribution without the tokens taken back there (up to ``UNDO_DEPTH`` tokens
   back, ``MAX_UNDOS`` in all; then it fails and the caller resamples it). A state the checks let through
   that no ending completes costs a few steps instead of the row.

   Two rules end a span early by its planned
   ending (:meth:`~logos.decoding.rows.RowConstraint.ending`, the shortest the row's constraint
   finds): a refused draw of the span's closing tag (the model would end where the span cannot),
   and ``WANDERING`` refused draws in one span (the row has left what the model knows). Without
   them such rows write on from the unlikely rest of the distribution until the budget forces an
   end, and one such row holds its whole batch for the budget's length;
4. accepted tokens advance the grammar matchers and row constraints; a row ends at its stop token.

Once the batch has ended, each finished row's constraint checks what no step did
(:meth:`~logos.decoding.rows.RowConstraint.settle`: RDKit's parse of the molecules it wrote); a row that
fails gets the reason as its status (the caller resamples it). Those checks count in the constraint time,
not in any step's.

Each row's score is the sum of the model's own log-probabilities (temperature 1, before any mask)
of the tokens it wrote, the likelihood conditional tasks are ranked by. A row that runs out of
budget, or whose finished span its constraint refuses, is reported as failed (the caller may
resample it). :class:`StepStats` records the time in the grammar masks and in the row constraints,
per step and per row-step. The grammar masks of a step are computed in a worker thread during the
model's forward pass (they depend only on the tokens written before it); their time is what the
step waits for them after the forward pass.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from logos.decoding.constraints import GrammarRows, _worker
from logos.decoding.rows import UNDO_DEPTH, WORK_NO_YIELD, WORK_PER_STEP, RowConstraint

__all__ = ["Sampling", "RowResult", "StepStats", "sample_batch", "NOT_WHOLE"]

NOT_WHOLE = "not-whole"  # a finished row the model would not end the document after (drawn again)

WANDERING = 8     # draws refused in one span after which the row follows its planned ending (below)
MAX_REDRAWS = 16  # per row and step; then the planned ending, and without one the likeliest candidates ...
MAX_SCAN = 64     # ... up to this many (grammar-allowed, before top-k/top-p) are checked
YIELD_WORK = 4096  # work units' worth of steps a row may yield in all (YIELD_WORK // row_work steps; its
# constraint's work for the step spent: see below), and for one token until it has used the work a row that does not
# yield gets for it (WORK_NO_YIELD; then it fails)
MIN_SHARE = 8     # work units: a step's rows that ran out of work share what the others left while each gets this
MAX_UNDOS = 16    # tokens a row may take back in all (a dead end: see undo below), UNDO_DEPTH at most in a row


@dataclass(frozen=True)
class Sampling:
    """How to draw: temperature, top-k / top-p, the length budget (0: the task's, or what its row constraints say
    their prompts need), how many tokens before it to start closing, and, if set, the constraint work a row may do
    in a step before it yields the step (a hard bound on a step's constraint time, paid in extra steps)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 0
    closing_slack: int = 8
    row_work: int = WORK_PER_STEP  # constraint work units per row and step (a step's rows share them: one that needs
    # more takes what the others left), after which a row yields the step (0: no yielding: a row then does up to
    # WORK_NO_YIELD units a step, after which it follows its planned ending)


@dataclass
class RowResult:
    tokens: list[int] = field(default_factory=list)
    logprob: float = 0.0
    status: str = "running"   # "done", "budget" (no stop within max_new_tokens), "dead-end", or the constraint's reason
    redraws: int = 0


@dataclass
class StepStats:
    """Where sampling time goes: steps, row-steps (active rows summed over steps), seconds in the grammar masks and
    in the row constraints, and the worst step's constraint seconds per active row."""

    steps: int = 0
    mask_seconds: float = 0.0
    check_seconds: float = 0.0
    row_steps: int = 0
    worst_step_row_seconds: float = 0.0
    settle_seconds: float = 0.0  # the row constraints' checks once rows have ended (in check_seconds, in no step)
    end_draws: int = 0  # end-of-document draws of finished rows (``then_id``)
    yields: int = 0  # steps in which a row wrote nothing: its constraint's work was spent (the row drew again next)
    idle_steps: int = 0  # steps after one in which no row wrote a token: no forward pass (in ``steps``)
    undos: int = 0  # tokens taken back by rows at a dead end (each drew again where it had written it)
    closed_by_plan: int = 0  # spans sent to their planned ending (a refused draw of their end, or WANDERING)

    def add(self, other: "StepStats") -> None:
        self.steps += other.steps
        self.mask_seconds += other.mask_seconds
        self.check_seconds += other.check_seconds
        self.settle_seconds += other.settle_seconds
        self.row_steps += other.row_steps
        self.end_draws += other.end_draws
        self.yields += other.yields
        self.idle_steps += other.idle_steps
        self.undos += other.undos
        self.closed_by_plan += other.closed_by_plan
        self.worst_step_row_seconds = max(self.worst_step_row_seconds, other.worst_step_row_seconds)


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k and nucleus filtering of masked logits [B, V] (-inf stays -inf)."""
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) > top_p  # keep the first token always
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return logits


def _draw(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of ``logits`` [B, V], drawn by inverting each row's cumulative distribution (``torch.multinomial``
    takes over a millisecond for 16 rows of a few thousand tokens on a CPU; this, under a tenth of it)."""
    probs = torch.softmax(logits.float(), dim=-1).cpu()
    cum = probs.cumsum(-1)
    u = torch.rand(probs.shape[0], 1, generator=generator) * cum[:, -1:]
    token = torch.searchsorted(cum, u, right=True).clamp(max=probs.shape[1] - 1).squeeze(-1)
    for i in torch.nonzero(probs.gather(1, token[:, None]).squeeze(1) == 0).flatten().tolist():
        token[i] = int(torch.nonzero(probs[i]).max())  # rounding at the very top: the last token with probability
    return token


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
    return _worker().submit(tidy)


def sample_batch(model, prompts: list[list[int]], pad_id: int, stop_id: int, banned: torch.Tensor,
                 sampling: Sampling, generator: torch.Generator, grammar: GrammarRows | None = None,
                 rows: list[RowConstraint | None] | None = None, stats: StepStats | None = None,
                 then_id: int | None = None) -> list[RowResult]:
    """Sample one completion per prompt (token ids, without the prompt). With ``then_id`` (the end of document), a
    finished row is kept with the model's probability of ``then_id`` after it and otherwise gets the status
    :data:`NOT_WHOLE` (the caller draws it again): rejection sampling of completions that end the document."""
    with frozen_heap(), torch.no_grad():
        return _sample_batch(model, prompts, pad_id, stop_id, banned, sampling, generator, grammar, rows, stats,
                             then_id)


def _sample_batch(model, prompts, pad_id, stop_id, banned, sampling, generator, grammar, rows, stats, then_id):
    stats = stats if stats is not None else StepStats()
    rows = rows if rows is not None else [None] * len(prompts)
    device = next(model.parameters()).device
    B, width = len(prompts), max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)          # [B, T]
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    banned = banned.to(device)
    results = [RowResult() for _ in prompts]
    cache_arg = _cache_argument(model)
    cache = None
    pending: list[int] = []  # rows that have just closed and wait for the end-of-document draw
    ending_now = [False] * B  # rows following their planned ending (see WANDERING)
    refused = [0] * B         # draws refused in each row's open span
    yields = [0] * B          # steps each row has yielded
    stalled = [0] * B         # work units each row has used since it last wrote a token
    yielded: list[int] = []   # rows that wrote nothing in the step before: their distribution stands
    trail: list[list[tuple]] = [[] for _ in range(B)]  # each row's last tokens: (token, raw logits of its step, its
    # cache column, tokens taken back there before), for undo
    undos = [0] * B           # tokens each row has taken back
    back = [0] * B            # tokens each row has taken back this step (positions freed)
    exclude: dict[int, frozenset] = {}  # rows drawing again where they took tokens back: those tokens
    undecided: dict[int, int] = {}  # rows that yielded with a draw their constraint had not decided: that draw
    for row in rows:
        if row is not None and sampling.row_work:
            row.can_yield, row.step_work = True, sampling.row_work  # the work of a step a row may yield
            row.renew()
    last_raw = grammar_mask = None
    idle = False  # the step before wrote no token (every row that ran yielded)
    rolled = False  # a row took a token back in the step before
    max_yields = YIELD_WORK // max(sampling.row_work, 1)
    for step in range(sampling.max_new_tokens + max_yields + 1):
        for r in results:
            if r.status == "running" and len(r.tokens) >= sampling.max_new_tokens:
                r.status = "budget"
        running = [r.status == "running" for r in results]
        if not any(running) and not pending:
            break
        if idle:  # no row wrote a token in the step before: every distribution and mask stands, no forward pass
            for row in rows:  # (what rows let go of is freed now, outside any check; the collection waits for the
                if row is not None:  # next forward pass)
                    row.tidy()
            raw = last_raw
        else:
            if grammar is not None and any(running):  # the masks, while the model runs
                grammar.prefetch(running)
            young = collect_young(rows, concurrent=grammar is not None)
            out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True,
                        **{cache_arg: cache})
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            if young is not None:
                young.result()
            raw = out.logits[:, -1, : banned.shape[0]].float()                                      # [B, V]
            if yielded:  # the forward pass of a yielded step's padding says nothing: the row's last distribution
                raw[yielded] = last_raw[yielded]
            last_raw = raw
        if pending:
            ends = torch.softmax(raw[pending] / max(sampling.temperature, 1e-6), dim=-1)[:, then_id]
            draws = torch.rand(len(pending), generator=generator)
            for i, p_end, u in zip(pending, ends.tolist(), draws.tolist()):
                if u >= p_end:
                    results[i].status = NOT_WHOLE
            stats.end_draws += len(pending)
            pending = []
        if not any(running) or step == sampling.max_new_tokens + max_yields:
            break
        active = running
        logits = (raw / max(sampling.temperature, 1e-6)).masked_fill(banned, float("-inf"))
        stats.steps += 1
        if grammar is not None:
            t = time.perf_counter()
            if not idle or rolled:  # (rolled back since the mask was computed: computed again)
                grammar_mask = grammar.mask(active)
            logits = logits.masked_fill(~grammar_mask, float("-inf"))
            stats.mask_seconds += time.perf_counter() - t
        for i, tokens in exclude.items():  # rows that took tokens back draw again without them (if any is left)
            kept = logits[i].index_fill(0, torch.tensor(sorted(tokens), device=logits.device), float("-inf"))
            if active[i] and torch.isfinite(kept).any():
                logits[i] = kept
        rolled = False
        left = [sampling.max_new_tokens - len(r.tokens) for r in results]  # each row's budget left
        t_step = time.perf_counter()
        forced: dict[int, int] = {}
        for i, row in enumerate(rows):  # rows that must follow their planned ending now
            if row is not None and active[i] and (ending_now[i] or row.must_close(left[i])):
                plan = row.ending(left[i])
                if plan and torch.isfinite(logits[i, plan[0]]) and row.check(plan[0], left[i]):
                    forced[i] = plan[0]
        spent = time.perf_counter() - t_step
        for i, r in enumerate(results):  # near the budget: close wherever the grammar and the row constraint allow
            if not active[i] or i in forced or left[i] > sampling.closing_slack or \
                    not torch.isfinite(logits[i, stop_id]):
                continue
            t = time.perf_counter()
            ok = rows[i] is None or rows[i].check(stop_id, left[i])
            spent += time.perf_counter() - t
            if ok:
                forced[i] = stop_id
        allowed = logits  # grammar-masked, before top-k/top-p: where a row looks when its draws are refused
        logits = _filter(logits, sampling.top_k, sampling.top_p)
        chosen = _draw(logits, generator)
        logp = torch.log_softmax(raw, dim=-1)
        def decide(i: int, token: int, ok: bool | None = None) -> int | None:
            """Row ``i``'s token this step from its draw ``token`` (``ok``: its check, if made): accepted, redrawn, its
            planned ending or a scanned candidate (None: none; the row yields if its work is spent, else it takes back
            its last token or fails)."""
            row, r, remaining = rows[i], results[i], left[i]
            if ok is None:
                ok = row.check(token, remaining)
            planned = None
            if not ok and row.closes(token) and row.failure is None:
                plan = row.ending(remaining)  # the model would end the span here: end it the shortest way
                if plan and torch.isfinite(allowed[i, plan[0]]) and row.check(plan[0], remaining):
                    planned = plan[0]
                    stats.closed_by_plan += 1
            ending_now[i] = planned is not None  # (a row whose ending could not be followed draws again)
            if planned is not None:
                return planned
            before = r.redraws
            if not ok:
                token, last = _redrawn(token, logits[i], row, remaining, generator, r)
                if token is None and yielding(row):  # undecided for want of work: checked first when the row
                    undecided[i] = last  # has work again (a fresh draw would favour the tokens cheap to check)
            stats.closed_by_plan += refused[i] < WANDERING <= refused[i] + r.redraws - before
            refused[i] += r.redraws - before
            if (token is None and not yielding(row)) or refused[i] >= WANDERING:  # the row has left what the
                ending_now[i] = token is None or not row.closes(token)  # model knows: its planned ending
                # (now or next; a row whose work ran out checks its draw again when it is renewed, if it yields)
            if token is None:
                plan = row.ending(remaining)
                if plan and torch.isfinite(allowed[i, plan[0]]) and row.check(plan[0], remaining):
                    token = plan[0]
                elif not yielding(row):  # (a row that yields for want of work: the scan's checks would be refused)
                    token = _scanned(allowed[i], row, remaining, generator)
            return token

        def undo(i: int) -> bool:
            """Row ``i`` at a dead end: its last token taken back (its constraint, the grammar, its score, its place
            in the model's cache); it draws again there in the next step, from that token's distribution without it
            and without the tokens taken back there before (False: its constraint keeps no history)."""
            row, r = rows[i], results[i]
            if not row.undo():
                trail[i].clear()
                return False
            token, raw_i, column, excluded = trail[i].pop()
            if grammar is not None:
                grammar.rollback(i)
            r.tokens.pop()
            r.logprob -= float(torch.log_softmax(raw_i, -1)[token])
            attention[i, column] = 0  # the model no longer sees it; the next token takes its position
            raw[i] = raw_i  # (the distribution the row draws from in the next step: see yielded)
            exclude[i] = excluded | {token}
            undecided.pop(i, None)
            back[i] += 1
            left[i] += 1
            undos[i] += 1
            stats.undos += 1
            return True

        drawn = chosen.tolist()
        for i, token in undecided.items():
            drawn[i] = token
        undecided.clear()
        checking = [i for i in range(B) if active[i] and rows[i] is not None and i not in forced]
        t = time.perf_counter()
        checked = [rows[i].check(drawn[i], left[i]) for i in checking]  # the draws' checks one after another: the
        spent += time.perf_counter() - t  # constraint code stays in the core's caches (tensor operations between
        # two checks push it out)
        decided: dict[int, int | None] = {}
        for i in range(B):
            if active[i]:
                decided[i] = forced.get(i, drawn[i])
        for i, ok in zip(checking, checked):
            t = time.perf_counter()
            decided[i] = decide(i, drawn[i], ok)
            spent += time.perf_counter() - t
        used = [0] * B  # work units each row has used this step
        for i in decided:
            if rows[i] is not None and rows[i].can_yield:
                used[i] = _used(rows[i], sampling.row_work)
        if sampling.row_work:  # rows whose work ran out take what the step's other rows left, drawing again
            pool = sampling.row_work * len(decided) - sum(used)
            waiting = [i for i, tok in decided.items() if tok is None and yielding(rows[i])
                       and rows[i].work_left() is not None]
            while waiting and pool >= MIN_SHARE * len(waiting):
                share = pool // len(waiting)
                t = time.perf_counter()
                for i in list(waiting):
                    if rows[i].renew(share) is False:  # (its draw waits for a check that runs alone in its next step)
                        waiting.remove(i)
                        continue
                    token = undecided.pop(i) if i in undecided else int(_draw(logits[i: i + 1], generator)[0])
                    decided[i] = decide(i, token)
                    more = _used(rows[i], share)
                    used[i] += more
                    pool -= more
                spent += time.perf_counter() - t
                waiting = [i for i in waiting if decided[i] is None and yielding(rows[i])]
        n_active = len(decided)
        wrote = False
        yielded = []
        for i, r in enumerate(results):
            if not active[i]:
                chosen[i] = stop_id
                continue
            token, row = decided[i], rows[i]
            stalled[i] += used[i]
            undone = False
            if token is None and row is not None and row.failure is None and trail[i] and undos[i] < MAX_UNDOS \
                    and not (yielding(row) and yields[i] < max_yields and stalled[i] < WORK_NO_YIELD):
                t = time.perf_counter()
                undone = rolled = undo(i)  # a dead end: the row takes back its last token and draws again there
                spent += time.perf_counter() - t
            if token is None and row is not None and yields[i] < max_yields and (undone or (
                    yielding(row) and stalled[i] < WORK_NO_YIELD)):
                yields[i] += 1  # the row's work for the step is spent before a token was decided: it writes nothing
                stats.yields += 1  # and checks its draw again in the next step, where its ending search goes on
                row.renew()
                stalled[i] = 0 if undone else stalled[i]
                yielded.append(i)
                chosen[i] = pad_id
                continue
            if token is None:
                r.status = (row.failure if row is not None and row.failure else "dead-end")
                chosen[i] = stop_id
                continue
            chosen[i] = token
            stalled[i] = 0
            wrote = True
            excluded = exclude.pop(i, frozenset())
            r.tokens.append(token)
            r.logprob += float(logp[i, token])
            if row is not None and token != stop_id:  # what undo needs to draw this token again
                trail[i].append((token, raw[i], attention.shape[1], excluded))
                if len(trail[i]) > UNDO_DEPTH:
                    del trail[i][0]
            if grammar is not None:
                grammar.advance(i, token)
            if row is not None:
                t = time.perf_counter()
                if row.closes(token):
                    ending_now[i], refused[i] = False, 0
                row.advance(token)
                spent += time.perf_counter() - t
            if token == stop_id:
                r.status = "done"
                if then_id is not None:
                    pending.append(i)
        for i in [i for i in undecided if i not in yielded]:  # (a row that wrote or ended has no draw pending)
            del undecided[i]
        stats.check_seconds += spent
        stats.row_steps += n_active - len(yielded)  # (a yielded step is no row-step: the mean is per token written)
        if n_active:
            stats.worst_step_row_seconds = max(stats.worst_step_row_seconds, spent / n_active)
        if all(r.status != "running" for r in results) and not pending:
            break
        idle = not wrote  # no row wrote a token: the next step needs no forward pass (every distribution stands)
        if idle:
            stats.idle_steps += 1
            continue
        ids = chosen.to(device)[:, None]
        real = torch.ones(B, 1, dtype=attention.dtype, device=device)
        real[yielded] = 0  # a yielded row's padding is masked out; its next token takes the next position
        attention = torch.cat([attention, real], dim=1)
        positions = positions[:, -1:] + real
        if any(back):  # rows that took tokens back: their next token takes the first position freed
            positions = positions - torch.tensor(back, dtype=positions.dtype, device=device)[:, None]
            back = [0] * B
    for r in results:
        if r.status == "running":
            r.status = "budget"
    t = time.perf_counter()
    for r, row in zip(results, rows):  # what no step checked (RDKit's parse of the spans): no step waits for it
        if row is not None and r.status in ("done", NOT_WHOLE):
            failure = row.settle()
            if failure:
                r.status = failure
    spent = time.perf_counter() - t
    stats.settle_seconds += spent
    stats.check_seconds += spent
    return results


def _cache_argument(model) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (older), whichever the model's forward takes."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _redrawn(token: int, logits: torch.Tensor, row: RowConstraint, remaining: int, generator: torch.Generator,
             result: RowResult) -> tuple[int | None, int]:
    """For a row whose draw ``token`` its constraint refused: a redraw without the refused tokens (None: ``MAX_REDRAWS``
    redraws refused, nothing left to draw, or the row's work spent), and the last token checked.

    Redraws come from the top-k/top-p set, less the tokens the row surely refuses (:meth:`RowConstraint.possible`):
    rejection sampling of the model's distribution restricted to accepted tokens.
    """
    if yielding(row):
        return None, token  # its work is spent: every redraw would be refused (the row yields)
    probs = torch.softmax(logits.double(), -1).numpy().copy()  # once; each redraw zeroes the refused token
    possible = row.possible()  # the tokens the row does not surely refuse: the others are dropped at once
    if possible is not None:
        n = min(len(possible), len(probs))
        probs[:n][~possible[:n]] = 0.0
        probs[n:] = 0.0
    for _ in range(MAX_REDRAWS):
        probs[token] = 0.0
        result.redraws += 1
        cum = np.cumsum(probs)
        if not cum[-1] > 0:
            break
        u = float(torch.rand((), dtype=torch.float64, generator=generator)) * cum[-1]
        token = min(int(np.searchsorted(cum, u, side="right")), len(cum) - 1)
        while probs[token] == 0.0:  # rounding at the very top of the last interval
            token -= 1
        if row.check(token, remaining):
            return token, token
        if yielding(row):
            return None, token
    return None, token


def _used(row: RowConstraint, given: int) -> int:
    """The work units ``row`` has used of the ``given`` it was renewed with (all of them, for a row that does not
    count its work and has spent it)."""
    left = row.work_left()
    if left is None:
        return given if row.spent() else 0
    return max(given - left, 0)


def yielding(row: RowConstraint) -> bool:
    """Whether ``row`` may yield its step and has spent its work for it (its refusals since are for want of work)."""
    return row.can_yield and row.spent()


def _scanned(allowed: torch.Tensor, row: RowConstraint, remaining: int, generator: torch.Generator) -> int | None:
    """For a row with neither an accepted draw nor a planned ending: the likeliest grammar-allowed tokens the row does
    not surely refuse (up to ``MAX_SCAN``) are checked and one of those accepted is drawn, in proportion to its
    probability (None: none is accepted)."""
    possible = row.possible()
    if possible is not None:
        keep = torch.zeros(allowed.shape[0], dtype=torch.bool)
        n = min(len(possible), allowed.shape[0])
        keep[:n] = torch.from_numpy(possible[:n])
        allowed = allowed.masked_fill(~keep, float("-inf"))
    finite = int(torch.isfinite(allowed).sum())
    if not finite:
        return None
    top = torch.topk(allowed, min(MAX_SCAN, finite))
    ok = [k for k, tok in enumerate(top.indices.tolist()) if row.check(tok, remaining)]
    if not ok:
        return None
    weights = torch.softmax(top.values[ok], -1)
    return int(top.indices[ok][int(torch.multinomial(weights, 1, generator=generator))])
