"""``logos generate --engine vllm``: the same tasks, files and guarantees, sampled by vLLM (the front end).

vLLM brings paged attention, continuous batching, tensor / data parallelism and multi-node
serving through Ray; this module carries the LOGOS tasks into it and checks what comes out:

- **the grammar** goes through vLLM's structured outputs (llguidance backend): each request carries
  the shipped grammar, its task rules, its own rules (a copied sequence, a composition, a space
  group) and a start rule for what follows its prompt (:mod:`logos.tasks.continuation`);
- **the row constraints** (the chemistry of molecule spans, a crystal's composition, the copied
  sequence of a binding-site search) and the built-in engine's sampling policy run in the engine, as
  a logits processor (:mod:`logos.generate.vllm_processor`), from each request's
  ``extra_args["logos"]`` (:func:`~logos.generate.vllm_processor.request_args`).

Every finished row is checked again here (RDKit parses each molecule span, the sites add up to the
composition, a reader accepts the crystal) and drawn again when it fails, through the resample queue
the built-in engine uses (:mod:`logos.generate.resample`). Whole-record tasks (molecules) keep a finished
sample with the model's probability of the end of document after it, read from the rescoring prefill of
that sample with the end appended (temperature 1: at other temperatures this is where the engines
differ), and draw it again otherwise. First-try validity, resampled rows, candidates checked and
redraws per row per step are reported. Log-probabilities are the model's own (temperature 1, no mask):
vLLM's sampled log-probabilities are renormalized over the grammar's mask, so each sample is rescored by
one prefill pass.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from logos.generate.vllm_processor import (ARGS_KEY, COUNTS_ENV, LogosLogitsProcessor, LogosLogitsProcessorV1,
                                           ProcessorCounts, request_args, request_xargs, shared_row_constraint)

__all__ = ["Checkpoint", "EngineOptions", "SampleRun", "VllmReport", "close_llm", "end_probabilities",
           "engine_environment", "engine_summary", "generate_vllm", "llm_kwargs", "make_llm", "processor_class",
           "on_cpu", "request_xargs", "rescore", "sample_jobs"]


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


def on_cpu() -> bool:
    try:
        from vllm.platforms import current_platform

        return current_platform.is_cpu()
    except Exception:  # pragma: no cover
        return True


def processor_class(cpu: bool | None = None):
    """The processor for the model runner vLLM will use: V1 on CPU (V2 needs Triton's CPU backend), else V2
    unless ``VLLM_USE_V2_MODEL_RUNNER=0``; the variable is set so vLLM makes the same choice."""
    cpu = on_cpu() if cpu is None else cpu
    v2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "0" if cpu else "1") not in ("0", "false", "False")
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1" if v2 else "0"
    return LogosLogitsProcessor if v2 else LogosLogitsProcessorV1


def engine_environment(engine: EngineOptions) -> None:
    """Environment vLLM reads at start: the CPU KV cache size, a Ray cluster's address."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(engine.kv_cache_gib))
    if engine.ray_address:
        os.environ["RAY_ADDRESS"] = engine.ray_address


def llm_kwargs(checkpoint: Path, engine: EngineOptions, seed: int, max_len: int) -> dict:
    """Keyword arguments of ``vllm.LLM`` (and, as flags, of the OpenAI server) for a LOGOS checkpoint."""
    cpu = on_cpu()
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
    if not os.environ.get(COUNTS_ENV):  # where the engine's processors write their counts (read by generate_vllm)
        import tempfile

        os.environ[COUNTS_ENV] = os.path.join(tempfile.mkdtemp(prefix="logos-vllm-"), "counts.json")
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

    def keep(self, kept) -> None:
        """A finished sample (and its final token ids) the resample queue kept (None: none, it is drawn again)."""
        if kept is not None:
            self.samples.append(kept[0])
            self.finals.append(kept[1])


@dataclass
class VllmReport:
    """What a vLLM run reports beside the built-in engine's figures: rows asked, rows valid at their first draw, the
    seconds sampling took, and what the engine's logits processors did in the run."""

    rows: int
    first_try_valid: int
    sample_seconds: float
    counts: ProcessorCounts


def sample_jobs(run, ck: Checkpoint, task, jobs, options, progress: bool = False) -> SampleRun:
    """Sample every job through ``run(requests, params) -> [RequestOutput]`` (an ``LLM.generate`` or the
    server's engine client), check each finished row again and resample failures up to ``options.resamples``."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from logos.generate.pipeline import sample_of, task_sampling
    from logos.generate.resample import ResampleQueue
    from logos.tasks.continuation import continuation_grammar

    s = task_sampling(task, options.sampling)
    stop_id = ck.tok.eos_token_id if task.stop == "eos" else ck.table.id[task.stop]
    allowed = None
    if not options.constrained:  # the task mask stays, as in the built-in engine: no symbol the task never writes
        banned = ck.table.banned(set(task.symbols), keep={stop_id})
        allowed = (~banned[: ck.table.size]).nonzero().flatten().tolist()
    grammars: dict[int, str] = {}
    res = SampleRun()
    whole = task.whole_document and stop_id != ck.tok.eos_token_id and options.whole_draws > 0
    queue = ResampleQueue(range(len(jobs)), options.resamples, options.whole_draws if whole else 0)
    t = time.perf_counter()
    while queue:
        attempts = queue.take()
        requests, params = [], []
        for a in attempts:
            p, ids, row_budget = jobs[a.job]
            so = None
            if options.constrained:
                if id(p) not in grammars:
                    grammars[id(p)] = continuation_grammar(task, p)
                so = StructuredOutputsParams(grammar=grammars[id(p)])
            params.append(SamplingParams(
                n=1, temperature=s.temperature, top_k=s.top_k or 0, top_p=s.top_p, max_tokens=row_budget,
                seed=_seed(options.seed, a.job, a.resamples + 1009 * a.draws), stop_token_ids=[stop_id], logprobs=0,
                skip_special_tokens=False, detokenize=False, structured_outputs=so, allowed_token_ids=allowed,
                extra_args={ARGS_KEY: request_args(task, p, s.closing_slack, closing_only=not options.constrained)}))
            requests.append({"prompt_token_ids": ids})
        finished = []  # whole-record samples that ended validly: kept with the model's P(end of document) after them
        for a, o in zip(attempts, run(requests, params)):
            p = jobs[a.job][0]
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
            res.first_try_valid += status == "done" and a.resamples == 0 and a.draws == 0
            item = (sample_of(task, p, text, logprob, status), (jobs[a.job][1], toks))
            if status == "done" and whole:
                finished.append((a, item))
            else:
                res.keep(queue.settle(a, item, status == "done"))
        ends = end_probabilities(run, [item[1] for _, item in finished], ck.tok.eos_token_id)
        for (a, item), (logprob, p_end) in zip(finished, ends):
            item[0].logprob = logprob  # scored: the final rescoring skips it
            res.scored.add(id(item[0]))
            u = random.Random(_seed(options.seed, a.job, 7 + a.draws)).random()
            res.keep(queue.settle(a, item, True, whole=u < p_end))
    res.resampled, res.not_whole = queue.resampled, queue.not_whole
    res.seconds = time.perf_counter() - t
    if options.constrained:  # vLLM's sampled log-probabilities are renormalized over the grammar's mask:
        rescore(run, res.samples, res.finals, res.scored)  # score with the model's own, as the built-in engine
    return res


def generate_vllm(checkpoint: Path, out: Path, options, inputs: Path | None = None, progress: bool | None = None,
                  engine: EngineOptions | None = None, llm=None):
    """``logos generate`` through vLLM: same prompts, files, samples JSONL, ranking and exit status as
    :func:`logos.generate.pipeline.generate` (``options`` is its :class:`GenerateOptions`); ``llm``: a
    :func:`make_llm` to reuse (its checkpoint must be ``checkpoint``). The result's ``engine`` is a
    :class:`VllmReport`."""
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
    before = ProcessorCounts.read(os.environ.get(COUNTS_ENV))
    try:
        def run(reqs, params):
            return llm.generate(reqs, params, use_tqdm=bool(progress))
        if any(p.alternatives for p, _ in prompts):  # the model chooses a crystal's cell first, as the built-in engine
            prompts = choose_alternatives(prompts, ck.scorer(run), options.seed)
            jobs = ck.jobs(task, prompts, options.sampling.max_new_tokens, options.constrained)
        res = sample_jobs(run, ck, task, jobs, options)
        counts = ProcessorCounts.read(os.environ.get(COUNTS_ENV)).minus(before)
    finally:
        if own:
            close_llm(llm)
    ranked = finish(task, res.samples, out, writer_cls, options.writer, errors)
    errors.close()
    result = GenerateResult(ranked, errors.count - sum(not x.written for x in ranked), time.perf_counter() - start,
                            res.tokens, counts.policy.redraws, res.resampled,
                            StepStats(steps=counts.policy.row_steps, check_seconds=counts.seconds,
                                      row_steps=counts.policy.row_steps, policy=counts.policy), res.not_whole)
    result.engine = VllmReport(len(jobs), res.first_try_valid, res.seconds, counts)
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


def engine_summary(result) -> str:
    """The vLLM-specific line of a run: first-try validity, resampled rows and the processor's cost."""
    e: VllmReport = result.engine
    counts = e.counts.policy
    rows, steps = max(e.rows, 1), max(counts.row_steps, 1)
    return (f"vllm: {e.first_try_valid}/{e.rows} valid before resampling ({e.first_try_valid / rows:.1%}), "
            f"{result.resampled} rows resampled; logits processor {1e6 * e.counts.seconds / steps:.0f} us per row per "
            f"step, {counts.checks / steps:.1f} candidates checked per row per step, {counts.dead_ends} dead ends")
