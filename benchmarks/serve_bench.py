"""``logos serve`` under load: 64 concurrent requests with a hostile one, ``/health`` meanwhile, SIGTERM at work.

Starts ``logos serve`` on the shipped checkpoint on a free loopback port (vLLM on CPU), sends one request of
each kind to warm it, then ``--concurrent`` requests at once from as many client threads: good ones of six
tasks (molecule, crystal from a composition, retro, forward, MOF, protein; one sample each, at most 48 new
tokens) and, in the middle, a forward request whose input is a 1 MB SMILES. ``/health`` is polled every
half second throughout. Then a long request is started and the server is sent SIGTERM. Reports the time
to answer all, the latency of the good requests, the hostile one's refusal, ``/health``'s slowest answer
and the seconds SIGTERM took. Loopback only. Run in the vLLM venv; it rewrites its section of BENCHMARKS.md:

    OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind .venv-vllm/bin/python benchmarks/serve_bench.py
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- serve bench -->", "<!-- /serve bench -->"
COMMAND = "OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind .venv-vllm/bin/python benchmarks/serve_bench.py"
KINDS = [{"task": "molecule"}, {"task": "crystal", "input": "Na4Cl4 225"}, {"task": "retro", "input": "CCOC(C)=O"},
         {"task": "forward", "input": "CCO.CC(=O)O"}, {"task": "mof"}, {"task": "protein"}]
SMALL = {"n": 1, "max_new_tokens": 48, "resamples": 1, "whole_draws": 0}


def _post(url: str, body: dict, timeout: float = 1800) -> tuple[int, dict, float]:
    start = time.monotonic()
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.monotonic() - start
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            reply = json.loads(raw or b"{}")
        except ValueError:
            reply = {"error": raw.decode(errors="replace")}
        return e.code, reply, time.monotonic() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrent", type=int, default=64)
    ap.add_argument("--workers", type=int, default=16, help="logos serve --workers")
    ap.add_argument("--no-write", action="store_true", help="print the section, leave BENCHMARKS.md alone")
    args = ap.parse_args()

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile("w", prefix="serve-bench-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "logos.cli", "serve", "--checkpoint", str(REPO / "checkpoints" / "logos-tiny"),
           "--port", str(port), "--max-model-len", "512", "--max-num-seqs", "64", "--workers", str(args.workers)]
    load_before = os.getloadavg()
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                sys.exit(f"logos serve exited; see {log.name}")
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(1)
        startup = time.monotonic() - start
        for kind in KINDS:  # warm: each task's first use
            _post(base + "/logos/generate", {**kind, **SMALL})

        bodies = [{**KINDS[k % len(KINDS)], **SMALL, "seed": k} for k in range(args.concurrent - 1)]
        hostile_at = len(bodies) // 2
        bodies.insert(hostile_at, {"task": "forward", "input": "C" * 10**6, "n": 1})
        health: list[float] = []
        stop = threading.Event()

        def poll_health():
            while not stop.is_set():
                t = time.monotonic()
                with urllib.request.urlopen(base + "/health", timeout=60) as r:
                    assert r.status == 200
                health.append(time.monotonic() - t)
                time.sleep(0.5)

        t0 = time.monotonic()
        with ThreadPoolExecutor(len(bodies) + 1) as pool:
            watcher = pool.submit(poll_health)
            results = [f.result() for f in [pool.submit(_post, base + "/logos/generate", b) for b in bodies]]
            stop.set()
            watcher.result()
        wall = time.monotonic() - t0
        hostile = results.pop(hostile_at)
        answered = sum(1 for s, r, _ in results if s == 200 and len(r.get("samples", [])) == 1)
        latencies = [t for _, _, t in results]

        with ThreadPoolExecutor(1) as pool:  # SIGTERM with a long request at work
            busy = pool.submit(_post, base + "/logos/generate", {"task": "protein", "n": 64, "max_new_tokens": 400},
                               120)
            time.sleep(5)
            t = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
            sigterm = time.monotonic() - t
            try:
                told = busy.result(timeout=30)[0]  # the request at work: answered 503
            except OSError:
                told = "connection closed"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    load_after = os.getloadavg()
    refusal = hostile[1].get("error")
    refusal = refusal if isinstance(refusal, str) else json.dumps(refusal)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = [
        ("server start (vLLM engine, fork server with the checkpoint)", f"{startup:.0f} s"),
        (f"{args.concurrent} concurrent requests: all answered after", f"{wall:.0f} s"),
        ("good requests answered (200, one sample each)", f"{answered}/{len(results)}"),
        ("good request latency: median / 90th percentile / slowest",
         f"{statistics.median(latencies):.1f} / {_percentile(latencies, 0.9):.1f} / {max(latencies):.1f} s"),
        ("the 1 MB SMILES: status, seconds", f"{hostile[0]}, {hostile[2]:.2f} s"),
        ("/health during the load: answers, median / slowest",
         f"{len(health)}, {statistics.median(health) * 1000:.0f} / {max(health) * 1000:.0f} ms"),
        ("SIGTERM with a 64-sample request at work: stopped after (that request's answer)",
         f"{sigterm:.1f} s ({told})"),
    ]
    section = [BEGIN, "",
               f"Measured {when} at {commit} on 2 CPU cores shared with other jobs (load average "
               f"{load_before[0]:.1f} before, {load_after[0]:.1f} after: the latencies are this machine's, not the "
               f"server's best), shipped tiny checkpoint, vLLM on CPU, `--workers {args.workers}`, loopback:", "",
               "```", COMMAND, "```", "", "| measure | value |", "|---|---:|"] + [f"| {k} | {v} |" for k, v in rows] + [
               "", f"The good requests: {', '.join(k['task'] for k in KINDS)} in turn, one sample each, at most 48 new "
               f"tokens, one resample; the hostile one is refused by `--max-chars` before any library reads it, "
               f"with its input named: `{refusal[:90]}`.", "", END]
    text = "\n".join(section)
    print(text)
    if not args.no_write:
        from sections import write_section

        write_section(text, BEGIN, END, "## logos serve under load (CPU)")
    return 0 if answered == len(results) and hostile[0] == 422 else 1


if __name__ == "__main__":
    sys.exit(main())
