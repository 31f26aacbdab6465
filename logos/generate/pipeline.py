"""``logos generate``: prompts of a task -> constrained samples -> ranked, detokenized files and a samples JSONL.

For every task (:mod:`logos.tasks.registry`) the run builds the prompts (``-n`` samples in all, or
per input for conditional tasks), samples them in batches (:mod:`logos.decoding.sampler`) under the
grammar and the row constraint (chemistry of molecule spans; for crystals, the prompt's composition), and writes

- the task's files through the domain writer the output suffix names (``.smi``/``.sdf``, ``.rsmi``,
  ``.fasta``, ``.pocket.csv``/``.pocket.json``, ``.cif``, ``.json``);
- ``OUT.samples.jsonl``: one line per sample with the input id, rank (the position among the input's samples:
  by likelihood for conditional tasks, generation order for unconditional ones), raw text, summed model
  log-probability, status and, for reactions, how many samples gave the same canonical answer.

Conditional answers are ranked by likelihood per input; for ``retro`` and ``forward`` equal canonical
answers are merged (their count kept, the best log-probability ranks them). Unconditional samples (no
input) keep their generation order, an unbiased draw: metrics that read "the first k" samples
(MOSES's unique@k) mean what they say; ``OUT.samples.jsonl`` holds every log-probability, so the
ranked view is one sort away. A sample whose molecule span
RDKit refuses, that hits a dead end or runs out of budget is resampled up to ``--resamples`` times;
what still fails is logged (``OUT.errors.jsonl``) and the exit status is 1. For tasks whose completion
is a whole record (molecules), a finished sample is kept with the model's probability of the end of
document after it, else drawn again (at most ``--whole-draws`` times, 16 by default; the last finished
draw is kept): the model writes molecules as the first span of reactions too, and those are not
samples of a standalone molecule.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm

from logos.domains.base import WriterOptions
from logos.decoding.sampler import NOT_WHOLE, RowResult, Sampling, StepStats, sample_batch
from logos.generate.resample import ResampleQueue
from logos.tasks import Task, get
from logos.tasks.prompts import UNCONDITIONAL, Prompt, PromptOptions, build_prompts, choose_alternatives
from logos.language.grammar import READABLE_GRAMMARS
from logos.data.limits import InputLimits
from logos.util.records import ErrorLog, InputError, RecordError, errors_path_for

__all__ = ["GenerateOptions", "GenerateResult", "generate", "run", "load_checkpoint", "scorer", "no_usable_input",
           "SUPPORTED_GRAMMARS"]

SUPPORTED_GRAMMARS = READABLE_GRAMMARS  # from logos.language.grammar
MAX_WHOLE_DRAWS = 16  # default redraws of one sample of a whole-record task (Task.whole_document)


@dataclass(frozen=True)
class GenerateOptions:
    task: str = "molecule"
    n: int = 100
    batch_size: int = 16
    sampling: Sampling = field(default_factory=Sampling)
    seed: int = 0
    constrained: bool = True
    device: str = "cpu"
    resamples: int = 8
    whole_draws: int = MAX_WHOLE_DRAWS  # redraws of a whole-record sample the model would not end there (0: none)
    writer: WriterOptions = field(default_factory=WriterOptions)
    prompts: PromptOptions = field(default_factory=PromptOptions)  # how input lines are read (crystal formulas)
    limits: InputLimits = field(default_factory=InputLimits)  # --input's records, bounded before a library reads them


@dataclass
class Sample:
    input_id: str
    prompt: str
    text: str
    logprob: float
    status: str
    key: str | None = None      # canonical answer (reactions), for merging
    count: int = 1
    written: bool = False
    chosen: float = 0.0         # the model's log-probability of what it chose in the prompt (Prompt.logprob)

    @property
    def likelihood(self) -> float:
        """The model's summed log-probability of everything it wrote or chose: what samples are ranked by."""
        return self.logprob + self.chosen


@dataclass
class GenerateResult:
    samples: list[Sample]
    failed_inputs: int
    seconds: float
    tokens: int
    redraws: int
    resampled: int
    stats: StepStats = field(default_factory=StepStats)
    not_whole: int = 0  # finished samples drawn again because the model would not end the record after them

    @property
    def texts(self) -> list[str]:
        return [s.text for s in self.samples]

    @property
    def written(self) -> int:
        return sum(s.written for s in self.samples)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed_inputs or self.written < len(self.samples) else 0

    def summary(self) -> str:
        n = len(self.samples)
        steps = max(self.stats.steps, 1)
        return (f"{n} samples, {self.written} written ({self.written / max(n, 1):.1%}); "
                f"{n / max(self.seconds, 1e-9):.1f} samples/s, {self.tokens / max(self.seconds, 1e-9):,.0f} tokens/s; "
                f"{self.resampled} resampled ({self.resampled / max(n, 1):.2f} per row asked), "
                + (f"{self.not_whole} drawn again as not a whole record, " if self.not_whole else "")
                + f"{self.redraws} constrained redraws, "
                f"{self.stats.closed_by_plan} spans ended by their planned ending; masks "
                f"{1000 * self.stats.mask_seconds / steps:.2f} ms/step, row constraints "
                f"{1e6 * self.stats.check_seconds / max(self.stats.row_steps, 1):.0f} us/row/step")


def load_checkpoint(path: Path, device: str = "cpu"):
    """(model, tokenizer, run info) of an exported checkpoint: plain transformers, safetensors only.

    A checkpoint that records a grammar version this package cannot read is refused in one line.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from logos.train.export import load_run_info

    path = Path(path)
    if not (path / "config.json").exists():
        raise InputError(f"{path} is not a checkpoint directory (no config.json)")
    info = load_run_info(path)
    grammar = info.get("grammar", "v1")
    if grammar not in SUPPORTED_GRAMMARS:
        raise InputError(f"{path} was trained on grammar {grammar}; this logos reads {', '.join(SUPPORTED_GRAMMARS)}")
    tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, use_safetensors=True, trust_remote_code=False)
    return model.to(device).eval(), tok, info


def document_start(info: dict, tok) -> int:
    """The token that starts every training document: the shards' recorded one, else BOS, else EOS (Qwen)."""
    recorded = (info.get("shards") or {}).get("bos_id")
    if recorded is not None:
        return int(recorded)
    return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id


def generate(checkpoint: Path, out: Path, options: GenerateOptions, inputs: Path | None = None,
             progress: bool | None = None) -> GenerateResult:
    """Sample the task's prompts and write the files (see the module docstring)."""
    from logos.decoding.constraints import GrammarRows, TokenTable, task_grammar
    from logos.domains import writer_for

    start = time.perf_counter()
    task = get(options.task, "generate")
    out = Path(out)
    writer_cls = writer_for(out)
    echo = [True]  # inputs refused before sampling are also shown (one line each); failed samples only logged
    errors = ErrorLog(errors_path_for(out), echo=lambda line: print(line, file=sys.stderr) if echo[0] else None)
    prompts = build_prompts(task, Path(inputs) if inputs else None, options.n, errors, options.prompts, options.limits)
    echo[0] = False
    if not prompts:
        errors.close()
        raise InputError(no_usable_input(errors))
    model, tok, info = load_checkpoint(checkpoint, options.device)
    vocab_rows = model.get_output_embeddings().weight.shape[0]
    table = TokenTable(tok, vocab_rows)
    doc_start = document_start(info, tok)
    prompts = choose_alternatives(prompts, scorer(model, tok, doc_start), options.seed)  # (crystal cells, if any)
    stop_id = tok.eos_token_id if task.stop == "eos" else table.id[task.stop]
    banned = table.banned(set(task.symbols), keep={stop_id})
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    sampling = task_sampling(task, options.sampling)
    generator = torch.Generator().manual_seed(options.seed)
    whole = task.whole_document and stop_id != tok.eos_token_id and options.whole_draws > 0
    queue = ResampleQueue([p for p, k in prompts for _ in range(k)], options.resamples,
                          options.whole_draws if whole else 0)
    samples: list[Sample] = []
    tokens = redraws = 0
    stats = StepStats()
    bar = tqdm(total=len(queue), unit="sample", desc=f"generate {task.name}", file=sys.stderr, dynamic_ncols=True,
               disable=None if progress is None else not progress, mininterval=0.5)
    try:
        while queue:
            chunk = queue.take(options.batch_size)
            ids = [[doc_start] + tok(a.job.text, add_special_tokens=False)["input_ids"] for a in chunk]
            texts = [a.job.text for a in chunk]
            grammar = rows = None
            if options.constrained:
                grammars = [task_grammar(task.start, task.rules + "\n" + a.job.rules) for a in chunk]
                grammar = GrammarRows(tok, vocab_rows, grammars, [x[1:] for x in ids], stop_id, model.device)
                rows = task.rows(table, texts, [a.job.choices for a in chunk]) if task.rows is not None else None
            chunk_sampling = replace(sampling, max_new_tokens=length_budget(task, texts, rows,
                                                                            options.sampling.max_new_tokens))
            results = sample_batch(model, ids, pad_id, stop_id, banned, chunk_sampling, generator, grammar, rows,
                                   stats, then_id=tok.eos_token_id if whole else None)
            for attempt, r in zip(chunk, results):
                tokens += len(r.tokens)
                redraws += r.redraws
                whole_record = r.status != NOT_WHOLE  # (rejection sampling of whole records, bounded)
                if not whole_record:
                    r.status = "done"
                kept = queue.settle(attempt, r, r.status == "done", whole_record)
                if kept is not None:
                    samples.append(_sample(task, attempt.job, kept, tok))
                    bar.update(1)
            bar.set_postfix(samples_s=f"{len(samples) / (time.perf_counter() - start):.1f}", refresh=False)
    finally:
        bar.close()
    resampled, not_whole = queue.resampled, queue.not_whole
    ranked = finish(task, samples, out, writer_cls, options.writer, errors)
    errors.close()
    return GenerateResult(ranked, errors.count - sum(not s.written for s in ranked), time.perf_counter() - start,
                          tokens, redraws, resampled, stats, not_whole)


def scorer(model, tok, doc_start: int):
    """``[(prefix, continuation)] -> [the model's summed log-probability of the continuation's tokens]`` (temperature
    1, no mask; the document start before the prefix), one forward pass each: what
    :func:`~logos.tasks.prompts.choose_alternatives` reads."""
    def score(pairs: list[tuple[str, str]]) -> list[float]:
        out = []
        for prefix, continuation in pairs:
            head = tok(prefix, add_special_tokens=False)["input_ids"]
            ids = [doc_start] + tok(prefix + continuation, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                logp = model(torch.tensor([ids], device=model.device)).logits[0].float().log_softmax(-1)
            out.append(float(sum(logp[j - 1, ids[j]] for j in range(1 + len(head), len(ids)))))
        return out
    return score


def no_usable_input(errors: ErrorLog) -> str:
    """The message of a run whose input gave no prompt: the first refused record and its reason."""
    if errors.first is None:
        return "nothing to generate (no usable input)"
    more = f" (and {errors.count - 1} more, see {errors.path})" if errors.count > 1 and errors.path else ""
    return f"nothing to generate: every input record was refused: {errors.first}{more}"


def task_sampling(task: Task, sampling: Sampling) -> Sampling:
    """``sampling`` with the task's default temperature where it asks for none (both engines draw with this)."""
    return sampling if sampling.temperature is not None else replace(sampling, temperature=task.temperature)


def length_budget(task: Task, texts: list[str], rows, asked: int) -> int:
    """The length budget of prompts sampled together: ``asked`` (``--max-new-tokens``) or the task's default, what
    a copy task's input needs and, when nothing was asked, what each row constraint says its prompt needs."""
    budget = asked or task.budget
    if task.row_budget is not None:  # a copy task: the input sets the length
        budget = task.row_budget(texts, budget)
    if not asked and rows:
        budget = max(row.budget(budget) if row is not None else budget for row in rows)
    return budget


def _sample(task: Task, prompt: Prompt, r: RowResult, tok) -> Sample:
    body = r.tokens[:-1] if task.stop == "eos" and r.tokens and r.status == "done" else r.tokens
    text = prompt.text + tok.decode(body, skip_special_tokens=False)  # never skip: tags are content
    return sample_of(task, prompt, text, r.logprob, r.status)


def finish(task: Task, samples: list[Sample], out: Path, writer_cls, options: WriterOptions,
           errors: ErrorLog) -> list[Sample]:
    """Rank the samples of any engine and write the task's files: the output, ``OUT.samples.jsonl``, extras."""
    ranked = _rank(task, samples)
    _write(task, ranked, out, writer_cls, options, errors)
    if task.extra_output is not None:
        task.extra_output(ranked, out)
    return ranked


def sample_of(task: Task, prompt: Prompt, text: str, logprob: float, status: str) -> Sample:
    """A finished row of any engine as a :class:`Sample` (its canonical answer keyed for ranking)."""
    sample = Sample(prompt.input_id, prompt.text, text, logprob, status, chosen=prompt.logprob)
    if task.answer is not None:
        sample.key = task.answer(text)
    return sample


def _rank(task: Task, samples: list[Sample]) -> list[Sample]:
    """Per input: by likelihood; reactions merge equal canonical answers (count kept, best likelihood ranks).
    Unconditional samples keep their generation order."""
    by_input: dict[str, list[Sample]] = {}
    for s in samples:
        by_input.setdefault(s.input_id, []).append(s)
    out = []
    for input_id, group in by_input.items():
        if input_id == UNCONDITIONAL:
            out.extend(group)
            continue
        if task.answer is not None:
            merged: dict[str, Sample] = {}
            rest = []
            for s in sorted(group, key=lambda s: -s.likelihood):
                if s.key is None:
                    rest.append(s)
                elif s.key in merged:
                    merged[s.key].count += 1
                else:
                    merged[s.key] = s
            group = list(merged.values()) + rest
        out.extend(sorted(group, key=lambda s: (s.status != "done", -s.likelihood)))
    return out


def _write(task: Task, samples: list[Sample], out: Path, writer_cls, options: WriterOptions, errors: ErrorLog) -> None:
    from logos.language.grammar import GrammarError, validate

    out.parent.mkdir(parents=True, exist_ok=True)
    jsonl = out.with_name(out.name.split(".")[0] + ".samples.jsonl")
    rank: dict[str, int] = {}
    with writer_cls(out, options) as writer, open(jsonl, "w", encoding="utf-8") as fh:
        for s in samples:
            rank[s.input_id] = rank.get(s.input_id, 0) + 1
            ident = f"{s.input_id}#{rank[s.input_id]}"
            if s.status != "done":
                errors.add(ident, f"sample did not finish ({s.status}) | {s.text[-200:]}")
            else:
                try:
                    validate(s.text)
                    writer.write({"text": s.text, "id": ident, "source": f"generate:{ident}"})
                    s.written = True
                except (GrammarError, RecordError) as e:
                    if task.unmarked_ok and "no pocket marks" in str(e):
                        s.written = True  # a search that marks no residue is an answer: no pocket
                    else:
                        errors.add(ident, f"{e} | {s.text[-200:]}")
            fh.write(json.dumps({"id": s.input_id, "rank": rank[s.input_id], "text": s.text,
                                 "logprob": round(s.likelihood, 4), "status": s.status, "written": s.written,
                                 **({"answer": s.key, "count": s.count} if s.key is not None or s.count > 1 else {})})
                     + "\n")


def run(output: str | Path, task: str = "molecule", n: int = 100, inputs: str | Path | None = None,
        checkpoint: str | Path | None = None, seed: int = 0, temperature: float | None = None,
        max_new_tokens: int = 0, batch_size: int = 16, constrained: bool = True, device: str = "cpu",
        cell_composition: bool = False) -> GenerateResult:
    """``logos generate`` from Python, with its defaults: sample ``task`` from ``checkpoint`` (default: the shipped
    one) and write the files ``output`` names plus ``OUTPUT.samples.jsonl`` (``temperature`` None: the task's;
    ``cell_composition``: as ``--cell-composition``)."""
    from logos.util.resources import DEFAULT_CHECKPOINT, resolve

    options = GenerateOptions(task=task, n=n, batch_size=batch_size, seed=seed, constrained=constrained,
                              device=device, sampling=Sampling(temperature=temperature, max_new_tokens=max_new_tokens),
                              prompts=PromptOptions(cell_composition=cell_composition))
    return generate(resolve(checkpoint or DEFAULT_CHECKPOINT), Path(output), options,
                    inputs=Path(inputs) if inputs else None, progress=False)
