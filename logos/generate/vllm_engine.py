"""``logos generate --engine vllm``: the same tasks, files and guarantees, sampled by vLLM.

vLLM brings paged attention, continuous batching, tensor / data parallelism and multi-node
serving through Ray; this module carries the LOGOS constraints into it:

- **the grammar** goes through vLLM's structured outputs (llguidance backend): each request carries
  the shipped grammar, its task rules, its own rules (a copied sequence, a composition, a space
  group) and a start rule for what follows its prompt (:mod:`logos.tasks.continuation`);
- **the chemistry** of molecule spans (valence, rings, aromaticity, kekulization at the closing tag),
  **the crystal composition** and, with the shared row constraints, **the copied sequence** of a
  binding-site search go through :class:`LogosLogitsProcessor` (vLLM's Model Runner V2 interface,
  its default on GPUs) or :class:`LogosLogitsProcessorV1` (the V1 runner: vLLM on CPU), which build,
  per request, the row constraint the built-in engine uses (:func:`shared_row_constraint`:
  the task's row constraint from :mod:`logos.decoding.rows`)
  from the request's ``extra_args["logos"]`` (the task and its prompt text), driven by the thin
  adapter :class:`RowCheck`.

The logits processor runs after vLLM's grammar mask and before temperature and top-k / top-p. A
mask that holds every accepted token would need a check per grammar-allowed candidate (the
shipped model spreads its mass over ~50 of them: ~30 ms per row per step with today's checks), so
the processor samples constrained rows itself, exactly as the built-in engine does: it draws from
the row's grammar-masked distribution (the request's temperature, top-k and top-p, its seed),
checks the draw, redraws without a refused token (up to ``MAX_REDRAWS``; near the budget, after
a refused draw of the span's closing tag, or after ``WANDERING`` refused draws in one span, it
follows the row's planned ending; a row without one checks the ``MAX_SCAN`` likeliest candidates
and draws among the accepted ones), and leaves only the chosen token finite, so vLLM's sampler
takes it. The distribution is the model's restricted to accepted continuations, with the built-in
engine's ending rules; nothing is approximated, only the random stream differs (per request, not
per batch). Whole-record tasks (molecules) keep a finished sample with the model's probability of
the end of document after it, read from the rescoring prefill of that sample with the end appended
(temperature 1: at other temperatures this is where the engines differ), and draw it again
otherwise. A row with nothing acceptable left is a dead end: it is left to the grammar alone
and resampled by the front end. Every finished row is checked again in the front end (RDKit
parses each molecule span, the sites add up to the composition) and resampled when it fails;
first-try validity, resampled rows, candidates checked and redraws per row per step are reported.
Log-probabilities are the model's own (temperature 1, no mask): vLLM's sampled log-probabilities
are renormalized over the grammar's mask, so each sample is rescored by one prefill pass.

Unconstrained requests (``--unconstrained``) carry only the task mask and, through the same processor,
the built-in engine's budget rule: the stop token wherever it may be written within the last
``closing_slack`` tokens, so rows end within their budget in both engines.

Each request's draws use its own generator, seeded by the request's ``seed`` (the front ends always
set one), so tensor-parallel workers, which all run the processor on the same logits, choose alike.
The engine core is a separate process; the processor's counters reach the front end through a
small JSON file (``LOGOS_VLLM_STATS``).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ARGS_KEY = "logos"   # SamplingParams.extra_args[ARGS_KEY] (vllm_xargs in OpenAI requests)
STATS_ENV = "LOGOS_VLLM_STATS"

try:  # vLLM is optional: this module imports without it (the front end then refuses --engine vllm)
    from vllm.v1.sample.logits_processor import LogitsProcessor as _BaseV1
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as _BaseV2
except ImportError:  # pragma: no cover - exercised in the main venv
    _BaseV1 = _BaseV2 = object

__all__ = ["ARGS_KEY", "EngineOptions", "LogosLogitsProcessor", "LogosLogitsProcessorV1", "RowCheck", "close_llm",
           "generate_vllm", "make_llm", "request_args", "request_xargs", "sample_jobs", "shared_row_constraint"]


# ----------------------------------------------------------------------------------------------- engine side
def request_args(task, prompt, closing_slack: int = 8, closing_only: bool = False) -> dict:
    """``extra_args["logos"]`` of a request: what the logits processor needs to build its row constraint
    (``closing_only``: none, only the built-in engine's unconstrained rule: the stop token wherever it may be written
    within ``closing_slack`` tokens of the budget)."""
    args = {"task": task.name, "prompt": prompt.text, "slack": closing_slack}
    if prompt.choices:  # what the model may choose (a crystal's header), read by the row constraint
        args["choices"] = prompt.choices
    return {**args, "closing_only": True} if closing_only else args


def shared_row_constraint(task, table, prompt_text: str, choices: str = ""):
    """The row constraint both engines use (the task's own, :mod:`logos.decoding.rows`), one object per request."""
    return None if task.rows is None else task.rows(table, [prompt_text], [choices])[0]


def request_xargs(task, prompt, closing_slack: int = 8) -> dict:
    """The same, flat, for an OpenAI request's ``vllm_xargs`` (whose values must be scalars): ``logos_task``, ..."""
    return {f"{ARGS_KEY}_{k}": v for k, v in request_args(task, prompt, closing_slack).items() if v is not None}


def _logos_args(sampling_params) -> dict | None:
    """``extra_args["logos"]``, or its flat form (``logos_prompt``, ... from ``vllm_xargs``)."""
    extra = sampling_params.extra_args or {}
    if ARGS_KEY in extra:
        return extra[ARGS_KEY]
    flat = {k[len(ARGS_KEY) + 1:]: v for k, v in extra.items() if k.startswith(ARGS_KEY + "_")}
    return flat or None


class RowCheck:
    """A shared row constraint (:func:`shared_row_constraint`) driven per request by the logits processor.

    The adapter is the only place that knows the row-constraint interface, so the shared constraint
    code can change behind it. It also holds the request's own random generator and sampling
    settings: the processor draws the row's token itself (see the module docstring).
    """

    def __init__(self, constraint, stop_id: int, max_tokens: int, slack: int, params=None, closing_only: bool = False):
        import torch

        self.constraint, self.stop_id, self.max_tokens, self.slack = constraint, stop_id, max_tokens, slack
        self.closing_only = closing_only  # an unconstrained request: only the stop near the budget
        self.consumed = 0     # output tokens fed so far
        self.dead = False     # nothing acceptable was found: left to the grammar, resampled by the front end
        self.chosen = None    # the token this processor chose last
        self.ending_now = False  # following the planned ending (as the built-in engine: see its WANDERING)
        self.refused = 0      # draws refused in the open span
        self._last = None     # the token checked last (its checked state is the one ``advance`` takes)
        self.temperature = float(getattr(params, "temperature", 1.0) or 0.0)
        self.top_k = int(getattr(params, "top_k", 0) or 0)
        self.top_p = float(getattr(params, "top_p", 1.0) or 1.0)
        seed = getattr(params, "seed", None)
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(int(seed))

    @classmethod
    def build(cls, args: dict, table, stop_id: int, max_tokens: int, params=None) -> "RowCheck | None":
        from logos.tasks import TASKS

        task = TASKS.get(str(args.get("task")))
        slack = int(args.get("slack", 8))
        if task is None:
            return None
        if args.get("closing_only"):
            from logos.decoding.rows import RowConstraint

            return cls(RowConstraint(), stop_id, max_tokens, slack, params, closing_only=True)
        row = shared_row_constraint(task, table, args["prompt"], str(args.get("choices") or ""))
        return None if row is None else cls(row, stop_id, max_tokens, slack, params)

    @property
    def remaining(self) -> int:
        return self.max_tokens - self.consumed

    def feed(self, token: int) -> None:
        """Advance by a token the row wrote (checked first unless it is the one just chosen: ``check`` prepares
        the state ``advance`` takes)."""
        if not self.dead and not self.closing_only:
            chosen, self.chosen = self.chosen, None
            if token != chosen and not self.constraint.check(token, self.remaining):
                self.dead = True  # not the token this processor chose (cannot happen unless vLLM overrides it)
            if self.constraint.closes(token):
                self.ending_now, self.refused = False, 0
            self.constraint.advance(token)
        self.consumed += 1

    def _check(self, token: int, remaining: int) -> bool:
        self._last = token
        return self.constraint.check(token, remaining)

    def _distribution(self, logits):
        """The row's sampling distribution over the grammar-allowed tokens: temperature, then top-k / top-p."""
        import torch

        from logos.decoding.sampler import _filter

        scaled = logits.float().cpu() / max(self.temperature, 1e-6)
        return torch.softmax(_filter(scaled[None], self.top_k, self.top_p)[0], -1), scaled

    def _possible(self, n: int):
        """bool [n]: the tokens the row's constraint does not surely refuse (its ``possible()``), None if it cannot
        tell."""
        import torch

        possible = self.constraint.possible()
        if possible is None:
            return None
        keep = torch.zeros(n, dtype=torch.bool)
        m = min(n, len(possible))
        keep[:m] = torch.from_numpy(possible[:m])
        return keep

    def _planned(self, allowed, stats: dict) -> int | None:
        plan = self.constraint.ending(self.remaining)
        if plan and bool(torch_isfinite(allowed[plan[0]])):
            stats["checks"] += 1
            if self._check(plan[0], self.remaining):
                return plan[0]
        return None

    def choose(self, logits, stats: dict) -> int | None:
        """The row's next token, drawn and checked as the built-in engine does (None: a dead end)."""
        from logos.decoding.sampler import WANDERING

        before = stats["redraws"]
        token = self._choose(logits, stats)
        refused = stats["redraws"] - before
        stats["closed_by_plan"] += self.refused < WANDERING <= self.refused + refused
        self.refused += refused
        if self.refused >= WANDERING and token is not None and not self.constraint.closes(token):
            self.ending_now = True  # from the next step: the row has left what the model knows
        return token

    def _choose(self, logits, stats: dict) -> int | None:
        import torch

        from logos.decoding.sampler import MAX_REDRAWS, MAX_SCAN

        c, remaining = self.constraint, self.remaining
        stats["row_steps"] += 1
        if self.ending_now or c.must_close(remaining):  # near the budget, or wandering: the planned ending
            token = self._planned(logits, stats)
            if token is not None:
                return token
            self.ending_now = False
        if remaining <= self.slack and bool(torch.isfinite(logits[self.stop_id])):  # close where able
            stats["checks"] += 1
            if self._check(self.stop_id, remaining):
                return self.stop_id
        probs, allowed = self._distribution(logits)
        greedy = self.temperature < 1e-5
        refused: set[int] = set()
        for _ in range(MAX_REDRAWS + 1):
            if float(probs.sum()) <= 0:
                break
            token = int(probs.argmax()) if greedy else int(torch.multinomial(probs, 1, generator=self.generator))
            stats["checks"] += 1
            if self._check(token, remaining):
                return token
            if not refused and c.closes(token) and c.failure is None:  # the model would end the span here
                planned = self._planned(allowed, stats)
                if planned is not None:
                    self.ending_now = True
                    stats["closed_by_plan"] += 1
                    return planned
            if not refused:  # the first refusal: drop every token the row surely refuses (as the built-in engine)
                keep = self._possible(probs.shape[0])
                if keep is not None:
                    probs, allowed = probs.masked_fill(~keep, 0.0), allowed.masked_fill(~keep, float("-inf"))
            refused.add(token)
            stats["redraws"] += 1
            probs[token] = 0.0
        self.ending_now = True  # redraws refused: the planned ending (now and on), else the likeliest candidates
        planned = self._planned(allowed, stats)
        if planned is not None:
            return planned
        finite = int(torch.isfinite(allowed).sum())
        if finite:  # then the likeliest grammar-allowed candidates: a draw among those accepted
            top = torch.topk(allowed, min(MAX_SCAN, finite))
            ok = []
            for k, token in enumerate(top.indices.tolist()):
                if token not in refused:
                    stats["checks"] += 1
                    if self._check(token, remaining):
                        ok.append(k)
            if ok:
                if greedy:
                    return int(top.indices[ok[0]])
                weights = torch.softmax(top.values[ok], -1)
                return int(top.indices[ok][int(torch.multinomial(weights, 1, generator=self.generator))])
        return None

    def restrict(self, logits, stats: dict) -> None:
        """Leave only the chosen token in ``logits`` [V] (grammar-masked, unscaled), so vLLM's sampler takes it."""
        if self.closing_only:  # vLLM samples; within the slack the stop token, as the built-in engine
            if self.remaining <= self.slack and bool(torch_isfinite(logits[self.stop_id])):
                keep = logits[self.stop_id].clone()
                logits.fill_(float("-inf"))
                logits[self.stop_id] = keep
            return
        if self.dead:
            return
        token = self.choose(logits, stats)
        if token is None:
            self.dead = True
            stats["dead_ends"] += 1
            return
        if token != self._last:  # the state ``advance`` takes is the last one checked: check the choice again
            self._check(token, self.remaining)
        self.chosen = token
        keep = logits[token].clone()
        logits.fill_(float("-inf"))
        logits[token] = keep


def torch_isfinite(x) -> bool:
    import torch

    return bool(torch.isfinite(x))


class _Rows:
    """What both processor interfaces share: the token table, one :class:`RowCheck` per request, the counters."""

    def _setup(self, vllm_config, vocab_size: int) -> None:
        from transformers import AutoTokenizer

        from logos.decoding.constraints import TokenTable

        tok = AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer, trust_remote_code=False)
        self.table = TokenTable(tok, vocab_size)
        self.eos_id = tok.eos_token_id
        self.rows: dict[int, RowCheck] = {}
        self.stats = {"checks": 0, "redraws": 0, "row_steps": 0, "dead_ends": 0, "seconds": 0.0, "requests": 0,
                      "closed_by_plan": 0}
        self._stats_path = os.environ.get(STATS_ENV)
        self._written: tuple = ()  # the counters last written

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        args = _logos_args(sampling_params)
        if args is None:
            return
        if not isinstance(args, dict) or not isinstance(args.get("prompt"), str):
            raise ValueError(f'extra_args["{ARGS_KEY}"] must be an object with the prompt text')
        from logos.tasks import get

        get(str(args.get("task")), "generate")  # an unknown task: InputError, a ValueError (vLLM answers 400)

    def _add(self, index: int, sampling_params) -> bool:
        self.rows.pop(index, None)
        args = _logos_args(sampling_params)
        if not args:
            return False
        stop_ids = list(sampling_params.stop_token_ids or [])
        row = RowCheck.build(args, self.table, stop_ids[0] if stop_ids else self.eos_id,
                             sampling_params.max_tokens or 256, sampling_params)
        if row is None:
            return False
        self.rows[index] = row
        self.stats["requests"] += 1
        return True

    def _dump(self) -> None:
        """Write the counters after a step that changed them (so a run's last step is in the file when it ends)."""
        counts = tuple(v for k, v in self.stats.items() if k != "seconds")
        if self._stats_path and counts != self._written:
            self._written = counts
            tmp = f"{self._stats_path}.{os.getpid()}.tmp"  # one per worker (tensor parallel ranks write alike)
            try:
                with open(tmp, "w") as fh:
                    json.dump(self.stats, fh)
                os.replace(tmp, self._stats_path)
            except OSError:  # counters are a report: never a reason to stop the engine
                pass


class LogosLogitsProcessorV1(_Rows, _BaseV1):
    """The LOGOS row constraints as a vLLM logits processor, V1 model runner interface (vLLM on CPU).

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
            row.restrict(logits[index], self.stats)
        self.stats["seconds"] += time.perf_counter() - t
        self._dump()
        return logits


class LogosLogitsProcessor(_Rows, _BaseV2):
    """The LOGOS row constraints as a vLLM logits processor, Model Runner V2 interface (vLLM's default on GPUs)."""

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
            row.restrict(logits[r], self.stats)
        self.stats["seconds"] += time.perf_counter() - t
        self._dump()
        return logits


def processor_class(cpu: bool | None = None):
    """The processor for the model runner vLLM will use: V1 on CPU (V2 needs Triton's CPU backend), else V2
    unless ``VLLM_USE_V2_MODEL_RUNNER=0``; the variable is set so vLLM makes the same choice."""
    cpu = _on_cpu() if cpu is None else cpu
    v2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "0" if cpu else "1") not in ("0", "false", "False")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if v2 else "0"
    return LogosLogitsProcessor if v2 else LogosLogitsProcessorV1


# ---------------------------------------------------------------------------------------------- front end
@dataclass(frozen=True)
class EngineOptions:
    """vLLM's own knobs: parallelism (one process on CPU), a Ray cluster, memory and length limits."""

    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    ray_address: str | None = None   # a Ray cluster for multi-node (sets RAY_ADDRESS, executor "ray")
    max_model_len: int | None = None
    max_num_seqs: int = 128
    gpu_memory_utilization: float = 0.85
    kv_cache_gib: int = 1            # CPU only: VLLM_CPU_KVCACHE_SPACE
    enforce_eager: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # any other vllm.LLM keyword


def _on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()
    except Exception:  # pragma: no cover
        return True


def engine_environment(engine: EngineOptions) -> None:
    """Environment vLLM reads at start: the CPU KV cache size, a Ray cluster's address."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(engine.kv_cache_gib))
    if engine.ray_address:
        os.environ["RAY_ADDRESS"] = engine.ray_address


def llm_kwargs(checkpoint: Path, engine: EngineOptions, seed: int, max_len: int) -> dict:
    """Keyword arguments of ``vllm.LLM`` (and, as flags, of the OpenAI server) for a LOGOS checkpoint."""
    cpu = _on_cpu()
    kw: dict[str, Any] = dict(
        model=str(checkpoint), tokenizer=str(checkpoint), trust_remote_code=False, seed=seed,
        dtype="float32" if cpu else "auto", max_model_len=engine.max_model_len or max_len,
        enforce_eager=engine.enforce_eager if engine.enforce_eager is not None else cpu,
        tensor_parallel_size=engine.tensor_parallel_size, data_parallel_size=engine.data_parallel_size,
        max_num_seqs=engine.max_num_seqs, logits_processors=[processor_class(cpu)],
        structured_outputs_config={"backend": "guidance"}, logprobs_mode="raw_logprobs",
    )
    if not cpu:
        kw["gpu_memory_utilization"] = engine.gpu_memory_utilization
    if engine.ray_address or engine.tensor_parallel_size * engine.data_parallel_size > 1 and not cpu:
        kw["distributed_executor_backend"] = "ray" if engine.ray_address else "mp"
    kw.update(engine.extra)
    return kw


def make_llm(checkpoint: Path, engine: EngineOptions, seed: int = 0, max_len: int = 512):
    """A ``vllm.LLM`` over ``checkpoint`` with the LOGOS logits processor and the llguidance backend."""
    try:
        import vllm
    except ImportError:
        from logos.util.records import InputError

        raise InputError("--engine vllm needs vLLM (make venv-vllm: its own venv; see the README)") from None
    engine_environment(engine)
    if not os.environ.get(STATS_ENV):  # the logits processor's counters, read back by generate_vllm
        import tempfile

        os.environ[STATS_ENV] = os.path.join(tempfile.mkdtemp(prefix="logos-vllm-"), "stats.json")
    return vllm.LLM(**llm_kwargs(checkpoint, engine, seed, max_len))


def close_llm(llm) -> None:
    """Stop the engine core (and its workers) of a :func:`make_llm` now, not at interpreter exit."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()


def _valid(task, prompt_text: str, text: str, table) -> str | None:
    """Why a finished sample breaks a guarantee (None: it holds): RDKit refuses a span, the sites miss the
    composition, or a reader refuses the crystal."""
    from rdkit import Chem

    from logos.science.chemistry import molecules_in_text
    from logos.util.records import RecordError

    if task.chemistry:
        try:
            spans = molecules_in_text(text)
        except RecordError as e:
            return str(e)
        for s in spans:
            if Chem.MolFromSmiles(s) is None:
                return "kekulize"
    if task.composition:
        from logos.decoding.composition import CompositionRows

        rows = CompositionRows(table, [prompt_text])
        if rows.targets[0] is None and prompt_text.endswith("<CrystalS>"):  # unconditional: the model's own header
            rows = CompositionRows(table, [prompt_text + text])
        if not rows.feasible(0, text, final=True):
            return "composition"
        from logos.decoding.crystal_check import crystal_problem

        problem = crystal_problem(text) if text.endswith("<CrystalE>") else None
        if problem is not None:
            return f"crystal: {problem}"
    return None


def _seed(base: int, index: int, attempt: int) -> int:
    return (base * 1_000_003 + index * 7919 + attempt * 104_729) % (2**31 - 1)


class Checkpoint:
    """What the front end needs of a checkpoint: its tokenizer, token table, run info and document start."""

    def __init__(self, path: Path):
        from transformers import AutoTokenizer

        from logos.train.export import load_run_info
        from logos.decoding.constraints import TokenTable
        from logos.generate.pipeline import SUPPORTED_GRAMMARS, document_start
        from logos.util.records import InputError

        self.path = Path(path)
        if not (self.path / "config.json").exists():
            raise InputError(f"{self.path} is not a checkpoint directory (no config.json)")
        self.info = load_run_info(self.path)
        if self.info.get("grammar", "v1") not in SUPPORTED_GRAMMARS:
            raise InputError(f"{self.path} was trained on grammar {self.info.get('grammar')}; this logos reads "
                             f"{', '.join(SUPPORTED_GRAMMARS)}")
        self.tok = AutoTokenizer.from_pretrained(str(self.path), trust_remote_code=False)
        vocab_rows = json.loads((self.path / "config.json").read_text()).get("vocab_size", len(self.tok))
        self.table = TokenTable(self.tok, vocab_rows)
        self.doc_start = document_start(self.info, self.tok)

    def jobs(self, task, prompts, budget: int, constrained: bool = True) -> list[tuple[Any, list[int], int]]:
        """(prompt, token ids, max new tokens) per sample, ``k`` copies of each (prompt, k) pair; without a
        ``budget``, the task's default or what the row constraint says the prompt needs."""
        from logos.generate.pipeline import length_budget

        out = []
        for p, k in prompts:
            ids = [self.doc_start] + self.tok(p.text, add_special_tokens=False)["input_ids"]
            row = shared_row_constraint(task, self.table, p.text, p.choices) if constrained and not budget else None
            row_budget = length_budget(task, [p.text], [row], budget)
            out += [(p, ids, row_budget)] * k
        return out

    def scorer(self, run):
        """:func:`logos.generate.pipeline.scorer` through ``run`` (one prefill per pair)."""
        def score(pairs: list[tuple[str, str]]) -> list[float]:
            heads = [self.tok(prefix, add_special_tokens=False)["input_ids"] for prefix, _ in pairs]
            full = [self.tok(prefix + rest, add_special_tokens=False)["input_ids"] for prefix, rest in pairs]
            scored = _token_logprobs(run, [([self.doc_start] + h, f[len(h):]) for h, f in zip(heads, full)])
            return [sum(x for x in lps if x is not None) for lps in scored]
        return score


@dataclass
class SampleRun:
    samples: list = field(default_factory=list)
    finals: list = field(default_factory=list)   # (prompt ids, output ids) per sample
    tokens: int = 0
    resampled: int = 0
    first_try_valid: int = 0
    not_whole: int = 0   # finished molecules drawn again: the model would not end the record after them
    scored: set = field(default_factory=set)    # id() of samples whose model log-probability is already known
    seconds: float = 0.0


def sample_jobs(run, ck: Checkpoint, task, jobs, options, progress: bool = False) -> SampleRun:
    """Sample every job through ``run(requests, params) -> [RequestOutput]`` (an ``LLM.generate`` or the
    server's engine client), check each finished row again and resample failures up to ``options.resamples``."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from logos.tasks.continuation import continuation_grammar
    from logos.generate.pipeline import sample_of

    s = options.sampling
    stop_id = ck.tok.eos_token_id if task.stop == "eos" else ck.table.id[task.stop]
    allowed = None
    if not options.constrained:  # the task mask stays, as in the built-in engine: no symbol the task never writes
        banned = ck.table.banned(set(task.symbols), keep={stop_id})
        allowed = (~banned[: ck.table.size]).nonzero().flatten().tolist()
    grammars: dict[int, str] = {}
    res = SampleRun()
    whole = task.whole_document and stop_id != ck.tok.eos_token_id and options.whole_draws > 0
    # (job, resamples, whole-record draws, the last finished draw the model would not end the record after)
    queue: list[tuple[int, int, int, Any]] = [(i, 0, 0, None) for i in range(len(jobs))]
    t = time.perf_counter()
    while queue:
        requests, params = [], []
        for i, attempt, draws, _kept in queue:
            p, ids, row_budget = jobs[i]
            so = None
            if options.constrained:
                if id(p) not in grammars:
                    grammars[id(p)] = continuation_grammar(task, p)
                so = StructuredOutputsParams(grammar=grammars[id(p)])
            params.append(SamplingParams(
                n=1, temperature=s.temperature, top_k=s.top_k or 0, top_p=s.top_p, max_tokens=row_budget,
                seed=_seed(options.seed, i, attempt + 1009 * draws), stop_token_ids=[stop_id], logprobs=0,
                skip_special_tokens=False, detokenize=False, structured_outputs=so, allowed_token_ids=allowed,
                extra_args={ARGS_KEY: request_args(task, p, s.closing_slack, closing_only=not options.constrained)}))
            requests.append({"prompt_token_ids": ids})
        retry, finished = [], []
        for (i, attempt, draws, kept), o in zip(queue, run(requests, params)):
            p = jobs[i][0]
            c = o.outputs[0]
            toks = list(c.token_ids)
            res.tokens += len(toks)
            logprob = sum(float(lp[x].logprob) for lp, x in zip(c.logprobs or [], toks) if lp and x in lp)
            done = bool(toks) and toks[-1] == stop_id
            body = toks[:-1] if task.stop == "eos" and done else toks
            text = p.text + ck.tok.decode(body, skip_special_tokens=False)
            status = "done" if done else "budget"
            if done and options.constrained:
                status = _valid(task, p.text, text, ck.table) or "done"
            res.first_try_valid += status == "done" and attempt == 0 and draws == 0
            if status != "done" and attempt < options.resamples:
                retry.append((i, attempt + 1, draws, kept))
                res.resampled += 1
                continue
            if status != "done" and kept is not None:  # a redraw that failed: the finished sample it replaced
                res.samples.append(kept[0])
                res.finals.append(kept[1])
                continue
            finished.append(((i, attempt, draws), sample_of(task, p, text, logprob, status), (jobs[i][1], toks)))
        if whole:  # rejection sampling of whole records, as the built-in engine: keep with P(end of document)
            ends = end_probabilities(run, [f[2] for f in finished if f[1].status == "done"], ck.tok.eos_token_id)
            for (i, attempt, draws), sample, final in finished:
                if sample.status == "done":
                    sample.logprob, p_end = next(ends)  # scored: the final rescoring skips it
                    res.scored.add(id(sample))
                    u = random.Random(_seed(options.seed, i, 7 + draws)).random()
                    if u >= p_end and draws < options.whole_draws:
                        retry.append((i, attempt, draws + 1, (sample, final)))
                        res.not_whole += 1
                        continue
                res.samples.append(sample)
                res.finals.append(final)
        else:
            for _, sample, final in finished:
                res.samples.append(sample)
                res.finals.append(final)
        queue = retry
    res.seconds = time.perf_counter() - t
    if options.constrained:  # vLLM's sampled log-probabilities are renormalized over the grammar's mask:
        rescore(run, res.samples, res.finals, res.scored)  # score with the model's own, as the built-in engine
    return res


def generate_vllm(checkpoint: Path, out: Path, options, inputs: Path | None = None, progress: bool | None = None,
                  engine: EngineOptions | None = None, llm=None):
    """``logos generate`` through vLLM: same prompts, files, samples JSONL, ranking and exit status as
    :func:`logos.generate.pipeline.generate` (``options`` is its :class:`GenerateOptions`); ``llm``: a
    :func:`make_llm` to reuse (its checkpoint must be ``checkpoint``)."""
    from logos.domains import writer_for
    from logos.decoding.sampler import StepStats
    from logos.generate.pipeline import GenerateResult, finish, no_usable_input
    from logos.tasks import get
    from logos.tasks.prompts import build_prompts, choose_alternatives
    from logos.util.records import ErrorLog, InputError, errors_path_for

    start = time.perf_counter()
    task = get(options.task, "generate")
    out = Path(out)
    ck = Checkpoint(checkpoint)
    writer_cls = writer_for(out)
    if options.device not in ("cpu", "auto") and not options.device.startswith("cuda"):
        raise InputError(f"--engine vllm runs on cpu or cuda, not {options.device}")
    errors = ErrorLog(errors_path_for(out), echo=lambda line: None)
    prompts = build_prompts(task, Path(inputs) if inputs else None, options.n, errors, options.prompts,
                            limits=options.limits)
    if not prompts:
        errors.close()
        raise InputError(no_usable_input(errors))
    jobs = ck.jobs(task, prompts, options.sampling.max_new_tokens, options.constrained)
    own = llm is None
    if own:
        llm = make_llm(ck.path, engine or EngineOptions(), options.seed, max(len(i) + b for _, i, b in jobs) + 8)
    stats_path = Path(os.environ.get(STATS_ENV, "/nonexistent"))
    before = _read_stats(stats_path)
    try:
        def run(reqs, params):
            return llm.generate(reqs, params, use_tqdm=bool(progress))
        if any(p.alternatives for p, _ in prompts):  # the model chooses a crystal's cell first, as the built-in engine
            prompts = choose_alternatives(prompts, ck.scorer(run), options.seed)
            jobs = ck.jobs(task, prompts, options.sampling.max_new_tokens, options.constrained)
        res = sample_jobs(run, ck, task, jobs, options)
        after = _read_stats(stats_path)
    finally:
        if own:
            close_llm(llm)
    ranked = finish(task, res.samples, out, writer_cls, options.writer, errors)
    errors.close()
    proc = {k: after.get(k, 0) - before.get(k, 0)
            for k in ("checks", "redraws", "row_steps", "dead_ends", "seconds", "closed_by_plan")}
    result = GenerateResult(ranked, errors.count - sum(not x.written for x in ranked), time.perf_counter() - start,
                            res.tokens, int(proc["redraws"]), res.resampled,
                            StepStats(steps=int(proc["row_steps"]), check_seconds=float(proc["seconds"]),
                                      closed_by_plan=int(proc["closed_by_plan"])), res.not_whole)
    result.engine = {"engine": "vllm", "first_try_valid": res.first_try_valid, "rows": len(jobs),
                     "sample_seconds": res.seconds, **proc}
    return result


def _token_logprobs(run, pairs) -> list[list[float | None]]:
    """The model's log-probability (temperature 1, no mask) of each continuation token, per (prompt ids, continuation
    ids), from one prefill of both (None where vLLM returned none)."""
    from vllm import SamplingParams

    if not pairs:
        return []
    requests = [{"prompt_token_ids": ids + toks} for ids, toks in pairs]
    params = [SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False)] * len(requests)
    out = []
    for (ids, toks), o in zip(pairs, run(requests, params)):
        lps, full = o.prompt_logprobs or [], ids + toks
        out.append([float(lps[j][full[j]].logprob) if j < len(lps) and lps[j] and full[j] in lps[j] else None
                    for j in range(len(ids), len(full))])
    return out


def rescore(run, samples, finals, scored: set = frozenset()) -> None:
    """Each sample's summed model log-probability (temperature 1, no mask) from one prefill of prompt + output
    (except samples whose ``id()`` is in ``scored``)."""
    todo = [(sample, (ids, toks)) for sample, (ids, toks) in zip(samples, finals) if toks and id(sample) not in scored]
    for (sample, _), scores in zip(todo, _token_logprobs(run, [pair for _, pair in todo])):
        sample.logprob = sum(x for x in scores if x is not None)


def end_probabilities(run, finals, eos_id: int):
    """(the output's summed model log-probability, the model's probability of the end of document after it) per
    (prompt ids, output ids), temperature 1, from one prefill of prompt + output + end: an iterator, in order."""
    scored = _token_logprobs(run, [(ids, toks + [eos_id]) for ids, toks in finals])
    return iter((sum(x for x in scores[:-1] if x is not None), math.exp(scores[-1]) if scores[-1] is not None else 0.0)
                for scores in scored)


def _read_stats(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def engine_summary(result) -> str:
    """The vLLM-specific line of a run: first-try validity, resampled rows and the processor's cost."""
    e = getattr(result, "engine", None) or {}
    rows, steps = max(e.get("rows", 0), 1), max(e.get("row_steps", 0), 1)
    return (f"vllm: {e.get('first_try_valid', 0)}/{e.get('rows', 0)} valid before resampling "
            f"({e.get('first_try_valid', 0) / rows:.1%}), {result.resampled} rows resampled; logits processor "
            f"{1e6 * e.get('seconds', 0.0) / steps:.0f} us per row per step, {e.get('checks', 0) / steps:.1f} "
            f"candidates checked per row per step, {e.get('dead_ends', 0)} dead ends")


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: logos generate --engine vllm")
