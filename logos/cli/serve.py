"""``logos serve`` and the engine flags of ``logos generate --engine vllm``: argparse, and the launch of vLLM's
OpenAI-compatible server with the LOGOS routes (:mod:`logos.generate.serve`) and logits processor.

Engine options are passed through: ``--tensor-parallel-size``, ``--data-parallel-size``,
``--ray-address`` (a Ray cluster for multi-node; on CPU one process), and any other vLLM server flag
after ``--``. The input limits (``--timeout``, ``--max-atoms``, ``--max-mb``, ``--max-chars``,
``--max-residues``, ``--max-records``) are those of ``logos tokenize`` and ``logos generate``, with a
server's defaults (:data:`logos.data.limits.SERVE_LIMITS`), and ``--workers`` bounds the requests
at work at once (:mod:`logos.generate.serve`).
"""

import argparse
import os
import sys
from pathlib import Path

__all__ = ["add_engine_arguments", "engine_options", "add_serve_parser", "GRACE"]

GRACE = 3  # seconds the server gives running requests to finish after SIGTERM or Ctrl-C


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
    from logos.util.records import InputError

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
    p.add_argument("--workers", type=int, default=16, metavar="N",
                   help="requests worked on at once, each in its own isolated process (the others wait their turn; "
                        "default 16)")
    from logos.cli.limits import add_limit_arguments
    from logos.data.limits import SERVE_LIMITS

    add_limit_arguments(p, helps={  # a request's input bounded as tokenize bounds a file
        "timeout": "seconds of a request's own work (in its isolated process; waits for the engine do not count) "
                   "before it is refused",
        "max_mb": "refuse request bodies larger than this"}, **SERVE_LIMITS)
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
    from logos.cli.limits import limits_of
    from logos.generate.serve import CHECKPOINT_ENV, SETTINGS_ENV, ServeSettings
    from logos.generate.vllm_engine import EngineOptions, engine_environment, on_cpu
    from logos.util.records import InputError
    from logos.util.resources import resolve

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
    if args.workers < 1:
        raise InputError("--workers must be at least 1")
    os.environ[CHECKPOINT_ENV] = str(checkpoint)
    os.environ[SETTINGS_ENV] = ServeSettings(limits_of(args), args.workers).to_json()
    parser = make_arg_parser(FlexibleArgumentParser(prog="logos serve"))
    vargs = parser.parse_args(server_argv(checkpoint, args, on_cpu()))
    validate_parsed_serve_args(vargs)
    print(f"serve: {checkpoint} on http://{args.host}:{args.port} (OpenAI API at /v1, LOGOS tasks at "
          "/logos/generate)", file=sys.stderr, flush=True)
    # On SIGTERM or Ctrl-C, requests still at work after GRACE seconds are cancelled (their processes killed).
    uvloop.run(run_server(vargs, timeout_graceful_shutdown=GRACE))
    return 0
