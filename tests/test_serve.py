"""``logos serve``'s requests, without vLLM: every malformed body and every refused input is a 4xx that names the field
or the input and the reason, decided before any library reads the input; a library that crashes or stalls on an
input is killed in the request's own process at the time limit and named, while the event loop goes on.

(The live server - the same classes over HTTP, SIGTERM, 64 concurrent requests with a hostile one - is tested in
``tests_vllm/test_vllm_serve.py``.)"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import time
from types import SimpleNamespace

import pytest

from conftest import REPO, loop_ticks
from logos.data.limits import InputLimits
from logos.generate.serve import SERVE_LIMITS, RequestError, ServeSettings, parse_request

SHIPPED = str(REPO / "checkpoints" / "logos-tiny")
LIMITS = InputLimits(**SERVE_LIMITS)


def _refused(raw, max_model_len=1024) -> RequestError:
    with pytest.raises(RequestError) as e:
        parse_request(raw if isinstance(raw, bytes) else json.dumps(raw).encode(), max_model_len)
    return e.value


@pytest.mark.parametrize("raw, status, words", [
    (b"{\"task\": ", 400, "not JSON"),
    (b"\xff\xfe", 400, "not JSON"),
    (b"[{\"task\": \"molecule\"}]", 400, "JSON object"),
    (b"\"molecule\"", 400, "JSON object"),
    ({"task": "molecule", "temprature": 0.7}, 422, "unknown field 'temprature'"),
    ({"task": 7}, 422, "task: expected a string"),
    ({"task": "nope"}, 422, "task \"nope\": not a generation task"),
    ({"task": "csp"}, 422, "not a generation task"),
    ({"n": "4"}, 422, "n: expected an integer, got \"4\""),
    ({"n": True}, 422, "n: expected an integer, got true"),
    ({"n": 2.5}, 422, "n: expected an integer"),
    ({"n": 0}, 422, "n 0: not in 1..1024"),
    ({"n": 5000}, 422, "n 5000: not in 1..1024"),
    ({"temperature": "hot"}, 422, "temperature: expected a number"),
    ({"top_p": 0}, 422, "top_p 0.0: not in"),
    ({"seed": -1}, 422, "seed -1: not in"),
    ({"unconstrained": 1}, 422, "unconstrained: expected true or false"),
    ({"task": "forward", "input": ["CCO"]}, 422, "input: expected a string"),
    ({"task": "forward"}, 422, "task forward needs an input"),
    ({"task": "retro", "input": "  \n"}, 422, "task retro needs an input"),
    ({"task": "forward", "input": "CCO", "input_format": "/../../etc/x"}, 422, "input_format"),
    ({"task": "molecule", "format": "/../../tmp/x.smi"}, 422, "format"),
    ({"task": "molecule", "max_new_tokens": 4096}, 422, "max_new_tokens 4096: not below the server's --max-model-len"),
])
def test_a_malformed_body_is_a_4xx_naming_the_field(raw, status, words):
    e = _refused(raw)
    assert e.status == status and words in e.message, e.message


def test_a_good_body_gets_its_defaults_and_its_alias_resolved():
    req = parse_request(json.dumps({"task": "reaction", "input": "CCO", "n": 2, "temperature": 1}).encode(), 1024)
    assert req["task"] == "retro" and req["n"] == 2 and req["temperature"] == 1.0 and req["seed"] == 0
    assert parse_request(json.dumps({"task": "retro", "input": "CCO"}).encode())["temperature"] is None  # the task's
    assert req["format"] is None and req["unconstrained"] is False and req["resamples"] == 8


# ------------------------------------------------------------------------------- refused inputs (the request's work)
class _Channel:
    """The request process's line to the server, for calling ``handle`` here: the stages it names; no engine."""

    def __init__(self):
        self.stages = []

    def stage(self, text):
        self.stages.append(text)

    def ask(self, message):
        raise AssertionError("a refused request must not reach the engine")


def _handled(body: dict, limits: InputLimits = LIMITS, max_model_len: int = 1024) -> RequestError:
    from logos.generate.serve_work import handle

    req = parse_request(json.dumps(body).encode(), max_model_len)
    channel = _Channel()
    start = time.monotonic()
    with pytest.raises(RequestError) as e:
        handle(channel, req, limits, max_model_len, SHIPPED)
    assert time.monotonic() - start < 30
    assert e.value.status == 422
    return e.value


def test_a_megabyte_smiles_is_refused_before_rdkit_with_the_good_input_named_apart():
    e = _handled({"task": "forward", "input": "CCO.CC(=O)O\n" + "C" * 1_000_000})
    assert e.message.startswith("input 2: 1,000,000 characters, more than --max-chars 100,000"), e.message
    assert e.refused == [{"input": 2, "reason": "1,000,000 characters, more than --max-chars 100,000 (not parsed)"}]
    e = _handled({"task": "forward", "input": "C" * 1_000_000}, InputLimits(max_chars=0))
    assert e.message == "input 1: 1,000,000 atoms, more than --max-atoms 1,000 (not parsed)"


def test_a_bad_smiles_is_refused_with_rdkit_s_position():
    e = _handled({"task": "retro", "input": "CCO\nC1CC(\n"})
    assert e.message == "input 2: invalid SMILES 'C1CC(': SMILES parse error at position 5: syntax error", e.message


def test_a_space_group_out_of_range_and_a_false_element_are_named():
    e = _handled({"task": "crystal", "input": "NaCl 999\nNa4Cl4 225\nXx2O\n"})
    assert e.message == "input 1: space group 999: not in 1-230; input 3: formula 'Xx2O': Xx is not an element"
    assert [x["input"] for x in e.refused] == [1, 3]
    e = _handled({"task": "crystal", "input": "Na600Cl600 225"})
    assert "1,200 atoms in the formula, more than --max-atoms 1,000" in e.message


def test_records_samples_format_and_prompt_length_are_bounded():
    e = _handled({"task": "forward", "input": "CCO\n" * 70})
    assert e.message == "input 65: more than --max-records 64 records in one input (this record and the rest not read)"
    e = _handled({"task": "forward", "input": "CCO\n" * 20, "n": 64})
    assert "1,280 samples, more than 1,024 per request" in e.message
    e = _handled({"task": "molecule", "format": ".xyz"})
    assert e.message.startswith("format .xyz: no detokenizer writes"), e.message
    e = _handled({"task": "pocket", "input": ">p\n" + "ACDEFGHIKLMNPQRSTVWY" * 20 + "\n", "input_format": ".fasta"},
                 max_model_len=256)  # a copy task's budget is its input's length: not cut to the context
    assert e.message.startswith("input 1: a prompt of ") and "exceed the server's --max-model-len 256" in e.message
    e = _handled({"task": "protein", "max_new_tokens": 255}, max_model_len=256)  # asked for, so not cut either
    assert e.message == "request: a prompt of 2 tokens and a budget of 255 new tokens exceed the server's " \
                        "--max-model-len 256", e.message
    e = _handled({"task": "pocket", "input": ">p\nAC\"DE\n", "input_format": ".fasta"})
    assert e.message.startswith("input 1: sequence has characters that are not residue letters"), e.message
    e = _handled({"task": "pocket", "input": ">p\n" + "A" * 20_000 + "\n", "input_format": ".fasta"})
    assert e.message == "input 1: 20,000 residues, more than --max-residues 10,000 (not parsed)"


# ------------------------------------------------------------------------ a library that stalls, in its own process
def test_a_stalled_library_costs_the_request_its_time_limit_not_the_loop(monkeypatch):
    """--max-atoms and --max-chars off: RDKit really reads a 200,000-atom chain (it runs for minutes, or crashes);
    the request's process is killed after --timeout and the request refused naming that input, while the event
    loop (the server's /health, its other requests) keeps running."""
    from logos.generate.serve import CHECKPOINT_ENV, _work

    monkeypatch.setenv(CHECKPOINT_ENV, SHIPPED)
    limits = InputLimits(timeout=3, max_atoms=0, max_chars=0, max_records=64)
    req = parse_request(json.dumps({"task": "forward", "input": "CCO\n" + "C" * 200_000}).encode(), 1024)

    async def main():
        state = SimpleNamespace(logos_settings=ServeSettings(limits, 2), logos_max_model_len=1024,
                                logos_ctx=mp.get_context("forkserver"), logos_slots=asyncio.Semaphore(2),
                                logos_engine=None, logos_checkpoint=SHIPPED)
        async with loop_ticks() as ticks:
            start = time.monotonic()
            with pytest.raises(RequestError) as e:
                await _work(state, req)
        return e.value, time.monotonic() - start, ticks[0]

    e, seconds, ticks = asyncio.run(main())
    assert e.status == 422 and e.message.startswith("input 2: refused: "), e.message
    assert "timed out after 3 s" in e.message or "SIGSEGV" in e.message, e.message
    assert e.refused[0]["input"] == 2
    assert seconds < 90 and ticks >= seconds * 5  # the loop ran all along
    assert not [p for p in mp.active_children() if p.is_alive() and p.name != "SyncManager"]  # nothing left behind


def test_a_body_is_read_up_to_max_mb_whether_or_not_its_length_is_announced():
    from logos.generate.serve import _read_body

    class _Request:
        def __init__(self, size, announced):
            self.headers = {"content-length": str(size)} if announced else {}
            self.size, self.read = size, 0

        async def stream(self):
            while self.read < self.size:
                self.read += 64_000
                yield b"x" * 64_000

    small = _Request(500_000, announced=False)
    assert len(asyncio.run(_read_body(small, 1.0))) == 512_000
    for announced in (True, False):
        big = _Request(50_000_000, announced)
        with pytest.raises(RequestError) as e:
            asyncio.run(_read_body(big, 1.0))
        assert e.value.status == 413 and "more than --max-mb 1" in e.value.message
        assert big.read <= 1_100_000  # refused unread (announced) or as soon as the limit is passed
