"""The sampling loop: batched, with the model's KV cache, masks on the logits' device and per-row checks.

One step for a batch of B rows: a forward pass over the newest token (the prompt on the first
step; left padding, explicit position ids), then

1. the logits are scaled by the temperature and masked: the task's static bans (padding rows,
   byte pieces, symbols the task never writes), the grammar (:class:`~logos.generate.constraints.GrammarRows`)
   and, once a row's length budget is nearly spent, everything but its stop token when the grammar
   accepts there;
2. top-k / top-p filter the rest, and each row draws a token;
3. each row's draw is checked by the chemistry constraint; a refused token is removed from that
   row's distribution and the row draws again (rejection sampling of the restricted distribution);
4. accepted tokens advance the grammar matchers and chemistry states; a row ends at its stop token.

Each row's score is the sum of the model's own log-probabilities (temperature 1, before any mask)
of the tokens it wrote, the likelihood conditional tasks are ranked by. A row that runs out of
budget, or whose finished molecule span RDKit refuses, is reported as failed (the caller may
resample it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from logos.decoding.constraints import ChemistryRows, GrammarRows

__all__ = ["Sampling", "RowResult", "StepStats", "sample_batch"]

MAX_REDRAWS = 64  # per row and step; then the remaining candidates are checked in probability order ...
MAX_SCAN = 1024   # ... up to this many (grammar-allowed, before top-k/top-p)


@dataclass(frozen=True)
class Sampling:
    """How to draw: temperature, top-k / top-p, the length budget and how many tokens before it to start closing."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    max_new_tokens: int = 96
    closing_slack: int = 8


@dataclass
class RowResult:
    tokens: list[int] = field(default_factory=list)
    logprob: float = 0.0
    status: str = "running"   # "done", "budget" (no stop within max_new_tokens), "kekulize" (RDKit refused a span)
    redraws: int = 0


@dataclass
class StepStats:
    """Where sampling time goes: steps taken, seconds in the grammar masks and in the chemistry checks."""

    steps: int = 0
    mask_seconds: float = 0.0
    check_seconds: float = 0.0

    def add(self, other: "StepStats") -> None:
        self.steps += other.steps
        self.mask_seconds += other.mask_seconds
        self.check_seconds += other.check_seconds


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
    probs = torch.softmax(logits.float(), dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1)


@torch.no_grad()
def sample_batch(model, prompts: list[list[int]], pad_id: int, stop_id: int, banned: torch.Tensor,
                 sampling: Sampling, generator: torch.Generator, grammar: GrammarRows | None = None,
                 chemistry: ChemistryRows | None = None, stats: StepStats | None = None) -> list[RowResult]:
    """Sample one completion per prompt (token ids, without the prompt)."""
    import time

    stats = stats if stats is not None else StepStats()
    device = next(model.parameters()).device
    B, width = len(prompts), max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)          # [B, T]
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    banned = banned.to(device)
    results = [RowResult() for _ in prompts]
    cache_arg = _cache_argument(model)
    cache = None
    for step in range(sampling.max_new_tokens):
        out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True,
                    **{cache_arg: cache})
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        raw = out.logits[:, -1, : banned.shape[0]].float()                                      # [B, V]
        active = [r.status == "running" for r in results]
        logits = (raw / max(sampling.temperature, 1e-6)).masked_fill(banned, float("-inf"))
        stats.steps += 1
        if grammar is not None:
            t = time.perf_counter()
            logits = logits.masked_fill(~grammar.mask(active), float("-inf"))
            stats.mask_seconds += time.perf_counter() - t
        closing = step >= sampling.max_new_tokens - sampling.closing_slack
        if closing:  # close wherever the grammar and chemistry allow it now
            for i, r in enumerate(results):
                if not active[i] or not torch.isfinite(logits[i, stop_id]):
                    continue
                if chemistry is None or chemistry.check(i, stop_id):
                    logits[i] = torch.where(torch.arange(logits.shape[1], device=device) == stop_id, logits[i],
                                            torch.full_like(logits[i], float("-inf")))
                elif chemistry.stuck(i):
                    r.status, active[i] = "kekulize", False  # complete, but RDKit refuses it: resample
        allowed = logits  # grammar-masked, before top-k/top-p: the fallback when chemistry refuses all of those
        logits = _filter(logits, sampling.top_k, sampling.top_p)
        chosen = _draw(logits, generator)
        logp = torch.log_softmax(raw, dim=-1)
        t = time.perf_counter()
        for i, r in enumerate(results):
            if not active[i]:
                chosen[i] = stop_id
                continue
            token = int(chosen[i])
            if chemistry is not None:
                row_closing = closing or chemistry.closing(i, sampling.max_new_tokens - step, sampling.closing_slack)
                token = _accepted(i, token, logits[i], allowed[i], chemistry, generator, r, row_closing, stop_id)
            if token is None:
                r.status = "kekulize" if chemistry is not None and chemistry.stuck(i) else "dead-end"
                chosen[i] = stop_id
                continue
            chosen[i] = token
            r.tokens.append(token)
            r.logprob += float(logp[i, token])
            if grammar is not None:
                grammar.advance(i, token)
            if chemistry is not None:
                chemistry.advance(i, token)
            if token == stop_id:
                r.status = "done"
        stats.check_seconds += time.perf_counter() - t
        if all(r.status != "running" for r in results):
            break
        ids = chosen.to(device)[:, None]
        attention = torch.cat([attention, torch.ones(B, 1, dtype=attention.dtype, device=device)], dim=1)
        positions = positions[:, -1:] + 1
    for r in results:
        if r.status == "running":
            r.status = "budget"
    return results


def _cache_argument(model) -> str:
    """``cache`` (transformers >= 5.2x) or ``past_key_values`` (older), whichever the model's forward takes."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _accepted(row: int, token: int, logits: torch.Tensor, allowed: torch.Tensor, chemistry: ChemistryRows,
              generator: torch.Generator, result: RowResult, closing: bool, stop_id: int) -> int | None:
    """The row's draw if chemistry accepts it, else redraws without the refused tokens (None: nothing left).

    Redraws come from the top-k/top-p set first; when chemistry refuses all of it, the likeliest
    grammar-allowed tokens outside it are tried in order (up to ``MAX_SCAN``), so a row only dead-ends
    when nothing likely enough continues the molecule.
    """
    if chemistry.check(row, token, closing):
        return token
    logits = logits.clone()
    refused = {token}
    for _ in range(MAX_REDRAWS):
        logits[token] = float("-inf")
        result.redraws += 1
        if not torch.isfinite(logits).any():
            break
        if token == stop_id and chemistry.stuck(row):
            return None  # a finished span RDKit refuses: resample the row
        token = int(torch.multinomial(torch.softmax(logits, -1).cpu(), 1, generator=generator))
        if chemistry.check(row, token, closing):
            return token
        refused.add(token)
    if token == stop_id and chemistry.stuck(row):
        return None
    for token in torch.argsort(allowed, descending=True)[:MAX_SCAN].tolist():  # then the likeliest, in order
        if not torch.isfinite(allowed[token]):
            return None
        if token not in refused and chemistry.check(row, token, closing):
            return token
    return None  # a dead end (or nothing likely enough): the caller resamples the row
