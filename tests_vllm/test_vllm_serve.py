"""``logos serve``: vLLM's OpenAI server for the shipped checkpoint (loaded as it is) answers a LOGOS task by name
and a plain completion on localhost, and shuts down cleanly on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import REPO, SHIPPED

pytest.importorskip("vllm")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_serve_answers_a_task_by_name_and_shuts_down_cleanly(tmp_path):
    port = _free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "logos.cli", "serve", "--checkpoint", str(SHIPPED), "--port",
                             str(port), "--max-model-len", "512", "--max-num-seqs", "16"],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 400
        while time.time() < deadline:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(2)
        else:
            pytest.fail("server did not come up: " + (tmp_path / "serve.log").read_text()[-3000:])

        with urllib.request.urlopen(base + "/logos/tasks", timeout=30) as r:
            assert "crystal" in json.loads(r.read())["tasks"]
        reply = _post(base + "/logos/generate", {"task": "crystal", "input": "Na4Cl4 225", "n": 2, "seed": 0,
                                                 "resamples": 8, "cell_composition": True})
        assert reply["task"] == "crystal" and len(reply["samples"]) == 2, reply
        written = [s for s in reply["samples"] if s["written"]]
        assert written, reply
        for s in written:
            assert s["text"].startswith("<CrystalS>Cl4Na4<sg225>") and s["text"].endswith("<CrystalE>")
            assert "data_" in s["file"] and "_cell_length_a" in s["file"], s["file"]
        again = _post(base + "/logos/generate", {"task": "crystal", "input": "Na4Cl4 225", "n": 2, "seed": 0,
                                                 "resamples": 8, "cell_composition": True})
        assert [s["text"] for s in again["samples"]] == [s["text"] for s in reply["samples"]]  # one seed, one answer
        bad = urllib.request.Request(base + "/logos/generate", json.dumps({"task": "nope"}).encode(),
                                     {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(bad, timeout=30)
        assert e.value.code == 400

        # a plain OpenAI completion carrying the grammar and the processor's arguments (the README's example)
        from transformers import AutoTokenizer

        from logos.decoding.composition import CompositionRows
        from logos.decoding.constraints import TokenTable
        from logos.tasks.continuation import continuation_grammar
        from logos.tasks import TASKS
        from logos.tasks.prompts import Prompt, _crystal_rules
        from logos.generate.vllm_engine import request_xargs

        tok = AutoTokenizer.from_pretrained(str(SHIPPED))
        task, prompt = TASKS["crystal"], Prompt("q", "<CrystalS>Cl4Na4<sg225>", _crystal_rules(225, "Cl4Na4"))
        plain = _post(base + "/v1/completions", {
            "model": SHIPPED.name, "prompt": prompt.text, "max_tokens": 128, "skip_special_tokens": False, "seed": 1,
            "structured_outputs": {"grammar": continuation_grammar(task, prompt)},
            "vllm_xargs": request_xargs(task, prompt), "stop_token_ids": [tok.convert_tokens_to_ids(task.stop)],
            "include_stop_str_in_output": True})
        text = prompt.text + plain["choices"][0]["text"]
        assert plain["choices"][0]["finish_reason"] == "stop", plain
        rows = CompositionRows(TokenTable(tok, 2432), [prompt.text])
        if not text.endswith("<CrystalE>"):
            text += "<CrystalE>"
        assert rows.feasible(0, text, final=True), text  # the sites add up to Cl4Na4
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            code = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("logos serve did not stop within 90 s of Ctrl-C")
        for _ in range(60):  # the engine core and its worker leave with it
            if not _group_alive(proc.pid):
                break
            time.sleep(0.5)
        orphans = _group_alive(proc.pid)
        if orphans:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    assert code in (0, -signal.SIGINT, 130), (tmp_path / "serve.log").read_text()[-3000:]
    assert not orphans, "processes of the server outlived it"
    with socket.socket() as s, pytest.raises(ConnectionRefusedError):  # nothing listens there any more
        s.connect(("127.0.0.1", port))
