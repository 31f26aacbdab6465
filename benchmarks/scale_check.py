"""The 1B preset at its real shape on one CPU machine, end to end: ZeRO-3 on 2 processes, memory against the plan,
SIGTERM and exact resume, a sharded bf16 export that plain transformers and vLLM load, constrained generation.

Every step runs the project's commands on ``pretrain/1b.yaml``'s model (Llama-3.2-1B shape, 978M parameters),
overriding only what a CPU needs (sequence, batch, fp32, ZeRO-3 through gloo) and what a short check needs (a few
steps, a checkpoint at the end or on a signal, no validation split). The optimizer is the preset's: AdamW at peak
LR 3e-4 with 2,000 warm-up steps, so the check's steps are the first steps of a real run (LR 1.5e-7, 3e-7, ...),
small enough to lower the loss of one batch at every step (a full-LR Adam step from a random 2048-wide model
overshoots it):

1. **Shards**: the 500-molecule MOSES fixture, tokenized (``logos tokenize``) and packed (``logos pack``) so that the
   training split holds exactly one global batch of rows: every step trains on the same batch, so its loss must
   fall from step to step.
2. **Plan**: ``logos plan --device cpu --processes 2`` for the same setting (the per-process accounting).
3. **Training**: ``logos pretrain`` as two ranks (RANK/WORLD_SIZE/MASTER_* set as ``torchrun`` sets them; the ranks
   are this script's own children, so ``wait4`` gives each one's peak resident set), the model built partitioned
   (ZeRO-3 ``zero.Init``): an uninterrupted run of ``--steps`` steps; then the same run sent SIGTERM (both ranks, as
   a scheduler does) after its first logged step, which finishes the step, writes its sharded checkpoint and exits
   143; ``--resume`` continues it, and every later step's loss must equal the uninterrupted run's to 1e-6.
4. **Export**: ``logos export`` of the uninterrupted run's ZeRO-3 checkpoint, bf16, with a shard size that forces
   at least two safetensors files and an index; loaded by ``AutoModelForCausalLM``/``AutoTokenizer`` in a process
   that cannot import this project (transformers of the main venv, and 4.57 installed into a temporary folder when
   PyPI answers), and by ``vllm.LLM`` in the vLLM venv.
5. **Generation**: from that export, the built-in engine and ``--engine vllm`` (the functions ``logos generate``
   calls) each write 16 molecules under the grammar and chemistry constraints; every row must end and every written
   molecule parse in RDKit. Reported per engine: step time less the constraints, the grammar masks per step, the row
   constraints per row and step, and the constraints' share of a step.

Everything is written under one temporary folder, removed at the end. Results: a table on stdout and a section
of BENCHMARKS.md (per shape, with the commit and the machine's load).

    make scale-check                                                   # the 1B shape, ~20 GiB, ~14 min
    python benchmarks/scale_check.py --hidden 1024 --layers 6           # a reduced shape (~94M), same code path
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "pretrain" / "1b.yaml"
GiB = 1024**3
TRANSFORMERS_4 = ["transformers==4.57.6", "tokenizers==0.22.2", "huggingface-hub==0.36.0"]
RANKS = 2


# ----------------------------------------------------------------------------------------------- helpers
def log(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def mem_available() -> int:
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def project_env(**extra) -> dict:
    """Environment of a child that runs this checkout: one torch thread, no launcher variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT", "PYTHONPATH")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
    env.update(extra)
    return env


def bare_env(pythonpath: str | None = None) -> dict:
    """Environment of a child that must not see this project (a plain reader of the export)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                             "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return env


def run(cmd: list, what: str, timeout: float, **kw) -> subprocess.CompletedProcess:
    t = time.perf_counter()
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kw)
    log(f"{what}: exit {proc.returncode} in {time.perf_counter() - t:.0f} s")
    return proc


def fail(why: str) -> None:
    raise SystemExit(f"scale check: {why}")


# ----------------------------------------------------------------------------------------------- settings
def overrides(args, data: Path, out: Path) -> list[str]:
    """``--set`` values of every run: CPU precision and batch, ZeRO-3 without the GPU JSON, a short schedule."""
    sets = {"train.data": data, "train.out_dir": out, "train.tokenizer": REPO / "tokenizers" / "default",
            "train.seq_len": args.seq_len, "train.micro_batch": args.micro_batch, "train.grad_accum": 1,
            "train.precision": "fp32", "train.zero_stage": 3, "train.deepspeed": "null",
            "train.max_steps": args.steps, "train.max_minutes": "null",
            "train.log_every": 1, "train.eval_every": 0, "train.save_every": args.steps,
            "train.keep_checkpoints": 1}
    if args.hidden:  # a reduced shape: head size 64, a quarter of the heads for keys and values, MLP 4x
        heads = args.hidden // 64
        sets.update({"model.hidden_size": args.hidden, "model.num_heads": heads,
                     "model.num_kv_heads": max(1, heads // 4), "model.intermediate_size": 4 * args.hidden})
    if args.layers:
        sets["model.num_layers"] = args.layers
    return [f"{k}={v}" for k, v in sets.items()]


def set_args(sets: list[str]) -> list[str]:
    return [a for s in sets for a in ("--set", s)]


def logos(*argv) -> list[str]:
    return [sys.executable, "-m", "logos.cli", *[str(a) for a in argv]]


# ----------------------------------------------------------------------------------------------- 1. shards
def make_shards(work: Path, rows: int, seq_len: int) -> Path:
    """The fixture tokenized, then packed twice: once to learn each document's length, then with exactly the
    documents whose tokens fill ``rows`` rows of ``seq_len + 1`` tokens (the row count is (tokens - 1) // L);
    two more documents are the validation split, shorter than one row, so no run evaluates."""
    corpus = work / "moses.jsonl"
    proc = run(logos("tokenize", REPO / "tests" / "assets" / "moses_500.smi", "-o", corpus, "-q"), "tokenize", 300,
               env=project_env())
    if proc.returncode != 0:
        fail(f"logos tokenize failed:\n{proc.stderr[-2000:]}")
    records = [line for line in corpus.read_text().splitlines() if line.strip() and "logos_header" not in line]
    header = [line for line in corpus.read_text().splitlines() if "logos_header" in line]
    probe = work / "probe"
    all_train, none_val = work / "all.jsonl", work / "none.jsonl"
    all_train.write_text("\n".join(header + records) + "\n")
    none_val.write_text("\n".join(header + records[-2:]) + "\n")
    if run(logos("pack", all_train, "--val", none_val, "-o", probe, "-q"), "pack (lengths)", 300,
           env=project_env()).returncode != 0:
        fail("logos pack failed")
    import numpy as np

    starts = np.load(probe / "train.docs.npy", allow_pickle=False)[:, 0]
    total = json.loads((probe / "meta.json").read_text())["tokens"]["train"]
    ends = list(starts[1:]) + [total]
    need = rows * seq_len + 1
    k = next((i + 1 for i, end in enumerate(ends) if end >= need), None)
    if k is None or k + 2 > len(records):
        fail(f"the fixture holds {total} tokens; {need} are needed for {rows} rows of {seq_len}")
    shutil.rmtree(probe)
    train, val = work / "train.jsonl", work / "val.jsonl"
    train.write_text("\n".join(header + records[:k]) + "\n")
    val.write_text("\n".join(header + records[k:k + 2]) + "\n")
    shards = work / "shards"
    if run(logos("pack", train, "--val", val, "-o", shards, "-q"), "pack", 300, env=project_env()).returncode != 0:
        fail("logos pack failed")
    meta = json.loads((shards / "meta.json").read_text())
    got = (meta["tokens"]["train"] - 1) // seq_len
    if got != rows or meta["tokens"]["val"] > seq_len:
        fail(f"packed {got} training rows (wanted {rows}), {meta['tokens']['val']} validation tokens")
    log(f"shards: {k} molecules, {meta['tokens']['train']} tokens = {rows} rows of {seq_len}")
    return shards


# ----------------------------------------------------------------------------------------------- 3. training
class Ranks:
    """``logos pretrain`` as two ranks, children of this process (their peak resident sets come from wait4)."""

    def __init__(self, sets: list[str], logs: Path, resume: bool = False):
        from logos.train.distributed import free_port

        port = str(free_port())
        cmd = logos("pretrain", "--config", RECIPE, "-q", *set_args(sets)) + (["--resume"] if resume else [])
        self.start = time.perf_counter()
        self.procs, self.files = [], []
        for rank in range(RANKS):
            fh = open(logs.with_name(f"{logs.name}.rank{rank}.log"), "w")
            self.files.append(fh)
            self.procs.append(subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=project_env(
                RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(RANKS), MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port)))
        self.codes: list[int | None] = [None] * RANKS
        self.peaks = [0] * RANKS

    def poll(self) -> bool:
        """Reap the ranks that ended; True while one still runs."""
        for i, p in enumerate(self.procs):
            if self.codes[i] is None:
                pid, status, usage = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    self.codes[i] = os.waitstatus_to_exitcode(status)
                    self.peaks[i] = usage.ru_maxrss * 1024  # Linux: KiB
                    p.returncode = self.codes[i]
        return any(c is None for c in self.codes)

    def signal(self, sig) -> None:
        for i, p in enumerate(self.procs):
            if self.codes[i] is None:
                p.send_signal(sig)

    def wait(self, timeout: float) -> float:
        while self.poll():
            if time.perf_counter() - self.start > timeout:
                self.signal(signal.SIGKILL)
                while self.poll():
                    time.sleep(0.2)
                fail(f"a training run passed {timeout:.0f} s; killed")
            time.sleep(0.2)
        for fh in self.files:
            fh.close()
        return time.perf_counter() - self.start

    def tail(self) -> str:
        return "\n".join(Path(fh.name).read_text()[-1500:] for fh in self.files)


def losses(run_dir: Path) -> dict[int, float]:
    path = run_dir / "metrics.csv"
    if not path.exists():
        return {}
    with open(path, newline="") as fh:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(fh) if r.get("loss")}


def train_and_resume(args, shards: Path, work: Path) -> dict:
    straight, broken = work / "run_straight", work / "run_signalled"
    log(f"training: {args.steps} steps uninterrupted, 2 ranks, ZeRO-3")
    ranks = Ranks(overrides(args, shards, straight), work / "straight", resume=False)
    seconds = ranks.wait(args.timeout)
    if ranks.codes != [0] * RANKS:
        fail(f"the uninterrupted run ended with {ranks.codes}:\n{ranks.tail()}")
    reference = losses(straight)
    result = {"straight_seconds": seconds, "peak": ranks.peaks, "losses": reference}
    steps = [reference.get(s) for s in range(1, args.steps + 1)]
    if any(v is None or v != v or abs(v) == float("inf") for v in steps):
        fail(f"missing or non-finite losses {reference}")
    result["decreasing"] = all(b < a for a, b in zip(steps, steps[1:]))
    log(f"losses {', '.join(f'{v:.6f}' for v in steps)}; peaks {[round(p / GiB, 2) for p in ranks.peaks]} GiB")
    ckpt = straight / "checkpoints"
    latest = (ckpt / "latest").read_text().strip()
    result["checkpoint_bytes"] = sum(p.stat().st_size for p in (ckpt / latest).rglob("*") if p.is_file())
    result["checkpoint_files"] = sorted(p.name for p in (ckpt / latest).iterdir())

    log("training: the same run, SIGTERM to both ranks after its first logged step")
    ranks = Ranks(overrides(args, shards, broken), work / "signalled", resume=False)
    sent = None
    while ranks.poll():
        if sent is None and losses(broken):
            ranks.signal(signal.SIGTERM)
            sent = time.perf_counter() - ranks.start
        if time.perf_counter() - ranks.start > args.timeout:
            ranks.signal(signal.SIGKILL)
        time.sleep(0.2)
    ranks.wait(args.timeout)
    if sent is None:
        fail(f"the run ended before its first step was logged: {ranks.codes}\n{ranks.tail()}")
    stopped = int((broken / "checkpoints" / "latest").read_text().strip()[4:])
    result.update(signal_codes=ranks.codes, stopped_at=stopped, signalled_peak=ranks.peaks)
    log(f"SIGTERM: exit codes {ranks.codes}, checkpoint at step {stopped}")
    if ranks.codes != [143] * RANKS or stopped >= args.steps:
        fail(f"SIGTERM: exit codes {ranks.codes} (want 143 on both), stopped at step {stopped}:\n{ranks.tail()}")
    ranks = Ranks(overrides(args, shards, broken), work / "resumed", resume=True)
    result["resume_seconds"] = ranks.wait(args.timeout)
    result["resumed_peak"] = ranks.peaks
    if ranks.codes != [0] * RANKS:
        fail(f"--resume ended with {ranks.codes}:\n{ranks.tail()}")
    got = losses(broken)
    later = range(stopped + 1, args.steps + 1)
    result["resume_diff"] = max(abs(got[s] - reference[s]) for s in later)
    result["resume_pairs"] = [(s, got[s], reference[s]) for s in later]
    log(f"resume: steps {list(later)}, largest |loss - uninterrupted| {result['resume_diff']:.2e}")
    shutil.rmtree(broken)
    return result


# ----------------------------------------------------------------------------------------------- 4. export
READ_CHECK = r"""
import json, sys, torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
assert "logos" not in sys.modules
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
ids = tok("<MoleculeS>CC(=O)Oc1ccccc1C(=O)O<MoleculeE>", add_special_tokens=False, return_tensors="pt").input_ids
with torch.no_grad():
    logits = model(input_ids=ids).logits.float()
print(json.dumps({"transformers": transformers.__version__, "class": type(model).__name__,
                  "tokenizer": type(tok).__name__, "parameters": sum(p.numel() for p in model.parameters()),
                  "tokens": ids.shape[1], "finite": bool(torch.isfinite(logits).all()),
                  "dtype": str(next(model.parameters()).dtype), "logos_loaded": "logos" in sys.modules}))
"""

VLLM_CHECK = r"""
import json, sys
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    path = sys.argv[1]
    llm = LLM(model=path, dtype="float32", max_model_len=64, enforce_eager=True, trust_remote_code=False, seed=0)
    out = llm.generate(["<MoleculeS>C"], SamplingParams(max_tokens=8, temperature=1.0, skip_special_tokens=False))
    import vllm
    print(json.dumps({"vllm": vllm.__version__, "tokens": len(out[0].outputs[0].token_ids),
                      "logos_loaded": "logos" in sys.modules}))
"""


def export_and_read(args, work: Path, params: int) -> dict:
    export = work / "export"
    shard = max(1, 2 * params // 2 - 1)  # bf16 bytes / 2 (less a byte): at least two files
    proc = run(logos("export", work / "run_straight", "-o", export, "--shard-size", shard), "logos export", 1200,
               env=project_env())
    if proc.returncode != 0:
        fail(f"logos export failed:\n{proc.stderr[-2000:]}")
    index = json.loads((export / "model.safetensors.index.json").read_text())
    files = sorted(p.name for p in export.glob("model-*.safetensors"))
    from safetensors import safe_open

    dtypes = set()
    for f in files:
        with safe_open(str(export / f), framework="pt") as fh:
            dtypes |= {str(fh.get_slice(k).get_dtype()) for k in fh.keys()}
    result = {"export_files": files, "export_bytes": sum((export / f).stat().st_size for f in files),
              "index_entries": len(index["weight_map"]), "export_dtypes": sorted(dtypes), "shard_size": shard}
    if len(files) < 2 or set(index["weight_map"].values()) != set(files):
        fail(f"the export has {files}; the index names {sorted(set(index['weight_map'].values()))}")
    shutil.rmtree(work / "run_straight")  # the checkpoints are the largest files: gone once exported
    script = work / "read_check.py"
    script.write_text(READ_CHECK)
    readers = {}
    main = run([sys.executable, "-I", script, export], "transformers (main venv) load", 900, env=bare_env(),
               cwd=work)
    readers["main"] = _json_line(main)
    tf4 = work / "transformers4"
    pip = run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", tf4, *TRANSFORMERS_4],
              "pip install transformers 4.57 (temporary folder)", 600)
    if pip.returncode == 0:
        four = run([sys.executable, script, export], "transformers 4.57 load", 900, env=bare_env(str(tf4)), cwd=work)
        readers["4.57"] = _json_line(four)
    else:
        readers["4.57"] = {"error": f"not installed: {pip.stderr.strip().splitlines()[-1] if pip.stderr else '?'}"}
    shutil.rmtree(tf4, ignore_errors=True)
    if args.vllm_python and Path(args.vllm_python).exists():
        vscript = work / "vllm_check.py"
        vscript.write_text(VLLM_CHECK)
        proc = run([args.vllm_python, "-I", vscript, export], "vLLM (CPU) load", 900, cwd=work,
                   env={**bare_env(), **vllm_env(work)})
        readers["vllm"] = _json_line(proc)
    else:
        readers["vllm"] = {"error": f"no vLLM venv at {args.vllm_python} (make venv-vllm)"}
    result["readers"] = readers
    return result


def vllm_env(work: Path) -> dict:
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING",
            "LOGOS_VLLM_STATS": str(work / "vllm_stats.json"), "VLLM_CACHE_ROOT": str(work / "vllm_cache")}


def _json_line(proc: subprocess.CompletedProcess) -> dict:
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}


# ----------------------------------------------------------------------------------------------- 5. generation
def generate_worker(engine: str, checkpoint: Path, out: Path, n: int, budget: int) -> None:
    """One engine's 16 molecules through the functions ``logos generate`` calls; one JSON line of measurements."""
    from logos.generate import GenerateOptions, Sampling
    import logos.generate.pipeline as pipeline

    loaded = {}
    if engine == "builtin":
        load = pipeline.load_checkpoint

        def timed_load(*a, **k):  # the model load is not part of the sampling steps
            t = time.perf_counter()
            try:
                return load(*a, **k)
            finally:
                loaded["seconds"] = time.perf_counter() - t

        pipeline.load_checkpoint = timed_load
    # a random model almost never ends the record after a molecule: keep its first finished one (no whole-record
    # redraws), as benchmarks/vllm_bench.py does for its random model
    options = GenerateOptions(task="molecule", n=n, batch_size=n, seed=0, whole_draws=0,
                              sampling=Sampling(max_new_tokens=budget))
    t = time.perf_counter()
    if engine == "builtin":
        result = pipeline.generate(checkpoint, out, options, progress=False)
    else:
        from logos.generate.vllm_engine import generate_vllm

        result = generate_vllm(checkpoint, out, options, progress=False)
    wall = time.perf_counter() - t
    s = result.stats
    row = {"engine": engine, "n": len(result.samples), "written": result.written,
           "ended": sum(x.status == "done" for x in result.samples), "resampled": result.resampled,
           "tokens": result.tokens, "wall_s": wall, "summary": result.summary()}
    if engine == "builtin":
        busy = s.steps - s.idle_steps
        sampling = result.seconds - loaded.get("seconds", 0.0)
        row.update(load_s=loaded.get("seconds"), steps=busy,
                   step_ms=1000 * (sampling - s.mask_seconds - s.check_seconds) / max(busy, 1),
                   mask_ms=1000 * s.mask_seconds / max(s.steps, 1),
                   row_us=1e6 * s.check_seconds / max(s.row_steps, 1), rows=n)
    else:
        e = result.engine
        row_steps, processor_s = e.counts.policy.row_steps, e.counts.seconds
        row.update(sample_s=e.sample_seconds, row_steps=row_steps, row_us=1e6 * processor_s / max(row_steps, 1),
                   rows=e.rows, step_ms=1000 * (e.sample_seconds - processor_s) / max(row_steps, 1) * e.rows,
                   first_try_valid=e.first_try_valid)
    print(json.dumps(row), flush=True)


def generate_both(args, work: Path) -> dict:
    export = work / "export"
    out = {}
    for engine in ("builtin", "vllm"):
        python = sys.executable if engine == "builtin" else args.vllm_python
        if engine == "vllm" and not (python and Path(python).exists()):
            out[engine] = {"error": f"no vLLM venv at {python} (make venv-vllm)"}
            continue
        smi = work / f"{engine}.smi"
        env = project_env(**(vllm_env(work) if engine == "vllm" else {}))
        proc = run([python, __file__, "--generate-worker", engine, "--checkpoint", export, "--out", smi,
                    "--molecules", args.molecules, "--budget", args.budget], f"generate ({engine})", 1800, env=env,
                   cwd=work)
        row = _json_line(proc)
        if "error" not in row:
            row["valid"], row["smiles"] = _valid_smiles(smi)
        else:
            row["error"] += "\n" + proc.stderr[-1500:]
        out[engine] = row
    return out


def _valid_smiles(path: Path) -> tuple[int, int]:
    from rdkit import Chem, RDLogger

    RDLogger.DisableLog("rdApp.*")
    lines = [ln.split()[0] for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
    return sum(Chem.MolFromSmiles(s) is not None for s in lines), len(lines)


# ----------------------------------------------------------------------------------------------- report
def command_line(args) -> str:
    """The command that repeats this run (the vLLM venv as ``make venv-vllm`` places it)."""
    defaults = {"hidden": None, "layers": None, "seq_len": 256, "micro_batch": 1, "steps": 3, "molecules": 16,
                "budget": 64}
    given = [f"--{k.replace('_', '-')} {getattr(args, k)}" for k, v in defaults.items() if getattr(args, k) != v]
    return " ".join(["OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/scale_check.py", *given,
                     "--vllm-python .venv-vllm/bin/python"])


def report(args, info: dict) -> str:
    plan, tr, ex, gen = info["plan"], info["train"], info["export"], info["generate"]
    shape = "The 1B shape (pretrain/1b.yaml)" if not (args.hidden or args.layers) else \
        f"A reduced shape (hidden {args.hidden or 2048}, {args.layers or 16} layers)"
    lines = [f"Measured {info['date']} at {info['commit']} on {info['cpus']} CPU cores, one torch thread per process; "
             f"load average {info['load_start']} at the start and {info['load_end']} at the end (the machine is "
             f"shared; times are upper bounds); {info['available_gib']:.1f} GiB available at the start. "
             f"{shape}: {plan['parameters']:,} parameters, ZeRO-3 on 2 processes (gloo), fp32, sequence "
             f"{args.seq_len}, micro-batch {args.micro_batch}, gradient checkpointing; whole check "
             f"{info['seconds'] / 60:.1f} min.", "", "```", info["command"], "```", "",
             "| check | result |", "|---|---|"]
    steps = [tr["losses"][s] for s in sorted(tr["losses"])]
    lines.append(f"| losses, same batch each step (the preset's warm-up: LR 1.5e-7 x step) | "
                 f"{' -> '.join(f'{v:.6f}' for v in steps)} ({'falling' if tr['decreasing'] else 'NOT falling'}) |")
    lines.append(f"| uninterrupted run ({args.steps} steps, build and final save included) | "
                 f"{tr['straight_seconds']:.0f} s |")
    lines.append(f"| sharded checkpoint | {len(tr['checkpoint_files'])} files, "
                 f"{tr['checkpoint_bytes'] / GiB:.2f} GiB |")
    lines.append(f"| SIGTERM after the first logged step | exit {tr['signal_codes']}, checkpoint at step "
                 f"{tr['stopped_at']} |")
    lines.append(f"| `--resume`, steps {tr['stopped_at'] + 1}-{args.steps} against the uninterrupted run | largest "
                 f"difference {tr['resume_diff']:.1e} ({'within' if tr['resume_diff'] <= 1e-6 else 'OUTSIDE'} "
                 f"1e-6) |")
    lines.append(f"| `logos export --shard-size {ex['shard_size']}` | {len(ex['export_files'])} safetensors files + "
                 f"index ({ex['index_entries']} tensors), {ex['export_bytes'] / GiB:.2f} GiB, "
                 f"{'/'.join(ex['export_dtypes'])} |")
    for name, r in ex["readers"].items():
        if "error" in r:
            lines.append(f"| load in {name} | {r['error']} |")
        elif name == "vllm":
            lines.append(f"| load in vLLM {r['vllm']} (CPU), no project code: {not r['logos_loaded']} | "
                         f"{r['tokens']} tokens generated |")
        else:
            lines.append(f"| load in transformers {r['transformers']}, no project code: "
                         f"{not r['logos_loaded']} | {r['class']} + {r['tokenizer']}, "
                         f"{r['parameters']:,} parameters, finite logits: {r['finite']} |")
    lines += ["", "Peak resident memory per process (`ru_maxrss` of each rank, the uninterrupted run including its "
              "final checkpoint and export) against `logos plan --device cpu --processes 2`:", "",
              "| rank | measured GiB | plan GiB | measured / plan |", "|---:|---:|---:|---:|"]
    for rank, peak in enumerate(tr["peak"]):
        want = plan["rank0_peak"] if rank == 0 else plan["peak"]
        lines.append(f"| {rank} | {peak / GiB:.2f} | {want / GiB:.2f} | {peak / want:.2f} |")
    lines.append(f"| node | {sum(tr['peak']) / GiB:.2f} | {plan['node'] / GiB:.2f} | "
                 f"{sum(tr['peak']) / plan['node']:.2f} |")
    lines += ["", "Plan terms per process (GiB): " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in plan["terms"].items())
              + "; rank 0 at a save adds " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in plan["save_terms"].items())
              + ".", "",
              f"Generation from the export (random weights), {args.molecules} molecules, budget {args.budget} "
              f"tokens, grammar and chemistry constraints:", "",
              "| engine | written | RDKit-valid | rows ended | step less constraints, ms | grammar masks, ms/step | "
              "row constraints, us/row/step | constraints' share of a step |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for engine, r in gen.items():
        if "error" in r:
            lines.append(f"| {engine} | {r['error'].splitlines()[0]} | | | | | | |")
            continue
        mask = r.get("mask_ms")
        constraints_ms = (mask or 0.0) + r["row_us"] * r["rows"] / 1000
        share = constraints_ms / (constraints_ms + r["step_ms"])
        lines.append(f"| {engine} | {r['written']}/{r['n']} | {r['valid']}/{r['smiles']} | {r['ended']}/{r['n']} | "
                     f"{r['step_ms']:.0f} | {'%.2f' % mask if mask is not None else 'in vLLM'} | {r['row_us']:.0f} | "
                     f"{share:.1%} |")
    lines += ["", "Step less constraints: built-in, sampling time less the model load, the grammar masks and the row "
              "constraints, per step with a forward pass; vLLM, its sampling time less the LOGOS logits processor, "
              "per 16 row-steps (vLLM's own grammar masks are inside it). Share: (masks + row constraints x rows) / "
              "the whole step."]
    return "\n".join(lines)


def write_section(text: str, key: str) -> None:
    path = REPO / "BENCHMARKS.md"
    begin, end = f"<!-- scale check {key} -->", f"<!-- /scale check {key} -->"
    body = path.read_text()
    block = f"{begin}\n\n{text}\n\n{end}"
    if begin in body and end in body:
        body = body[:body.index(begin)] + block + body[body.index(end) + len(end):]
    else:
        title = "## The 1B preset on one CPU machine (make scale-check)"
        if title not in body:
            body = body.rstrip() + f"\n\n{title}\n"
        body = body.rstrip() + f"\n\n{block}\n"
    path.write_text(body)


# ----------------------------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, help="a reduced hidden size (heads of 64, MLP 4x); default: the preset's")
    ap.add_argument("--layers", type=int, help="a reduced number of layers; default: the preset's")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--molecules", type=int, default=16)
    ap.add_argument("--budget", type=int, default=64, help="generation length budget in tokens")
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per training run")
    ap.add_argument("--force", action="store_true", help="run even if the plan says memory is short")
    ap.add_argument("--no-write", action="store_true", help="leave BENCHMARKS.md alone")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    ap.add_argument("--generate-worker", choices=("builtin", "vllm"), help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.generate_worker:
        generate_worker(args.generate_worker, args.checkpoint, args.out, args.molecules, args.budget)
        return 0
    sys.path.insert(0, str(REPO))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.vllm_python:  # absolute (its workers run in the work folder), not resolved (a venv's python is a link)
        args.vllm_python = os.path.abspath(args.vllm_python)
    t0, load_start, available = time.perf_counter(), loadavg(), mem_available()
    work = Path(tempfile.mkdtemp(prefix="logos-scale-check-"))
    log(f"work folder {work}")
    try:
        plan_sets = overrides(args, REPO / "no-shards", work / "plan")
        proc = run(logos("plan", "--config", RECIPE, "--device", "cpu", "--processes", RANKS, "--json",
                         *set_args(plan_sets)), "logos plan", 300, env=project_env())
        if proc.returncode != 0:
            fail(f"logos plan failed:\n{proc.stderr[-2000:]}")
        plan = json.loads(proc.stdout.strip().splitlines()[-1])
        log(f"plan: {plan['parameters']:,} parameters; peak {plan['peak'] / GiB:.2f} GiB per process, rank 0 "
            f"{plan['rank0_peak'] / GiB:.2f}, node {plan['node'] / GiB:.2f}; available {available / GiB:.1f} GiB")
        if plan["node"] + GiB > available and not args.force:
            fail(f"the plan needs {plan['node'] / GiB:.1f} GiB (+1 GiB margin) and {available / GiB:.1f} GiB are "
                 f"available; stop other work or pass --force")
        shards = make_shards(work, RANKS * args.micro_batch, args.seq_len)
        info = {"plan": plan, "train": train_and_resume(args, shards, work)}
        info["export"] = export_and_read(args, work, plan["parameters"])
        info["generate"] = generate_both(args, work)
        info.update(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), commit=commit(),
                    cpus=os.cpu_count(), load_start=load_start, load_end=loadavg(),
                    available_gib=available / GiB, seconds=time.perf_counter() - t0,
                    command=command_line(args))
        text = report(args, info)
        print(text)
        if not args.no_write:
            write_section(text, "1b" if not (args.hidden or args.layers) else "reduced")
        problems = []
        if not info["train"]["decreasing"]:
            problems.append("the loss did not fall on the repeated batch")
        if info["train"]["resume_diff"] > 1e-6:
            problems.append("the resumed losses differ by more than 1e-6")
        for engine, r in info["generate"].items():
            if "error" in r or r["written"] != r["n"] or r["ended"] != r["n"] or r["valid"] != r["smiles"]:
                problems.append(f"generation ({engine}) did not write {args.molecules} valid molecules")
        for name, r in info["export"]["readers"].items():
            if "error" in r and name != "4.57":
                problems.append(f"the export did not load in {name}")
        for p in problems:
            log(f"FAILED: {p}")
        return 1 if problems else 0
    finally:
        if args.keep:
            log(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
