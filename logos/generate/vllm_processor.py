"""The engine side of ``--engine vllm`` and ``logos serve``: the built-in engine's row policy as a logits processor.

The grammar reaches vLLM as a structured output (llguidance backend; :mod:`logos.generate.vllm_engine` builds it
per request). What a context-free grammar cannot see - the chemistry of molecule spans (valence, rings, aromaticity,
kekulization at the closing tag), a crystal's composition, the copied sequence of a binding-site search - comes
through this module's processors: :class:`LogosLogitsProcessor` (vLLM's Model Runner V2 interface, its default on
GPUs) and :class:`LogosLogitsProcessorV1` (the V1 runner: vLLM on CPU). Per request they build the row constraint the
built-in engine uses (:func:`shared_row_constraint`, from the request's ``extra_args["logos"]``: the task and its
prompt text) and the built-in engine's policy around it (:class:`~logos.decoding.policy.RowPolicy`), which
:class:`RequestRow` feeds with the tokens vLLM wrote.

The processor runs after vLLM's grammar mask and before temperature and top-k / top-p. A mask that holds every
accepted token would need a check per grammar-allowed candidate (the shipped model spreads its mass over ~50: ~30 ms
per row per step), so the policy decides the row's token itself, as in the built-in engine - draw (the request's
temperature, top-k, top-p and seed), check, redraw, planned ending, scan - and the processor leaves only that token
finite, so vLLM's sampler takes it. Same logits and seed, same tokens as the built-in engine, except that a row here
never waits a step (vLLM writes a token for every request in every step): its constraint gets the work of a row that
does not wait, and a row with nothing acceptable left is a dead end, left to the grammar alone and resampled by the
front end (the built-in engine would take its last token back).

Unconstrained requests (``closing_only``) carry only the built-in engine's budget rule: the stop token wherever it
may be written within the last ``closing_slack`` tokens; vLLM samples the rest itself.

Each request draws with its own generator, seeded by the request's ``seed`` (the front ends always set one), so
tensor-parallel workers, which all run the processor on the same logits, choose alike. The engine core is a separate
process: the processors' counts (:class:`ProcessorCounts`) reach the front end as that dataclass's JSON, in the file
that ``LOGOS_VLLM_COUNTS`` names (set by the front end before the engine starts).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path

from logos.decoding.policy import PolicyCounts

ARGS_KEY = "logos"   # SamplingParams.extra_args[ARGS_KEY] (vllm_xargs in OpenAI requests)
COUNTS_ENV = "LOGOS_VLLM_COUNTS"  # the file the processors write their counts to (ProcessorCounts as JSON)

try:  # vLLM is optional: this module imports without it (the front end then refuses --engine vllm)
    from vllm.v1.sample.logits_processor import LogitsProcessor as _BaseV1
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as _BaseV2
except ImportError:  # pragma: no cover - exercised in the main venv
    _BaseV1 = _BaseV2 = object

__all__ = ["ARGS_KEY", "COUNTS_ENV", "LogosLogitsProcessor", "LogosLogitsProcessorV1", "ProcessorCounts", "RequestRow",
           "logos_args", "request_args", "request_xargs", "shared_row_constraint"]


def request_args(task, prompt, closing_slack: int = 8, closing_only: bool = False) -> dict:
    """``extra_args["logos"]`` of a request: what the logits processor needs to build its row constraint
    (``closing_only``: none, only the built-in engine's unconstrained rule: the stop token wherever it may be written
    within ``closing_slack`` tokens of the budget)."""
    args = {"task": task.name, "prompt": prompt.text, "slack": closing_slack}
    if prompt.choices:  # what the model may choose (a crystal's header), read by the row constraint
        args["choices"] = prompt.choices
    return {**args, "closing_only": True} if closing_only else args


def request_xargs(task, prompt, closing_slack: int = 8) -> dict:
    """The same, flat, for an OpenAI request's ``vllm_xargs`` (whose values must be scalars): ``logos_task``, ..."""
    return {f"{ARGS_KEY}_{k}": v for k, v in request_args(task, prompt, closing_slack).items() if v is not None}


def logos_args(sampling_params) -> dict | None:
    """``extra_args["logos"]`` of a request, or its flat form (``logos_prompt``, ... from ``vllm_xargs``)."""
    extra = sampling_params.extra_args or {}
    if ARGS_KEY in extra:
        return extra[ARGS_KEY]
    flat = {k[len(ARGS_KEY) + 1:]: v for k, v in extra.items() if k.startswith(ARGS_KEY + "_")}
    return flat or None


def shared_row_constraint(task, table, prompt_text: str, choices: str = ""):
    """The row constraint both engines use (the task's own, :mod:`logos.decoding.rows`), one object per request."""
    return None if task.rows is None else task.rows(table, [prompt_text], [choices])[0]


@dataclass
class ProcessorCounts:
    """What an engine's processors did: their rows' policies' counts, the requests they took, their seconds."""

    policy: PolicyCounts = field(default_factory=PolicyCounts)
    requests: int = 0
    seconds: float = 0.0

    def minus(self, other: "ProcessorCounts") -> "ProcessorCounts":
        return ProcessorCounts(self.policy.minus(other.policy), self.requests - other.requests,
                               self.seconds - other.seconds)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "ProcessorCounts":
        data = json.loads(text)
        return cls(PolicyCounts(**data["policy"]), int(data["requests"]), float(data["seconds"]))

    @classmethod
    def read(cls, path: str | Path | None) -> "ProcessorCounts":
        """The counts last written to ``path`` (none yet, or no file: zeros)."""
        try:
            return cls.from_json(Path(path).read_text()) if path else cls()
        except (OSError, ValueError, KeyError, TypeError):
            return cls()

    def write(self, path: str | Path) -> None:
        tmp = f"{path}.{os.getpid()}.tmp"  # one per worker (tensor-parallel ranks write alike)
        with open(tmp, "w") as fh:
            fh.write(self.to_json())
        os.replace(tmp, path)


class RequestRow:
    """One request's row policy behind the processor: the tokens vLLM wrote go to the policy (:meth:`feed`), and the
    logits keep only the token the policy decides (:meth:`restrict`). ``params``: the request's sampling parameters
    (temperature, top-k, top-p, seed); ``counts``: the processor's."""

    def __init__(self, constraint, stop_id: int, max_tokens: int, slack: int, params=None,
                 closing_only: bool = False, counts: PolicyCounts | None = None):
        import torch

        from logos.decoding.policy import RowPolicy, Sampling, Uniforms

        self.sampling = Sampling(temperature=float(getattr(params, "temperature", 1.0) or 0.0),
                                 top_k=max(int(getattr(params, "top_k", 0) or 0), 0),
                                 top_p=float(getattr(params, "top_p", 1.0) or 1.0),
                                 max_new_tokens=max_tokens, closing_slack=slack, row_work=0)
        seed = getattr(params, "seed", None)
        generator = torch.Generator()
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        self.policy = RowPolicy(None if closing_only else constraint, stop_id, self.sampling, Uniforms(generator),
                                counts)
        self.closing_only = closing_only  # an unconstrained request: only the stop near the budget
        self.consumed = 0     # output tokens fed so far
        self.dead = False     # nothing acceptable was found: left to the grammar, resampled by the front end
        self.chosen: int | None = None  # the token the policy decided last

    @classmethod
    def build(cls, args: dict, table, stop_id: int, max_tokens: int, params=None,
              counts: PolicyCounts | None = None) -> "RequestRow | None":
        from logos.tasks import TASKS

        task = TASKS.get(str(args.get("task")))
        if task is None:
            return None
        slack = int(args.get("slack", 8))
        if args.get("closing_only"):
            return cls(None, stop_id, max_tokens, slack, params, closing_only=True, counts=counts)
        return cls(shared_row_constraint(task, table, args["prompt"], str(args.get("choices") or "")), stop_id,
                   max_tokens, slack, params, counts=counts)

    @property
    def remaining(self) -> int:
        return self.policy.remaining

    def feed(self, token: int) -> None:
        """The policy writes a token vLLM wrote (checked first unless it is the one the policy decided)."""
        if not self.dead:
            if token != self.chosen and not self.closing_only and not self.policy.check(token):
                self.dead = True  # not the token the policy decided (cannot happen unless vLLM overrides it)
            else:
                self.policy.commit(token)
        self.chosen = None
        self.consumed += 1

    def restrict(self, logits) -> None:
        """Leave only the policy's token in ``logits`` [V] (grammar-masked, unscaled), so vLLM's sampler takes it."""
        import torch

        from logos.decoding.policy import END, distributions

        policy = self.policy
        if self.closing_only:  # vLLM samples; within the slack the stop token, as the built-in engine
            if policy.remaining <= policy.slack and bool(torch.isfinite(logits[policy.stop_id])):
                _only(logits, policy.stop_id)
            return
        if self.dead:
            return
        s = self.sampling
        dist = distributions(logits[None].float() / s.divisor, s.top_k, s.top_p)[0]
        token = policy.conclude(policy.decide(dist))
        if token == END:  # (a row here never waits or takes a token back)
            self.dead = True
            return
        self.chosen = token
        _only(logits, token)


def _only(logits, token: int) -> None:
    keep = logits[token].clone()
    logits.fill_(float("-inf"))
    logits[token] = keep


class _Rows:
    """What both processor interfaces share: the token table, one :class:`RequestRow` per request, the counts."""

    def _setup(self, vllm_config, vocab_size: int) -> None:
        from transformers import AutoTokenizer

        from logos.decoding.constraints import TokenTable

        tok = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer, trust_remote_code=False)
        self.table = TokenTable(tok, vocab_size)
        self.eos_id = tok.eos_token_id
        self.rows: dict[int, RequestRow] = {}
        self.counts = ProcessorCounts()
        self._counts_path = os.environ.get(COUNTS_ENV)
        self._written: tuple = ()  # the counts last written

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        args = logos_args(sampling_params)
        if args is None:
            return
        if not isinstance(args, dict) or not isinstance(args.get("prompt"), str):
            raise ValueError(f'extra_args["{ARGS_KEY}"] must be an object with the prompt text')
        from logos.tasks import get

        get(str(args.get("task")), "generate")  # an unknown task: InputError, a ValueError (vLLM answers 400)

    def _add(self, index: int, sampling_params) -> bool:
        self.rows.pop(index, None)
        args = logos_args(sampling_params)
        if not args:
            return False
        stop_ids = list(sampling_params.stop_token_ids or [])
        row = RequestRow.build(args, self.table, stop_ids[0] if stop_ids else self.eos_id,
                               sampling_params.max_tokens or 256, sampling_params, self.counts.policy)
        if row is None:
            return False
        self.rows[index] = row
        self.counts.requests += 1
        return True

    def _dump(self) -> None:
        """Write the counts after a step that changed them (so a run's last step is in the file when it ends)."""
        counts = (astuple(self.counts.policy), self.counts.requests)
        if self._counts_path and counts != self._written:
            self._written = counts
            try:
                self.counts.write(self._counts_path)
            except OSError:  # counts are a report: never a reason to stop the engine
                pass


class LogosLogitsProcessorV1(_Rows, _BaseV1):
    """The LOGOS row policies as a vLLM logits processor, V1 model runner interface (vLLM on CPU).

    Requests opt in through ``extra_args["logos"]`` (:func:`request_args`); others pass untouched.
    """

    def __init__(self, vllm_config, device, is_pin_memory):
        self._setup(vllm_config, vllm_config.model_config.get_vocab_size())
        self.outputs: dict[int, list[int]] = {}  # batch index -> the request's live output token list

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update) -> None:
        if batch_update is None:
            return
        for index in batch_update.removed:
            self.rows.pop(index, None)
            self.outputs.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            if self._add(index, params):
                self.outputs[index] = output
            else:
                self.outputs.pop(index, None)
        for a, b, direction in batch_update.moved:
            ra, oa = self.rows.pop(a, None), self.outputs.pop(a, None)
            if direction.name == "SWAP":
                rb, ob = self.rows.pop(b, None), self.outputs.pop(b, None)
                if rb is not None:
                    self.rows[a], self.outputs[a] = rb, ob
            else:
                self.rows.pop(b, None)
                self.outputs.pop(b, None)
            if ra is not None:
                self.rows[b], self.outputs[b] = ra, oa

    def apply(self, logits):
        if not self.rows:
            return logits
        t = time.perf_counter()
        for index, row in self.rows.items():
            out = self.outputs[index]
            while row.consumed < len(out) and out[row.consumed] >= 0:
                row.feed(int(out[row.consumed]))
            row.restrict(logits[index])
        self.counts.seconds += time.perf_counter() - t
        self._dump()
        return logits


class LogosLogitsProcessor(_Rows, _BaseV2):
    """The LOGOS row policies as a vLLM logits processor, Model Runner V2 interface (vLLM's default on GPUs)."""

    def __init__(self, vllm_config, req_states):
        self._setup(vllm_config, req_states.vocab_size)
        self.req_states = req_states

    def add_request(self, req_idx: int, sampling_params) -> bool:
        return self._add(req_idx, sampling_params)

    def apply(self, logits, ctx):
        if not self.rows:
            return logits
        t = time.perf_counter()
        slots = ctx.expanded_idx_mapping.tolist()
        pos = ctx.pos.tolist()
        fed = ctx.input_ids.tolist()
        prompt_len = self.req_states.prompt_len.np
        for r, slot in enumerate(slots):
            row = self.rows.get(slot)
            if row is None:
                continue
            n_out = pos[r] + 1 - int(prompt_len[slot])  # output tokens written before this step
            if n_out < 0:
                continue  # a prefill chunk: nothing is sampled from it
            if n_out > row.consumed + 1:  # catching up (a resumed request): committed tokens first
                start = int(prompt_len[slot]) + row.consumed
                for tok in self.req_states.all_token_ids.gpu[slot, start:start + n_out - 1 - row.consumed].tolist():
                    row.feed(int(tok))
            if n_out == row.consumed + 1:
                row.feed(int(fed[r]))
            row.restrict(logits[r])
        self.counts.seconds += time.perf_counter() - t
        self._dump()
        return logits
