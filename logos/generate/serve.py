"""``logos serve``: vLLM's OpenAI-compatible server for a LOGOS checkpoint, with the LOGOS tasks by name.

The server is vLLM's own (``/v1/completions``, ``/v1/models``, ``/health``, ...), started with the
LOGOS logits processor (:mod:`logos.generate.vllm_processor`) and the llguidance structured-outputs
backend, plus two routes added through vLLM's endpoint-plugin interface (entry point
``vllm.endpoint_plugins: logos``, allow-listed by ``logos serve`` through ``VLLM_PLUGINS``):

- ``GET /logos/tasks``: the task names;
- ``POST /logos/generate``: ``{"task": "crystal", "input": "NaCl 225", "n": 4, "seed": 0}`` (``input``: what
  ``logos generate --input`` reads, one record per line: SMILES, a reaction side, a FASTA, a formula
  with an optional space group and ``Z=N``; none for unconditional tasks; ``cell_composition``: true where
  each formula is the cell's whole composition, as ``--cell-composition``; ``max_cell_atoms``;
  ``format``: the output suffix, e.g. ``.cif``, ``.sdf``, ``.pocket.json``) returns, per sample, the grammar
  text, its log-probability, rank and status, and the detokenized file the output format names (``file``:
  CIF, SDF, ... text).

No request can stop the server. The body is read up to ``--max-mb`` (413 beyond), parsed and checked
field by field on the event loop (400: not JSON or not an object; 422: an unknown field, a wrong type
or a value out of range, the field named). Everything else a request needs - its input's records,
bounded before a library sees them by the limits of ``logos tokenize`` (:class:`InputLimits`), the
prompts, the checks of every finished sample, the files - runs in a process of its own
(:mod:`logos.generate.serve_work`, forked from a fork server that holds the checkpoint's tokenizer),
awaited without blocking the event loop; the process asks this one for the engine's outputs, and its
own work is limited to ``--timeout`` seconds (waits for the engine do not count). A refused input
is a 422 naming the input and the reason (``input 2: invalid SMILES 'C1CC(': SMILES parse error at
position 5: syntax error``, ``input 1: space group 999: not in 1-230``), as is a library that crashes
or stalls on it; at most ``--workers`` requests are worked on at once, the others wait their turn, and
``/health`` and other requests go on meanwhile. On SIGTERM or Ctrl-C the requests at work or waiting
are answered 503 at once and their processes killed.

The same guarantees as ``logos generate --engine vllm``: the task grammar as a structured output,
the chemistry and the composition through the logits processor, every row checked again and
resampled when it fails. A plain ``/v1/completions`` request gets the same constraints when it
carries the grammar and ``vllm_xargs`` (see the README).
"""

import json  # (no postponed annotations in this module: FastAPI reads the routes' ``Request`` annotation)
import math
import os
from dataclasses import asdict

from logos.tasks.prompts import MAX_CELL_ATOMS
from logos.data.limits import SERVE_LIMITS, InputLimits

__all__ = ["LogosEndpoints", "DEFAULT_FORMATS", "RequestError", "ServeSettings", "parse_request", "SETTINGS_ENV",
           "CHECKPOINT_ENV", "MAX_SAMPLES", "SERVE_LIMITS", "INPUT_FORMATS", "FIELDS"]

CHECKPOINT_ENV = "LOGOS_SERVE_CHECKPOINT"  # the checkpoint logos serve serves (read by the routes and the fork server)
SETTINGS_ENV = "LOGOS_SERVE_SETTINGS"      # the limits and workers of logos serve (JSON of ServeSettings)
MAX_SAMPLES = 1024  # samples one request may ask for (n, or n per input times the inputs)

DEFAULT_FORMATS = {"molecule": ".smi", "forward": ".rsmi", "retro": ".rsmi", "reaction": ".rsmi",
                   "protein": ".fasta", "antibody": ".fasta", "pocket": ".pocket.json", "ligand": ".sdf",
                   "crystal": ".cif", "mof": ".json"}
INPUT_FORMATS = (".smi", ".rsmi", ".txt", ".fasta", ".fa", ".faa", ".fas", ".jsonl", ".pdb", ".ent", ".cif", ".mmcif")

# The fields of a /logos/generate body: (type, default, (low, high) or None). Integers are JSON integers
# (not booleans); numbers are integers or finite floats.
FIELDS: dict[str, tuple[type, object, tuple | None]] = {
    "task": (str, "molecule", None),
    "input": (str, None, None),
    "input_format": (str, None, None),
    "format": (str, None, None),
    "n": (int, 1, (1, MAX_SAMPLES)),
    "seed": (int, 0, (0, 2**63 - 1)),
    "temperature": (float, None, (0.0, 100.0)),  # None: the task's
    "top_k": (int, 0, (0, 2**31 - 1)),
    "top_p": (float, 1.0, (1e-9, 1.0)),
    "max_new_tokens": (int, 0, (0, 2**31 - 1)),
    "resamples": (int, 8, (0, 64)),
    "whole_draws": (int, 16, (0, 64)),
    "unconstrained": (bool, False, None),
    "cell_composition": (bool, False, None),
    "max_cell_atoms": (int, MAX_CELL_ATOMS, (1, 1000)),
}


class RequestError(Exception):
    """A request answered with ``status`` (4xx: the request's fault) and ``message``; ``refused``: each refused
    input as ``{"input": N, "reason": ...}``."""

    def __init__(self, status: int, message: str, refused: list | None = None):
        super().__init__(status, message, refused)
        self.status, self.message, self.refused = status, message, refused or []

    def payload(self) -> dict:
        return {"error": self.message, **({"refused": self.refused} if self.refused else {})}


class ServeSettings:
    """What ``logos serve`` passes to its routes: the input limits and the number of request workers."""

    def __init__(self, limits: InputLimits | None = None, workers: int = 16):
        self.limits, self.workers = limits or InputLimits(), workers

    def to_json(self) -> str:
        return json.dumps({"limits": asdict(self.limits), "workers": self.workers})

    @classmethod
    def from_environment(cls) -> "ServeSettings":
        raw = os.environ.get(SETTINGS_ENV)
        if not raw:
            return cls(InputLimits(**SERVE_LIMITS))
        data = json.loads(raw)
        return cls(InputLimits(**data["limits"]), int(data["workers"]))


# ---------------------------------------------------------------------------------------------- the body
def _typed(name: str, value, kind: type, bounds: tuple | None):
    """``value`` checked against the field's type and range; RequestError(422) naming the field."""
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(422, f"{name}: expected an integer, got {_shown(value)}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RequestError(422, f"{name}: expected a number, got {_shown(value)}")
        value = float(value)
    elif not isinstance(value, kind):
        raise RequestError(422, f"{name}: expected {'a string' if kind is str else 'true or false'}, "
                                f"got {_shown(value)}")
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        low, high = bounds
        raise RequestError(422, f"{name} {value}: not in {low:g}..{high:g}" if kind is float else
                                f"{name} {value}: not in {low}..{high}")
    return value


def _shown(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_request(raw: bytes, max_model_len: int | None = None) -> dict:
    """The fields of a ``/logos/generate`` body, checked (types, ranges, the task, the formats) with defaults filled
    in; RequestError 400 (not JSON, not an object) or 422 (the field and the reason). The input's records are
    bounded later, in the request's own process."""
    from logos.tasks import ALIASES, TASKS, names

    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError(400, f"the body must be a JSON object of fields, not {type(body).__name__} "
                                f"({', '.join(FIELDS)})")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise RequestError(422, f"unknown field {unknown[0]!r} (known: {', '.join(FIELDS)})")
    req = {}
    for name, (kind, default, bounds) in FIELDS.items():
        value = body.get(name)
        req[name] = default if value is None else _typed(name, value, kind, bounds)
    tasks = names("generate")
    task = ALIASES.get(req["task"], req["task"])
    if task not in tasks or TASKS[task].start is None:
        raise RequestError(422, f"task {_shown(req['task'])}: not a generation task ({', '.join(tasks)})")
    req["task"] = task
    if TASKS[task].conditional and not (req["input"] or "").strip():
        raise RequestError(422, f"task {task} needs an input (one record per line)")
    if req["input_format"] is not None and req["input_format"] not in INPUT_FORMATS:
        raise RequestError(422, f"input_format {_shown(req['input_format'])}: not one of {', '.join(INPUT_FORMATS)}")
    if req["format"] is not None and not _is_suffix(req["format"]):
        raise RequestError(422, f"format {_shown(req['format'])}: not an output suffix such as .sdf or .cif")
    if max_model_len and req["max_new_tokens"] >= max_model_len:
        raise RequestError(422, f"max_new_tokens {req['max_new_tokens']}: not below the server's --max-model-len "
                                f"{max_model_len}")
    return req


def _is_suffix(text: str) -> bool:
    import re

    return re.fullmatch(r"(\.[a-z0-9_]{1,12}){1,3}", text) is not None


# ------------------------------------------------------------------------------------------------- the routes
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
            from logos.tasks import names

            return {"tasks": names("generate")}

        @router.post("/logos/generate")
        async def generate(request: Request):
            state = request.app.state
            if getattr(state, "logos_engine", None) is None:
                return JSONResponse({"error": "this server has no engine"}, status_code=503)
            try:
                raw = await _read_body(request, state.logos_settings.limits.max_mb)
                req = parse_request(raw, state.logos_max_model_len)
                return await _work(state, req)
            except RequestError as e:
                return JSONResponse(e.payload(), status_code=e.status)

        app.include_router(router)

    async def init_state(self, engine_client, state, args) -> None:
        import asyncio
        import multiprocessing as mp
        import multiprocessing.forkserver

        state.logos_engine = engine_client
        if engine_client is None:  # a render-only server: the routes answer 503
            return
        if not os.environ.get(CHECKPOINT_ENV):
            os.environ[CHECKPOINT_ENV] = str(args.model)
        state.logos_checkpoint = os.environ[CHECKPOINT_ENV]
        state.logos_settings = ServeSettings.from_environment()
        state.logos_max_model_len = int(getattr(getattr(engine_client, "model_config", None), "max_model_len", 0)
                                        or getattr(args, "max_model_len", 0) or 0)
        # Each request's process forks from this server's fork server, which has loaded the request worker and
        # the checkpoint's tokenizer once (logos.generate.serve_work reads CHECKPOINT_ENV when it is imported).
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["logos.generate.serve_work"])
        multiprocessing.forkserver.ensure_running()
        state.logos_ctx = ctx
        state.logos_slots = asyncio.Semaphore(max(1, state.logos_settings.workers))


async def _read_body(request, max_mb: float) -> bytes:
    """The body, at most ``max_mb`` megabytes (RequestError 413 beyond, before it is all read)."""
    cap = int(max_mb * 1e6) if max_mb else None
    declared = request.headers.get("content-length")
    if cap is not None and declared is not None and declared.isdigit() and int(declared) > cap:
        raise RequestError(413, f"the body is {int(declared) / 1e6:,.1f} MB, more than --max-mb {max_mb:g}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if cap is not None and size > cap:
            raise RequestError(413, f"the body is more than --max-mb {max_mb:g} MB")
        chunks.append(chunk)
    return b"".join(chunks)


async def _work(state, req: dict) -> dict:
    """The request's work (:func:`_isolated_work`), answered 503 as soon as the server is shutting down."""
    import asyncio

    work = asyncio.ensure_future(_isolated_work(state, req))
    stop = asyncio.ensure_future(_shutting_down(state))
    try:
        await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not work.done():
            work.cancel()  # its process is killed
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled():
        raise RequestError(503, "the server is shutting down")
    return work.result()


async def _shutting_down(state) -> None:
    """Returns once the server has been told to stop (SIGTERM, Ctrl-C: vLLM sets its HTTP server's ``should_exit``)."""
    import asyncio

    while not getattr(getattr(state, "server", None), "should_exit", False):
        await asyncio.sleep(0.2)


async def _isolated_work(state, req: dict) -> dict:
    """The request's own work in an isolated process (:mod:`logos.generate.serve_work`), the engine driven here."""
    from logos.util.isolate import IsolatedFailure, call_isolated

    settings = state.logos_settings
    async with state.logos_slots:  # at most --workers requests at work; the others wait here
        try:
            return await call_isolated("logos.generate.serve_work:handle", req, settings.limits,
                                       state.logos_max_model_len, state.logos_checkpoint, ctx=state.logos_ctx,
                                       timeout=settings.limits.timeout,
                                       answer=lambda message: _engine(state.logos_engine, message))
        except IsolatedFailure as e:
            if e.stage and e.stage.startswith("input "):  # a library crashed or stalled on this input record
                reason = f"reading it {e.reason}"  # "timed out after 60 s", "crashed (killed by SIGSEGV)"
                raise RequestError(422, f"{e.stage}: refused: {reason}",
                                   [{"input": int(e.stage.split()[1]), "reason": reason}]) from None
            raise RequestError(500, f"the request's work {e.reason} while {e.stage or 'starting'}") from None
        except RequestError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug or a broken install: one line, the server goes on
            raise RequestError(500, f"the request failed: {type(e).__name__}: {e}") from None


async def _engine(engine_client, message) -> list:
    """The engine's final output of each ``(request, sampling params)`` the request's process asked for."""
    import asyncio
    import uuid

    requests, params = message

    async def one(req, p):
        final = None
        async for out in engine_client.generate(req, p, request_id=f"logos-{uuid.uuid4().hex}"):
            final = out
        return final

    try:
        return list(await asyncio.gather(*(one(r, p) for r, p in zip(requests, params))))
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - told to the request's process as one line it can carry back
        if "dead" in type(e).__name__.lower():  # vLLM's EngineDeadError: stopped by SIGTERM or Ctrl-C, or failed
            raise RequestError(503, "the engine has stopped: the server is shutting down, or its engine failed "
                                    "(see the server's log)") from None
        raise RequestError(500, f"the engine refused the request: {type(e).__name__}: {e}") from None
