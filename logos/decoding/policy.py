"""The per-row sampling policy both engines call: a row's distribution at a step in, its token, a wait or its end out.

A row constraint (:mod:`logos.decoding.rows`) says whether a row may write a token; the policy decides which token it
writes, and owns what the row knows between draws: its draws refused in the open span, the planned ending it follows,
the work it has used without writing, the tokens it may take back, the tokens excluded where it took one back, the
draw it waits to decide, the steps it has waited. One :class:`RowPolicy` per row; the built-in loop
(:mod:`logos.decoding.sampler`: forward -> mask -> decide -> commit) and the vLLM logits processor
(:mod:`logos.generate.vllm_processor`) call the same methods on it, so the same logits and the same seed give the same
tokens in both engines, except where the built-in loop lets a row wait (below).

A row's decision in a step (:meth:`RowPolicy.decide`), from its :class:`Distribution` (the grammar-masked logits
scaled by the temperature, and the top-k / top-p distribution drawn from):

1. a row that must follow its planned ending (its constraint's ``must_close``, or a rule of 3. sent it there) writes
   that ending's next token (:meth:`~logos.decoding.rows.RowConstraint.ending`); within ``closing_slack`` tokens of
   its budget it writes its stop token wherever the grammar and its constraint allow;
2. otherwise it draws, by inverting the cumulative distribution at a uniform number from its generator (the one draw
   method of both engines: ``torch.multinomial`` takes over a millisecond for 16 rows of a few thousand tokens on a
   CPU), and its constraint checks the draw. A refused token is removed and the row draws again, from then on only
   among the tokens its constraint does not surely refuse (``possible()``): rejection sampling of the model's
   distribution restricted to accepted tokens. After ``MAX_REDRAWS`` refused redraws, or with nothing left, the row
   follows its planned ending; without one, the ``MAX_SCAN`` likeliest grammar-allowed tokens not yet refused are
   checked and the row draws among those accepted, in proportion to their probability;
3. two rules end a span early by its planned ending: a refused draw of the span's closing tag (the model would end
   where the span cannot), and ``WANDERING`` refused draws in one span (the row has left what the model knows).
   Without them such rows write on from the unlikely rest of the distribution until the budget forces an end, and one
   such row holds its whole batch for the budget's length.

A row that decided no token then (:meth:`RowPolicy.conclude`)

- *waits* (:data:`WAIT`) when its constraint spent the step's work before the draw was decided (the built-in loop's
  ``Sampling.row_work``): it writes nothing this step and checks the same draw first in the next (a fresh draw would
  favour the tokens that are cheap to check), at most ``YIELD_WORK`` units' worth of steps in all and
  ``WORK_NO_YIELD`` units for one token;
- *takes back* its last token (:data:`BACK`) at a dead end - nothing accepted, no planned ending - through its
  constraint's ``undo`` (up to ``UNDO_DEPTH`` tokens back, ``MAX_UNDOS`` in all): it draws again there in the next
  step, from that token's distribution without the tokens taken back there. A state the checks let through that no
  ending completes costs a few steps instead of the row;
- or *ends* (:data:`END`): it has failed, and the caller resamples it.

**Where the engines differ.** vLLM writes a token for every request in every step and cannot unwrite one, so its
rows never wait or take back (``waits=False``): their constraints get ``WORK_NO_YIELD`` units a step, after which they
accept only the planned ending's next token, and a dead end ends the row (the front end resamples it). The built-in
loop with ``Sampling(row_work=0)`` gives its rows the same work; it still takes tokens back at a dead end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from logos.decoding.rows import UNDO_DEPTH, WORK_NO_YIELD, WORK_PER_STEP, RowConstraint

__all__ = ["BACK", "END", "WAIT", "Distribution", "PolicyCounts", "RowPolicy", "RowResult", "Sampling", "Uniforms",
           "distributions", "filtered", "inverse_cdf", "MAX_REDRAWS", "MAX_SCAN", "MAX_UNDOS", "MIN_SHARE", "WANDERING",
           "YIELD_WORK"]

WANDERING = 8     # draws refused in one span after which the row follows its planned ending
MAX_REDRAWS = 16  # per row and step; then the planned ending, and without one the likeliest candidates ...
MAX_SCAN = 64     # ... up to this many (grammar-allowed, before top-k/top-p) are checked
YIELD_WORK = 4096  # work units' worth of steps a row may wait in all (YIELD_WORK // row_work steps), and for one
# token until it has used the work a row that does not wait gets for it (WORK_NO_YIELD; then it fails)
MIN_SHARE = 8     # work units: a step's rows that ran out of work share what the others left while each gets this
MAX_UNDOS = 16    # tokens a row may take back in all, UNDO_DEPTH at most in a row

WAIT = -1  # the row writes nothing this step: its work ran out before its draw was decided (it decides it next step)
BACK = -2  # the row took back its last token (a dead end): it writes nothing this step and draws again there next
END = -3   # nothing acceptable, nothing to wait for: the row has failed (its result's status says why)


@dataclass(frozen=True)
class Sampling:
    """How to draw: temperature (None: the task's), top-k / top-p, the length budget (0: the task's, or what its row
    constraints say their prompts need), how many tokens before it to start closing, and, if set, the constraint
    work a row may do in a step before it waits (a hard bound on a step's constraint time, paid in extra steps)."""

    temperature: float | None = None  # None: the task's (logos.generate fills it in; 1 where no task is known)
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 0
    closing_slack: int = 8
    row_work: int = WORK_PER_STEP  # constraint work units per row and step (a step's rows share them: one that needs
    # more takes what the others left), after which a row waits (0: no waiting: a row then does up to WORK_NO_YIELD
    # units a step, after which it follows its planned ending; vLLM's rows always do)

    @property
    def divisor(self) -> float:
        """What the logits are divided by: the temperature (1 when none is set), at least 1e-6 (0: greedy)."""
        return 1.0 if self.temperature is None else max(self.temperature, 1e-6)


@dataclass
class RowResult:
    tokens: list[int] = field(default_factory=list)
    logprob: float = 0.0
    status: str = "running"   # "done", "budget" (no stop within max_new_tokens), "dead-end", or the constraint's reason
    redraws: int = 0  # draws its constraint refused


@dataclass
class PolicyCounts:
    """What rows' policies did, summed (one object shared by the rows of a run, or of a vLLM engine)."""

    row_steps: int = 0       # decisions of constrained rows (a row and a step; a wait's renewal is none)
    checks: int = 0          # tokens its constraint checked
    redraws: int = 0         # draws refused (each followed by a redraw, or the planned ending or the scan)
    closed_by_plan: int = 0  # spans sent to their planned ending (a refused draw of their end, or WANDERING)
    yields: int = 0          # steps in which a row wrote nothing and drew again next (waits and take-backs)
    undos: int = 0           # tokens taken back at a dead end
    dead_ends: int = 0       # rows that ended with nothing acceptable (failed)

    def add(self, other: "PolicyCounts") -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def minus(self, other: "PolicyCounts") -> "PolicyCounts":
        return PolicyCounts(**{name: getattr(self, name) - getattr(other, name) for name in self.__dataclass_fields__})


def filtered(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
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


class Uniforms:
    """Uniform numbers in [0, 1) from a torch generator, drawn in blocks: the same numbers, in the same order, as one
    ``torch.rand((), dtype=torch.float64)`` call each (a call costs microseconds; a row draws several a step)."""

    BLOCK = 64

    def __init__(self, generator: torch.Generator):
        self.generator = generator
        self._block: list[float] = []

    def __call__(self) -> float:
        if not self._block:
            self._block = torch.rand(self.BLOCK, dtype=torch.float64, generator=self.generator).tolist()[::-1]
        return self._block.pop()


class Distribution:
    """One row's distribution at a step: ``logits`` (float32 [V], grammar-masked and scaled by the temperature, before
    top-k / top-p: where the row looks for its planned ending and its candidates), ``probs`` and ``cum`` (float32 [V],
    after top-k / top-p: what it draws from, and its running sum)."""

    __slots__ = ("logits", "probs", "cum")

    def __init__(self, logits: np.ndarray, probs: np.ndarray, cum: np.ndarray):
        self.logits, self.probs, self.cum = logits, probs, cum

    def allows(self, token: int) -> bool:
        return bool(self.logits[token] > -np.inf)

    def draw(self, uniforms: Uniforms) -> int | None:
        """A token drawn from ``probs`` (None: nothing to draw)."""
        return inverse_cdf(self.cum, self.probs, uniforms)


def distributions(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> list[Distribution]:
    """One :class:`Distribution` per row of ``logits`` [B, V] (grammar-masked, scaled by the temperature); the same
    numbers for a row whether it comes alone or in a batch."""
    logits = logits.float().cpu()
    probs = torch.softmax(filtered(logits, top_k, top_p), -1)                                    # [B, V]
    cum = probs.cumsum(-1).numpy()
    probs, allowed = probs.numpy(), logits.numpy()
    return [Distribution(allowed[i], probs[i], cum[i]) for i in range(len(probs))]


def inverse_cdf(cum: np.ndarray, probs: np.ndarray, uniforms: Uniforms) -> int | None:
    """The token whose interval of the running sum ``cum`` of ``probs`` holds the next of ``uniforms`` (None: no
    mass)."""
    total = float(cum[-1])
    if not total > 0:
        return None
    token = int(cum.searchsorted(uniforms() * total, side="right"))
    if token >= len(cum):
        token = len(cum) - 1
    while probs[token] == 0:  # rounding at the very top of the last interval
        token -= 1
    return token


def _used(row: RowConstraint, given: int) -> int:
    """The work units ``row`` has used of the ``given`` it was renewed with (all of them, for a row that does not
    count its work and has spent it)."""
    left = row.work_left()
    if left is None:
        return given if row.spent() else 0
    return max(given - left, 0)


class RowPolicy:
    """One row's sampling policy (see the module docstring). ``constraint``: the row's constraint (None: none, the
    grammar alone); ``uniforms``: its random numbers (the rows of a batch may share them); ``waits``: the engine may
    let the row write nothing in a step (the built-in loop; not vLLM). ``result`` holds what the row wrote, its score
    and its status."""

    def __init__(self, constraint: RowConstraint | None, stop_id: int, sampling: Sampling, uniforms: Uniforms,
                 counts: PolicyCounts | None = None, waits: bool = False):
        self.constraint = constraint if constraint is not None else RowConstraint()
        self.constrained = constraint is not None
        self.stop_id, self.uniforms = stop_id, uniforms
        self.budget, self.slack = sampling.max_new_tokens, sampling.closing_slack
        self.counts = counts if counts is not None else PolicyCounts()
        self.result = RowResult()
        self.row_work = sampling.row_work if waits and self.constrained else 0
        self.max_waits = YIELD_WORK // max(sampling.row_work, 1) if waits else 0
        self.keeps_trail = waits and self.constrained
        if self.row_work:  # the work of a step a row may wait
            self.constraint.can_yield, self.constraint.step_work = True, self.row_work
            self.constraint.renew()
        self.ending_now = False  # following the planned ending (see WANDERING)
        self.refused = 0      # draws refused in the open span
        self.waits = 0        # steps waited (and tokens taken back)
        self.stalled = 0      # work units used since the row last wrote a token
        self.used = 0         # work units used this step
        self.trail: list[tuple] = []  # the last tokens: (token, its log-probability, the engine's note, the tokens
        # taken back there before), for a take-back
        self.undos = 0        # tokens taken back
        self.exclude: frozenset = frozenset()  # drawing again where it took tokens back: those tokens
        self.pending: int | None = None  # a draw its constraint had not decided when the row's work ran out
        self.taken = None     # the engine's note of the token taken back this step (BACK)
        self._proposal: tuple[int | None, bool] | None = None  # this step's first candidate (see propose)

    # ---------------------------------------------------------------- the row
    @property
    def remaining(self) -> int:
        """Tokens of budget left, the next one included."""
        return self.budget - len(self.result.tokens)

    def running(self) -> bool:
        """Whether the row goes on (a row whose budget is spent gets the status ``budget``)."""
        r = self.result
        if r.status == "running" and len(r.tokens) >= self.budget:
            r.status = "budget"
        return r.status == "running"

    def check(self, token: int) -> bool:
        """The row constraint's verdict on ``token`` now (counted)."""
        self.counts.checks += 1
        return self.constraint.check(token, self.remaining)

    def restrict(self, logits: torch.Tensor) -> None:
        """Drop from the row's masked logits [V] (in place) the tokens taken back where it draws again, unless nothing
        would be left."""
        if self.exclude:
            kept = logits.index_fill(0, torch.tensor(sorted(self.exclude), device=logits.device), float("-inf"))
            if torch.isfinite(kept).any():
                logits.copy_(kept)

    # ---------------------------------------------------------------- a step's decision
    def propose(self, dist: Distribution) -> int | None:
        """This step's first candidate, to be checked (an engine may check its rows' candidates one after another:
        the constraint code then stays in the core's caches), or None when the row's token is decided already (its
        planned ending's next token, or its stop token near the budget)."""
        c, remaining = self.constraint, self.remaining
        self.used = 0
        token = None
        if self.constrained:
            self.counts.row_steps += 1
            if self.ending_now or c.must_close(remaining):
                token = self._planned(dist)
        if token is None and remaining <= self.slack and dist.allows(self.stop_id) and (
                not self.constrained or self.check(self.stop_id)):
            token = self.stop_id
        if token is not None:
            self._proposal = (token, True)
            return None
        if self.pending is not None:
            token, self.pending = self.pending, None
        else:
            token = dist.draw(self.uniforms)
        self._proposal = (token, False)
        return token

    def decide(self, dist: Distribution, ok: bool | None = None) -> int:
        """The row's token this step (a token id), or :data:`WAIT` (its work ran out before a token was decided: the
        engine may give it more, :meth:`more`) or :data:`END` (nothing acceptable). ``ok``: the constraint's verdict on
        the proposed candidate, if the engine checked it (:meth:`propose`, called here if the engine did not)."""
        if self._proposal is None:
            self.propose(dist)
        (token, decided), self._proposal = self._proposal, None
        if not decided:
            token = self._from_draw(dist, token, ok)
        if self.constraint.can_yield:
            self.used = _used(self.constraint, self.row_work)
        return token

    def more(self, dist: Distribution, work: int) -> int | None:
        """A waiting row given ``work`` more units in the same step (what the step's other rows left): its decision as
        :meth:`decide`'s, or None if it cannot use them now."""
        c = self.constraint
        if c.renew(work) is False:
            return None
        token, self.pending = (self.pending, None) if self.pending is not None else (dist.draw(self.uniforms), None)
        decision = self._from_draw(dist, token, None)
        self.used += _used(c, work)
        return decision

    def conclude(self, decision: int) -> int:
        """What the row does this step: ``decision`` if it is a token; else :data:`WAIT`, :data:`BACK` (the engine
        undoes its part of the token taken back: its note is ``taken``) or :data:`END` (``result.status`` says why)."""
        self.stalled += self.used
        if decision >= 0:
            return decision
        c = self.constraint
        can_wait = self._waiting() and self.waits < self.max_waits and self.stalled < WORK_NO_YIELD
        undone = False
        if self.keeps_trail and c.failure is None and self.trail and self.undos < MAX_UNDOS and not can_wait:
            undone = self._take_back()
        if self.constrained and self.waits < self.max_waits and (undone or can_wait):
            self.waits += 1  # nothing written this step; the search of its draw goes on in the next
            self.counts.yields += 1
            c.renew()
            if undone:
                self.stalled = 0
            return BACK if undone else WAIT
        self.result.status = c.failure or "dead-end"
        self.counts.dead_ends += 1
        return END

    def commit(self, token: int, logprob: float = 0.0, note=None) -> None:
        """The row writes ``token`` (the model's log-probability of it; ``note``: what the engine needs to take it back:
        kept with it)."""
        self.stalled, self.pending = 0, None
        excluded, self.exclude = self.exclude, frozenset()
        r = self.result
        r.tokens.append(token)
        r.logprob += logprob
        if self.keeps_trail and token != self.stop_id:
            self.trail.append((token, logprob, note, excluded))
            if len(self.trail) > UNDO_DEPTH:
                del self.trail[0]
        if self.constrained:
            c = self.constraint
            if c.closes(token):
                self.ending_now, self.refused = False, 0
            c.advance(token)
        if token == self.stop_id:
            r.status = "done"

    def settle(self) -> None:
        """Once the row has ended: its constraint's checks that no step made (a failure becomes its status)."""
        failure = self.constraint.settle() if self.constrained else None
        if failure:
            self.result.status = failure

    # ---------------------------------------------------------------- inside a decision
    def _waiting(self) -> bool:
        """Whether the row may wait and has spent its work for the step (its refusals since are for want of work)."""
        c = self.constraint
        return c.can_yield and c.spent()

    def _planned(self, dist: Distribution) -> int | None:
        """The planned ending's next token, if the grammar and the constraint allow it now."""
        plan = self.constraint.ending(self.remaining)
        if plan and dist.allows(plan[0]) and self.check(plan[0]):
            return plan[0]
        return None

    def _from_draw(self, dist: Distribution, token: int | None, ok: bool | None) -> int:
        """The row's decision from its draw ``token`` (``ok``: its verdict, None: not checked yet)."""
        if not self.constrained:
            return token if token is not None else END
        c = self.constraint
        if token is not None and ok is None:
            ok = self.check(token)
        if ok and token is not None:
            self.ending_now = False
            return self._counted(token, 0)
        if token is not None and c.closes(token) and c.failure is None:  # the model would end the span here
            planned = self._planned(dist)  # ... where it cannot: end it the shortest way
            self.ending_now = planned is not None
            if planned is not None:
                self.counts.closed_by_plan += 1
                return planned
        self.ending_now = False
        refused: set[int] = set()
        if token is not None:
            token, refused = self._redrawn(dist, token)
        token = self._counted(token, len(refused) - (self.pending is not None))
        if token is None:
            token = self._planned(dist)
            if token is None and not self._waiting():  # (a waiting row's checks would be refused)
                token = self._scanned(dist, refused)
        if token is None:
            return WAIT if self._waiting() else END
        return token

    def _counted(self, token: int | None, refused: int) -> int | None:
        """The refusals of a decision counted; the planned ending from now on for a row that has left what the model
        knows (WANDERING) or found nothing to draw."""
        self.counts.closed_by_plan += self.refused < WANDERING <= self.refused + refused
        self.refused += refused
        self.counts.redraws += refused
        self.result.redraws += refused
        if (token is None and not self._waiting()) or self.refused >= WANDERING:
            self.ending_now = token is None or not self.constraint.closes(token)
        return token

    def _take_back(self) -> bool:
        """At a dead end: the last token taken back (the constraint, the score; the engine's part is its note, in
        ``taken``); the row draws again there without it and without the tokens taken back there before (False: the
        constraint keeps no history)."""
        if not self.constraint.undo():
            self.trail.clear()
            return False
        token, logprob, self.taken, excluded = self.trail.pop()
        r = self.result
        r.tokens.pop()
        r.logprob -= logprob
        self.exclude = excluded | {token}
        self.pending = None
        self.undos += 1
        self.counts.undos += 1
        return True

    def _redrawn(self, dist: Distribution, token: int) -> tuple[int | None, set[int]]:
        """For a draw ``token`` the constraint refused: a redraw it accepts (None: ``MAX_REDRAWS`` redraws refused,
        nothing left to draw, or the row's work spent: then its last draw waits in ``pending``), and the tokens
        refused (the waiting one included)."""
        refused = {token}
        if self._waiting():
            self.pending = token  # its work is spent: every redraw would be refused (the row waits)
            return None, refused
        probs = dist.probs.astype(np.float64)  # (a copy: each redraw zeroes the refused token)
        possible = self.constraint.possible()  # the tokens the row does not surely refuse: the others dropped at once
        if possible is not None:
            n = min(len(possible), len(probs))
            probs[:n][~possible[:n]] = 0.0
            probs[n:] = 0.0
        probs[token] = 0.0
        for _ in range(MAX_REDRAWS):
            token = inverse_cdf(np.cumsum(probs), probs, self.uniforms)
            if token is None:
                break
            if self.check(token):
                return token, refused
            refused.add(token)
            if self._waiting():
                self.pending = token
                break
            probs[token] = 0.0
        return None, refused

    def _scanned(self, dist: Distribution, refused: set[int]) -> int | None:
        """For a row with neither an accepted draw nor a planned ending: the likeliest grammar-allowed tokens the row
        does not surely refuse and has not refused this step (up to ``MAX_SCAN``) are checked and one of those accepted
        is drawn, in proportion to its probability (None: none is accepted)."""
        logits = dist.logits
        possible = self.constraint.possible()
        if possible is not None:
            keep = np.zeros(len(logits), dtype=bool)
            n = min(len(possible), len(logits))
            keep[:n] = possible[:n]
            logits = np.where(keep, logits, -np.inf).astype(np.float32)
        finite = int(np.isfinite(logits).sum())
        if not finite:
            return None
        top = torch.topk(torch.from_numpy(logits), min(MAX_SCAN, finite))
        ok = [k for k, token in enumerate(top.indices.tolist()) if token not in refused and self.check(token)]
        if not ok:
            return None
        weights = torch.softmax(top.values[ok].double(), -1).numpy()
        return int(top.indices[ok[inverse_cdf(np.cumsum(weights), weights, self.uniforms)]])
