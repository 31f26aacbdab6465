"""``logos serve``: vLLM's OpenAI-compatible server for a LOGOS checkpoint, with the LOGOS tasks by name.

The server is vLLM's own (``/v1/completions``, ``/v1/models``, ``/health``, ...), started with the
LOGOS logits processor (:mod:`logos.generate.vllm_engine`) and the llguidance structured-outputs
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

The same guarantees as ``logos generate --engine vllm``: the task grammar as a structured output,
the chemistry and the composition through the logits processor, every row checked again and
resampled when it fails. A plain ``/v1/completions`` request gets the same constraints when it
carries the grammar and ``vllm_xargs`` (see the README).

Engine options are passed through: ``--tensor-parallel-size``, ``--data-parallel-size``,
``--ray-address`` (a Ray cluster for multi-node; on CPU one process), and any other vLLM server flag
after ``--``.
"""

import os
from pathlib import Path

__all__ = ["LogosEndpoints", "DEFAULT_FORMATS"]

DEFAULT_FORMATS = {"molecule": ".smi", "forward": ".rsmi", "retro": ".rsmi", "reaction": ".rsmi",
                   "protein": ".fasta", "antibody": ".fasta", "pocket": ".pocket.json", "ligand": ".sdf",
                   "crystal": ".cif", "mof": ".json"}


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
            import asyncio

            from logos.util.records import InputError, RecordError

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
    from logos.generate.pipeline import GenerateOptions, finish
    from logos.decoding.sampler import Sampling
    from logos.generate.vllm_engine import sample_jobs
    from logos.tasks import get
    from logos.tasks.prompts import MAX_CELL_ATOMS, PromptOptions, build_prompts, choose_alternatives
    from logos.util.records import ErrorLog, InputError

    task = get(str(body.get("task", "molecule")), "generate")
    n = int(body.get("n", 1))
    if not 1 <= n <= 1024:
        raise InputError("n must be in 1..1024")
    sampling = Sampling(temperature=float(body.get("temperature", 1.0)), top_k=int(body.get("top_k", 0)),
                        top_p=float(body.get("top_p", 1.0)), max_new_tokens=int(body.get("max_new_tokens", 0)))
    options = GenerateOptions(task=task.name, n=n, sampling=sampling, seed=int(body.get("seed", 0)),
                              constrained=not body.get("unconstrained", False),
                              resamples=int(body.get("resamples", GenerateOptions.resamples)),
                              whole_draws=int(body.get("whole_draws", GenerateOptions.whole_draws)))
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
        reading = PromptOptions(cell_composition=bool(body.get("cell_composition", False)),
                                max_cell_atoms=int(body.get("max_cell_atoms", MAX_CELL_ATOMS)))
        prompts = build_prompts(task, inputs, n, errors, reading)
        if not prompts:
            raise InputError("nothing to generate (no usable input)")
        prompts = choose_alternatives(prompts, ck.scorer(run), options.seed)  # a crystal's cell, as logos generate
        ck_jobs = ck.jobs(task, prompts, sampling.max_new_tokens, options.constrained)
        res = sample_jobs(run, ck, task, ck_jobs, options)
        ranked = finish(task, res.samples, out, writer_for(out), WriterOptions(), errors)
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
