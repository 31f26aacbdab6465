"""``logos serve``: vLLM's OpenAI server for the shipped checkpoint (loaded as it is) answers a LOGOS task by name and a
plain completion on localhost; no request can stop it: malformed bodies and refused inputs are 4xx naming the field or
the input, 64 concurrent requests with a hostile one (a 1 MB SMILES) among them are all answered while ``/health``
stays up, and SIGTERM stops it within seconds with a request at work. One server for the module, loopback only."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import REPO, SHIPPED

pytest.importorskip("vllm")

MAX_MB = 2  # the server's body limit here (a 3 MB body is refused unread)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body, timeout: float = 600) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"{}")
        except ValueError:
            return e.code, {"error": raw.decode(errors="replace")}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _asks_big(channel, size):
    return len(channel.ask("x" * size))


def test_an_isolated_call_under_uvloop_passes_messages_larger_than_a_pipe():
    """The server's loop is uvloop, which leaves a watched pipe non-blocking: messages of megabytes (a request's
    grammars, the engine's outputs) must still travel whole."""
    import uvloop

    from logos.util.isolate import call_isolated

    async def answer(message):
        return message * 2

    assert uvloop.run(call_isolated(_asks_big, 3_000_000, answer=answer, timeout=60)) == 6_000_000


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A running ``logos serve`` (its process, base URL and log); stopped at the end if a test has not stopped it."""
    port, log_path = _free_port(), tmp_path_factory.mktemp("serve") / "serve.log"
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "logos.cli", "serve", "--checkpoint", str(SHIPPED), "--port",
                             str(port), "--max-model-len", "512", "--max-num-seqs", "32", "--workers", "8",
                             "--max-mb", str(MAX_MB)],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    while time.time() < deadline:
        assert proc.poll() is None, log_path.read_text()[-3000:]
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            time.sleep(2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("server did not come up: " + log_path.read_text()[-3000:])
    yield proc, base, log_path, port
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            pass
    if _group_alive(proc.pid):
        os.killpg(proc.pid, signal.SIGKILL)
    log.close()


def test_serve_answers_a_task_by_name_and_a_plain_completion(server):
    _, base, _, _ = server
    with urllib.request.urlopen(base + "/logos/tasks", timeout=30) as r:
        assert "crystal" in json.loads(r.read())["tasks"]
    status, reply = _post(base + "/logos/generate", {"task": "crystal", "input": "Na4Cl4 225", "n": 2, "seed": 0,
                                                     "resamples": 8, "cell_composition": True})
    assert status == 200 and reply["task"] == "crystal" and len(reply["samples"]) == 2, reply
    written = [s for s in reply["samples"] if s["written"]]
    assert written, reply
    for s in written:
        assert s["text"].startswith("<CrystalS>Cl4Na4<sg225>") and s["text"].endswith("<CrystalE>")
        assert "data_" in s["file"] and "_cell_length_a" in s["file"], s["file"]
    _, again = _post(base + "/logos/generate", {"task": "crystal", "input": "Na4Cl4 225", "n": 2, "seed": 0,
                                                "resamples": 8, "cell_composition": True})
    assert [s["text"] for s in again["samples"]] == [s["text"] for s in reply["samples"]]  # one seed, one answer

    # a plain OpenAI completion carrying the grammar and the processor's arguments (the README's example)
    from transformers import AutoTokenizer

    from logos.decoding.composition import CompositionRows
    from logos.decoding.constraints import TokenTable
    from logos.tasks.continuation import continuation_grammar
    from logos.tasks import TASKS
    from logos.tasks.prompts import Prompt, crystal_rules_for
    from logos.generate.vllm_engine import request_xargs

    tok = AutoTokenizer.from_pretrained(str(SHIPPED))
    task, prompt = TASKS["crystal"], Prompt("q", "<CrystalS>Cl4Na4<sg225>", crystal_rules_for(225, "Cl4Na4"))
    status, plain = _post(base + "/v1/completions", {
        "model": SHIPPED.name, "prompt": prompt.text, "max_tokens": 128, "skip_special_tokens": False, "seed": 1,
        "structured_outputs": {"grammar": continuation_grammar(task, prompt)},
        "vllm_xargs": request_xargs(task, prompt), "stop_token_ids": [tok.convert_tokens_to_ids(task.stop)],
        "include_stop_str_in_output": True})
    text = prompt.text + plain["choices"][0]["text"]
    assert status == 200 and plain["choices"][0]["finish_reason"] == "stop", plain
    rows = CompositionRows(TokenTable(tok, 2432), [prompt.text])
    if not text.endswith("<CrystalE>"):
        text += "<CrystalE>"
    assert rows.feasible(0, text, final=True), text  # the sites add up to Cl4Na4


@pytest.mark.parametrize("body, status, words", [
    (b"{\"task\": ", 400, "not JSON"),
    (b"[{\"task\": \"molecule\"}]", 400, "JSON object"),
    ({"task": "nope"}, 422, "not a generation task"),
    ({"task": "molecule", "n": "4"}, 422, "n: expected an integer"),
    ({"task": "molecule", "n": 0}, 422, "n 0: not in 1..1024"),
    ({"task": "forward"}, 422, "task forward needs an input"),
    ({"task": "forward", "input": "C" * 10**6}, 422, "input 1: 1,000,000 characters, more than --max-chars 100,000"),
    ({"task": "forward", "input": "CCO\nC1CC("}, 422,
     "input 2: invalid SMILES 'C1CC(': SMILES parse error at position 5: syntax error"),
    ({"task": "crystal", "input": "NaCl 999"}, 422, "input 1: space group 999: not in 1-230"),
    ({"task": "forward", "input": "CCO\n" * 65}, 422, "input 65: more than --max-records 64"),
])
def test_malformed_bodies_and_refused_inputs_are_4xx_naming_what_and_why(server, body, status, words):
    _, base, _, _ = server
    got, reply = _post(base + "/logos/generate", body, timeout=120)
    assert got == status and words in reply["error"], (got, reply)


def test_a_body_over_max_mb_is_refused_unread(server):
    """The headers announce 3 MB; the 413 comes back before a byte of the body is sent."""
    import http.client

    _, _, _, port = server
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.putrequest("POST", "/logos/generate")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(3 * 10**6))
    conn.endheaders()
    reply = conn.getresponse()
    assert reply.status == 413 and f"more than --max-mb {MAX_MB}" in json.loads(reply.read())["error"]
    conn.close()


def test_64_concurrent_requests_with_a_hostile_one_every_good_one_answered(server):
    """63 good requests of six tasks and a 1 MB SMILES at once (loopback, 64 client threads); /health is polled all
    along and must answer within a few seconds every time."""
    _, base, _, _ = server
    small = {"n": 1, "max_new_tokens": 48, "resamples": 1, "whole_draws": 0}
    kinds = [{"task": "molecule"}, {"task": "crystal", "input": "NaCl 225 Z=4"}, {"task": "retro", "input": "CCOC(C)=O"},
             {"task": "forward", "input": "CCO.CC(=O)O"}, {"task": "mof"}, {"task": "protein"}]
    bodies = [{**kinds[k % len(kinds)], **small, "seed": k} for k in range(63)]
    hostile = {"task": "forward", "input": "C" * 10**6, "n": 1}
    bodies.insert(31, hostile)
    health: list[float] = []
    done = False

    def poll_health():
        while not done:
            start = time.monotonic()
            with urllib.request.urlopen(base + "/health", timeout=30) as r:
                assert r.status == 200
            health.append(time.monotonic() - start)
            time.sleep(0.5)

    start = time.monotonic()
    with ThreadPoolExecutor(65) as pool:
        watcher = pool.submit(poll_health)
        futures = [pool.submit(_post, base + "/logos/generate", b, 900) for b in bodies]
        results = [f.result() for f in futures]
        done = True
        watcher.result()
    seconds = time.monotonic() - start
    status, reply = results[31]
    assert status == 422 and reply["error"].startswith("input 1: 1,000,000 characters"), reply
    good = results[:31] + results[32:]
    assert all(s == 200 for s, _ in good), [r for s, r in good if s != 200][:3]
    assert all(len(r["samples"]) == 1 for _, r in good)
    assert len(health) >= 3 and max(health) < 5, (max(health), len(health))
    print(f"64 concurrent requests answered in {seconds:.0f} s; /health at most {max(health):.2f} s")


def test_sigterm_stops_the_server_within_seconds_with_a_request_at_work(server):
    proc, base, log_path, port = server
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(_post, base + "/logos/generate", {"task": "protein", "n": 64, "seed": 1,
                                                             "max_new_tokens": 400}, 120)
        time.sleep(5)  # the request is at work (sampling 64 proteins of up to 400 residues takes minutes here)
        assert not busy.done()
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("logos serve did not stop within 60 s of SIGTERM:\n" + log_path.read_text()[-3000:])
        seconds = time.monotonic() - start
        status, reply = busy.result(timeout=30)
        assert status == 503 and "shutting down" in reply["error"], (status, reply)
    for _ in range(60):  # the engine core, the fork server and the request processes leave with it
        if not _group_alive(proc.pid):
            break
        time.sleep(0.5)
    orphans = _group_alive(proc.pid)
    if orphans:
        os.killpg(proc.pid, signal.SIGKILL)
    assert seconds < 20, f"SIGTERM took {seconds:.1f} s\n" + log_path.read_text()[-3000:]
    assert code in (0, -signal.SIGTERM, 143), log_path.read_text()[-3000:]
    assert not orphans, "processes of the server outlived it"
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):  # nothing listens there any more
        s.connect(("127.0.0.1", port))
