"""``logos serve``: vLLM's OpenAI-compatible server for a LOGOS checkpoint, with the LOGOS tasks by name.

The server is vLLM's own (``/v1/completions``, ``/v1/models``, ``/health``, ...), started with the
LOGOS logits processor (:mod:`logos.generate.vllm_engine`) and the llguidance structured-outputs
backend, plus two routes added through vLLM's endpoint-plugin interface (entry point
``vllm.endpoint_plugins: logos``, allow-listed by ``logos serve`` through ``VLLM_PLUGINS``):

- ``GET /logos/tasks``: the task names;
- ``POST /logos/generate``: ``{"task": "crystal", "input": "NaCl 225", "n": 4, "seed": 0}`` (``input``: what
  ``logos generate --input`` reads, one record per line: SMILES, a reaction side, a FASTA, a formula
  with an optional space group; none for unconditional tasks; ``format``: the output suffix, e.g.
  ``.cif``, ``.sdf``, ``.pocket.json``) returns, per sample, the grammar text, its log-probability, rank
  and status, and the detokenized file the output format names (``file``: CIF, SDF, ... text).

The same guarantees as ``logos generate --engine vllm``: the task grammar as a structured output,
the chemistry and the composition through the logits processor, every row checked again and
resampled when it fails. A plain ``/v1/completions`` request gets the same constraints when it
carries the grammar and ``vllm_xargs`` (see the README).

Engine options are passed through: ``--tensor-parallel-size``, ``--data-parallel-size``,
``--ray-address`` (a Ray cluster for multi-node; on CPU one process), and any other vLLM server flag
after ``--``.
"""

import argparse
import os
import sys
from pathlib import Path

__all__ = ["add_engine_arguments", "engine_options", "add_serve_parser", "LogosEndpoints", "DEFAULT_FORMATS"]

DEFAULT_FORMATS = {"molecule": ".smi", "forward": ".rsmi", "retro": ".rsmi", "reaction": ".rsmi",
                   "protein": ".fasta", "antibody": ".fasta", "pocket": ".pocket.json", "ligand": ".sdf",
                   "crystal": ".cif", "mof": ".json"}


# ------------------------------------------------------------------------------------------------ arguments
def add_engine_arguments(p: argparse.ArgumentParser, engine_choice: bool = True) -> None:
    """vLLM's scale-out and memory options (and, for ``logos generate``, ``--engine``)."""
    if engine_choice:
        p.add_argument("--engine", choices=("builtin", "vllm"), default="builtin",
                       help="builtin: the sampling loop of this package (CPU, small models); vllm: vLLM (its own "
                            "venv: make venv-vllm), same tasks, files and guarantees")
    g = p.add_argument_group("vLLM engine")
    g.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs a model is split over (vLLM)")
    g.add_argument("--data-parallel-size", type=int, default=1, help="model replicas (vLLM)")
    g.add_argument("--ray-address", metavar="ADDR", help="a running Ray cluster for multi-node vLLM (e.g. auto, "
                                                         "HOST:6379)")
    g.add_argument("--max-num-seqs", type=int, default=128, help="rows vLLM batches at once")
    g.add_argument("--kv-cache-gib", type=int, default=1, help="vLLM on CPU: KV cache size (VLLM_CPU_KVCACHE_SPACE)")
    g.add_argument("--vllm-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="any other vllm.LLM keyword (JSON values), e.g. gpu_memory_utilization=0.9")


def engine_options(args: argparse.Namespace):
    import json

    from logos.generate.vllm_engine import EngineOptions
    from logos.records import InputError

    extra = {}
    for item in args.vllm_arg:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--vllm-arg {item!r}: expected KEY=VALUE")
        try:
            extra[key.replace("-", "_")] = json.loads(value)
        except ValueError:
            extra[key.replace("-", "_")] = value
    return EngineOptions(tensor_parallel_size=args.tensor_parallel_size, data_parallel_size=args.data_parallel_size,
                         ray_address=args.ray_address, max_num_seqs=args.max_num_seqs, kv_cache_gib=args.kv_cache_gib,
                         extra=extra)


def add_serve_parser(sub, default_checkpoint: str) -> None:
    p = sub.add_parser("serve", help="vLLM's OpenAI-compatible server for a checkpoint, LOGOS tasks at /logos/generate")
    p.add_argument("--checkpoint", default=default_checkpoint, metavar="DIR", help="an exported HF directory")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    add_engine_arguments(p, engine_choice=False)
    p.add_argument("vllm_flags", nargs=argparse.REMAINDER, help="after --: flags for vLLM's server as they are")
    p.set_defaults(func=_cmd_serve)


# ------------------------------------------------------------------------------------------------- the server
def server_argv(checkpoint: Path, args: argparse.Namespace, cpu: bool) -> list[str]:
    """The vLLM server's command line for ``checkpoint``."""
    from logos.generate.vllm_engine import processor_class

    proc = processor_class(cpu)
    argv = ["--model", str(checkpoint), "--tokenizer", str(checkpoint), "--served-model-name", checkpoint.name,
            "--host", args.host, "--port", str(args.port), "--max-model-len", str(args.max_model_len),
            "--seed", str(args.seed), "--dtype", "float32" if cpu else "auto",
            "--logits-processors", f"{proc.__module__}:{proc.__name__}",
            "--structured-outputs-config.backend", "guidance",
            "--tensor-parallel-size", str(args.tensor_parallel_size),
            "--data-parallel-size", str(args.data_parallel_size), "--max-num-seqs", str(args.max_num_seqs)]
    if cpu:
        argv.append("--enforce-eager")
    if args.ray_address:
        argv += ["--distributed-executor-backend", "ray"]
    for item in args.vllm_arg:
        key, _, value = item.partition("=")
        argv += [f"--{key.replace('_', '-')}", value]
    flags = list(args.vllm_flags or [])
    return argv + (flags[1:] if flags[:1] == ["--"] else flags)


def _cmd_serve(args: argparse.Namespace) -> int:
    from logos.generate.vllm_engine import EngineOptions, engine_environment, _on_cpu
    from logos.records import InputError
    from logos.resources import resolve

    try:
        import uvloop
        from vllm.entrypoints.launchers.api_server.entry import run_server
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        raise InputError("logos serve needs vLLM (make venv-vllm: its own venv; see the README)") from None
    checkpoint = Path(resolve(args.checkpoint)).resolve()
    from logos.generate.vllm_engine import Checkpoint

    Checkpoint(checkpoint)  # refuse a non-checkpoint or an unreadable grammar before vLLM starts
    engine_environment(EngineOptions(ray_address=args.ray_address, kv_cache_gib=args.kv_cache_gib))
    plugins = [x for x in os.environ.get("VLLM_PLUGINS", "").split(",") if x]
    os.environ["VLLM_PLUGINS"] = ",".join(plugins + ([] if "logos" in plugins else ["logos"]))
    os.environ["LOGOS_SERVE_CHECKPOINT"] = str(checkpoint)
    parser = make_arg_parser(FlexibleArgumentParser(prog="logos serve"))
    vargs = parser.parse_args(server_argv(checkpoint, args, _on_cpu()))
    validate_parsed_serve_args(vargs)
    print(f"serve: {checkpoint} on http://{args.host}:{args.port} (OpenAI API at /v1, LOGOS tasks at "
          "/logos/generate)", file=sys.stderr, flush=True)
    uvloop.run(run_server(vargs))
    return 0


class LogosEndpoints:
    """vLLM endpoint plugin: ``/logos/tasks`` and ``/logos/generate`` (see the module docstring)."""

    name = "logos"
    required_tasks = ("generate",)

    def attach_router(self, app) -> None:
        from fastapi import APIRouter, Request
        from fastapi.responses import JSONResponse

        router = APIRouter()

        @router.get("/logos/tasks")
        async def tasks():
            from logos.generate.tasks import TASKS

            return {"tasks": sorted(TASKS)}

        @router.post("/logos/generate")
        async def generate(request: Request):
            import asyncio

            from logos.records import InputError, RecordError

            body = await request.json()
            state = request.app.state
            loop = asyncio.get_running_loop()
            try:
                result = await loop.run_in_executor(None, _generate_request, state.logos_engine, state.logos_checkpoint,
                                                    body, loop)
            except (InputError, RecordError, ValueError, KeyError, TypeError) as e:
                return JSONResponse({"error": str(e)}, status_code=400)
            return result

        app.include_router(router)

    async def init_state(self, engine_client, state, args) -> None:
        from logos.generate.vllm_engine import Checkpoint

        state.logos_engine = engine_client
        state.logos_checkpoint = Checkpoint(Path(os.environ.get("LOGOS_SERVE_CHECKPOINT") or args.model))


def _generate_request(engine_client, ck, body: dict, loop) -> dict:
    """One ``/logos/generate`` request, run in a worker thread: the engine client is driven on the server's loop."""
    import asyncio
    import tempfile
    import uuid

    from logos.domains import writer_for
    from logos.domains.base import WriterOptions
    from logos.generate.pipeline import GenerateOptions, _rank, _write
    from logos.generate.sampler import Sampling
    from logos.generate.tasks import TASKS, build_prompts
    from logos.generate.vllm_engine import sample_jobs
    from logos.records import ErrorLog, InputError

    task = TASKS.get(str(body.get("task", "molecule")))
    if task is None:
        raise InputError(f"unknown task {body.get('task')!r} (known: {', '.join(sorted(TASKS))})")
    n = int(body.get("n", 1))
    if not 1 <= n <= 1024:
        raise InputError("n must be in 1..1024")
    sampling = Sampling(temperature=float(body.get("temperature", 1.0)), top_k=int(body.get("top_k", 0)),
                        top_p=float(body.get("top_p", 1.0)), max_new_tokens=int(body.get("max_new_tokens", 0)))
    options = GenerateOptions(task=task.name, n=n, sampling=sampling, seed=int(body.get("seed", 0)),
                              constrained=not body.get("unconstrained", False),
                              resamples=int(body.get("resamples", 4)))
    suffix = str(body.get("format") or DEFAULT_FORMATS.get(task.name, ".json"))

    async def one(req, params):
        final = None
        async for out in engine_client.generate(req, params, request_id=f"logos-{uuid.uuid4().hex}"):
            final = out
        return final

    async def every(requests, params):
        return await asyncio.gather(*(one(r, p) for r, p in zip(requests, params)))

    def run(requests, params):  # from this worker thread, on the server's event loop
        return asyncio.run_coroutine_threadsafe(every(requests, params), loop).result()

    with tempfile.TemporaryDirectory(prefix="logos-serve-") as tmp:
        inputs = None
        if body.get("input"):
            name = "input" + str(body.get("input_format") or _input_suffix(task.name))
            inputs = Path(tmp) / name
            inputs.write_text(str(body["input"]).rstrip("\n") + "\n")
        out = Path(tmp) / f"out{suffix}"
        errors = ErrorLog(Path(tmp) / "errors.jsonl", echo=lambda line: None)
        prompts = build_prompts(task, inputs, n, errors)
        if not prompts:
            raise InputError("nothing to generate (no usable input)")
        ck_jobs = ck.jobs(task, prompts, sampling.max_new_tokens, options.constrained)
        res = sample_jobs(run, ck, task, ck_jobs, options)
        ranked = _rank(task, res.samples)
        _write(task, ranked, out, writer_for(out), WriterOptions(), errors)
        errors.close()
        files = _split_files(out, suffix, ranked)
        error_lines = (Path(tmp) / "errors.jsonl").read_text().splitlines() if (Path(tmp) / "errors.jsonl").exists() \
            else []
    rank: dict[str, int] = {}
    samples = []
    for s in ranked:
        rank[s.input_id] = rank.get(s.input_id, 0) + 1
        ident = f"{s.input_id}#{rank[s.input_id]}"
        samples.append({"id": s.input_id, "rank": rank[s.input_id], "text": s.text, "logprob": round(s.logprob, 4),
                        "status": s.status, "written": s.written, "file": files.get(ident)})
    return {"task": task.name, "format": suffix, "samples": samples, "resampled": res.resampled,
            "errors": error_lines}


def _input_suffix(task: str) -> str:
    return {"pocket": ".fasta", "ligand": ".jsonl", "forward": ".smi", "retro": ".smi", "reaction": ".smi"}.get(
        task, ".txt")


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
