"""The work of one ``/logos/generate`` request of ``logos serve``, in the request's own isolated process.

:func:`handle` runs in a process forked for the request (:func:`logos.util.isolate.call_isolated`):
it bounds and reads the request's input (:func:`logos.tasks.prompts.build_prompts`, the limits of
``logos tokenize``), refuses what cannot be served (every refused input named, the samples asked for,
prompts longer than the model's context), samples through the server's engine by asking the server
for each round of outputs (:func:`logos.generate.vllm_engine.sample_jobs`, the same resampling and
checks as ``logos generate --engine vllm``), and writes and cuts the files of the reply. It tells the
server which input record it is reading (``Channel.stage``), so a library that crashes or stalls on
a record is reported as that input's refusal.

The server's fork server imports this module once; when ``LOGOS_SERVE_CHECKPOINT`` names a checkpoint,
its tokenizer and token table are loaded then, so that every request's process is forked with them
(loading them takes seconds; a fork, milliseconds).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from logos.data.limits import InputLimits
from logos.generate.serve import CHECKPOINT_ENV, DEFAULT_FORMATS, MAX_SAMPLES, RequestError
from logos.generate.vllm_engine import Checkpoint

__all__ = ["handle", "checkpoint"]

_LOADED: dict[str, Checkpoint] = {}


def checkpoint(path: str | None = None) -> Checkpoint:
    """The served checkpoint's tokenizer and token table, loaded once per process (and so once for every fork)."""
    path = str(path or os.environ[CHECKPOINT_ENV])
    if path not in _LOADED:
        _LOADED[path] = Checkpoint(Path(path))
    return _LOADED[path]


class _Refusals:
    """The error log of one request's input: the record number and reason of each refused input record."""

    def __init__(self, path: Path | None):
        self.path, self.count, self.items = path, 0, []

    def add(self, source: str, reason: str) -> None:
        """``source``: ``INPUT_FILE:N`` (record N of the input), the input file itself, or anything else (the
        request)."""
        from logos.util.records import bounded

        self.count += 1
        where, _, number = str(source).rpartition(":")
        record = int(number) if self.path is not None and where == str(self.path) and number.isdigit() else None
        label = f"input {record}" if record else "input" if str(source) == str(self.path) else "request"
        item = {"input": record, "reason": bounded(reason), "label": label}
        if item not in self.items:
            self.items.append(item)

    def raise_any(self) -> None:
        if self.items:
            items = sorted(self.items, key=lambda x: (x["input"] is None, x["input"] or 0))
            lines = [f"{x['label']}: {x['reason']}" for x in items]
            more = f" (and {len(lines) - 3} more)" if len(lines) > 3 else ""
            raise RequestError(422, "; ".join(lines[:3]) + more,
                               [{"input": x["input"], "reason": x["reason"]} for x in items])


def _input_suffix(task: str) -> str:
    return {"pocket": ".fasta", "ligand": ".jsonl", "forward": ".smi", "retro": ".smi", "reaction": ".smi"}.get(
        task, ".txt")


def handle(channel, req: dict, limits: InputLimits, max_model_len: int, checkpoint_path: str) -> dict:
    """One request (a body checked by :func:`logos.generate.serve.parse_request`) on the checkpoint at
    ``checkpoint_path``: the reply, or RequestError."""
    from logos.decoding.sampler import Sampling
    from logos.domains import writer_for
    from logos.domains.base import WriterOptions
    from logos.generate.pipeline import GenerateOptions, finish
    from logos.generate.vllm_engine import sample_jobs
    from logos.tasks import get
    from logos.tasks.prompts import PromptOptions, build_prompts, choose_alternatives
    from logos.util.records import ErrorLog, InputError

    channel.stage("loading the checkpoint")
    ck = checkpoint(checkpoint_path)
    task = get(req["task"], "generate")
    suffix = req["format"] or DEFAULT_FORMATS.get(task.name, ".json")
    try:
        writer_cls = writer_for(Path("out" + suffix))
    except InputError as e:
        raise RequestError(422, f"format {suffix}: {e}") from None
    sampling = Sampling(temperature=req["temperature"], top_k=req["top_k"], top_p=req["top_p"],
                        max_new_tokens=req["max_new_tokens"])
    options = GenerateOptions(task=task.name, n=req["n"], sampling=sampling, seed=req["seed"],
                              constrained=not req["unconstrained"], resamples=req["resamples"],
                              whole_draws=req["whole_draws"], limits=limits)
    with tempfile.TemporaryDirectory(prefix="logos-serve-") as tmp:
        inputs = None
        if (req["input"] or "").strip():
            inputs = Path(tmp) / ("input" + (req["input_format"] or _input_suffix(task.name)))
            inputs.write_text(req["input"].rstrip("\n") + "\n")
        refused = _Refusals(inputs)
        channel.stage("reading the input")
        try:
            reading = PromptOptions(cell_composition=req["cell_composition"], max_cell_atoms=req["max_cell_atoms"])
            prompts = build_prompts(task, inputs, options.n, refused, reading, limits=limits, workers=0,
                                    on_record=lambda number: channel.stage(f"input {number}"))
        except InputError as e:
            raise RequestError(422, "input: " + str(e).replace(f"{inputs}: ", "")) from None
        refused.raise_any()
        asked = sum(k for _, k in prompts)
        if asked > MAX_SAMPLES:
            raise RequestError(422, f"n {options.n} for each of {len(prompts)} inputs: {asked:,} samples, more than "
                                    f"{MAX_SAMPLES:,} per request")
        engine = lambda requests, params: channel.ask((requests, params))  # noqa: E731
        channel.stage("choosing crystal cells")
        prompts = choose_alternatives(prompts, ck.scorer(engine), options.seed)  # a crystal's cell, as logos generate
        channel.stage("tokenizing the prompts")
        jobs = ck.jobs(task, prompts, sampling.max_new_tokens, options.constrained)
        if max_model_len:  # the model's context holds the prompt and its budget
            fitted = []
            for prompt, ids, budget in jobs:
                room = max_model_len - len(ids)
                if budget > room > 0 and not sampling.max_new_tokens and task.row_budget is None:
                    budget = room  # the task's default budget, cut to the context (a copy task's is not cut)
                elif budget > room:
                    refused.add(f"{inputs}:{prompt.record}" if prompt.record else "request",
                                f"a prompt of {len(ids):,} tokens and a budget of {budget:,} new tokens exceed the "
                                f"server's --max-model-len {max_model_len:,}")
                fitted.append((prompt, ids, budget))
            refused.raise_any()
            jobs = fitted

        channel.stage("sampling and checking the samples")
        res = sample_jobs(engine, ck, task, jobs, options)
        channel.stage("writing the samples' files")
        out = Path(tmp) / f"out{suffix}"
        errors = ErrorLog(Path(tmp) / "errors.jsonl", echo=lambda line: None)
        ranked = finish(task, res.samples, out, writer_cls, WriterOptions(), errors)
        errors.close()
        files = _split_files(out, suffix, ranked)
        log = Path(tmp) / "errors.jsonl"
        error_lines = log.read_text().splitlines() if log.exists() else []
    rank: dict[str, int] = {}
    samples = []
    for s in ranked:
        rank[s.input_id] = rank.get(s.input_id, 0) + 1
        ident = f"{s.input_id}#{rank[s.input_id]}"
        samples.append({"id": s.input_id, "rank": rank[s.input_id], "text": s.text, "logprob": round(s.logprob, 4),
                        "status": s.status, "written": s.written, "file": files.get(ident)})
    return {"task": task.name, "format": suffix, "samples": samples, "resampled": res.resampled,
            "errors": error_lines}


def _split_files(out: Path, suffix: str, ranked) -> dict[str, str]:
    """The written file cut per sample where the format has records (CIF data blocks, SDF molecules, JSON lines);
    otherwise the whole file under every written sample's id."""
    if suffix == ".cif":  # one CIF per crystal, in the folder named after the output
        out = out.with_suffix("")
    if not out.exists():
        return {}
    ids, rank = [], {}
    for s in ranked:
        rank[s.input_id] = rank.get(s.input_id, 0) + 1
        if s.written:
            ids.append(f"{s.input_id}#{rank[s.input_id]}")
    if out.is_dir():  # one file per sample (CIF), in the order written
        files = sorted(p for p in out.iterdir() if p.is_file())
        return dict(zip(ids, (p.read_text() for p in files))) if len(files) == len(ids) else {}
    text = out.read_text()
    parts: list[str]
    if suffix == ".cif":
        import re

        parts = [p for p in re.split(r"(?m)^(?=data_)", text) if p.strip()]
    elif suffix == ".sdf":
        parts = [p + "$$$$\n" for p in text.split("$$$$\n") if p.strip()]
    else:
        parts = [line + "\n" for line in text.splitlines() if line.strip() and not line.startswith("#")]
    if len(parts) == len(ids):
        return dict(zip(ids, parts))
    return {i: text for i in ids}


# What a request's work imports on first use (prompts, the checks of finished samples, the writers): imported once
# in the fork server, so that no request pays for it (pymatgen alone takes seconds).
_PRELOAD = ("vllm.sampling_params", "vllm.outputs", "rdkit.Chem", "Bio.SeqIO", "pymatgen.core",
            "pymatgen.symmetry.analyzer", "logos.domains", "logos.science.chemistry", "logos.language.grammar",
            "logos.tasks.prompts", "logos.tasks.continuation", "logos.tasks.answers", "logos.decoding.constraints",
            "logos.decoding.rows", "logos.decoding.composition", "logos.decoding.crystal_rules",
            "logos.decoding.crystal_check", "logos.science.materials.wyckoff", "logos.science.materials.symmetry",
            "logos.science.materials.validity")


def _preload() -> None:
    """In the server's fork server: the checkpoint and the modules of a request's work loaded once, before any
    request forks."""
    import gc
    import importlib
    import sys

    try:
        checkpoint()
    except Exception as e:  # noqa: BLE001 - each request then loads it itself and reports what fails
        print(f"logos serve: the request worker could not preload {os.environ[CHECKPOINT_ENV]}: {e}", file=sys.stderr)
    for name in _PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional package (vLLM outside its venv, pymatgen without logos[materials])
            pass
    from logos.language.grammar import validate

    validate("<MoleculeS>C<MoleculeE>")  # builds the grammar's parser, which checks every written sample
    gc.freeze()  # the loaded objects stay shared with the forks (no collection writes to their pages)


if os.environ.get(CHECKPOINT_ENV):
    _preload()
