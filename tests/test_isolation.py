"""Isolation of the tokenize and generate-input paths: hostile records cost one error line each, never the run, the good
records or the time; one isolated call from an event loop (a server request) likewise."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ASSETS, REPO, loop_ticks, records

GOOD = [l.split()[0] for l in (ASSETS / "molecules" / "moses_test_200.smi").read_text().splitlines()[:20]]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _tokenize(src, out, *flags, timeout=240):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "logos.cli", "tokenize", src, "-o", out, "-q", *map(str, flags)],
                          capture_output=True, text=True, timeout=timeout, env=ENV)
    return proc, time.monotonic() - start


def _hostile(tmp_path):
    """5 good, a 20,000-atom chain, 5 good, a 200,000-atom chain, 10 good (generated, not committed)."""
    src = tmp_path / "hostile.smi"
    src.write_text("\n".join(GOOD[:5] + ["C" * 20_000] + GOOD[5:10] + ["C" * 200_000] + GOOD[10:]) + "\n")
    return src, {f"{src}:6", f"{src}:12"}


def _check(proc, out, bad_sources):
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    recs = records(out)
    assert [r["source"].rsplit(":", 1)[1] for r in recs] == [str(i) for i in range(1, 23) if i not in (6, 12)]
    errors = [json.loads(l) for l in out.with_name(out.stem + ".errors.jsonl").read_text().splitlines()]
    assert {e["source"] for e in errors} == bad_sources and len(errors) == len(bad_sources)
    assert all(len(e["reason"]) <= 200 for e in errors)
    stderr_lines = [l for l in proc.stderr.splitlines() if not l.startswith("tokenize:")]
    assert len(stderr_lines) == len(errors) and all(len(l) < 400 for l in stderr_lines)
    return errors


@pytest.mark.parametrize("workers", [1, 2])
def test_huge_chains_are_refused_before_rdkit(tmp_path, workers):
    src, bad = _hostile(tmp_path)
    out = tmp_path / "out.jsonl"
    proc, seconds = _tokenize(src, out, "--workers", workers)
    errors = _check(proc, out, bad)
    assert all("--max-atoms" in e["reason"] for e in errors)
    assert seconds < 60


@pytest.mark.parametrize("workers", [1, 2])
def test_without_size_limits_a_crash_or_stall_costs_one_record(tmp_path, workers):
    """--max-atoms 0: RDKit really sees the chains; the worker crash or the time limit takes them, nothing else."""
    src, bad = _hostile(tmp_path)
    out = tmp_path / "out.jsonl"
    proc, seconds = _tokenize(src, out, "--workers", workers, "--max-atoms", 0, "--timeout", 3)
    errors = _check(proc, out, bad)
    assert all("timed out after 3 s" in e["reason"] or "crash" in e["reason"] for e in errors)
    assert seconds < 90
    header = json.loads(out.read_text().splitlines()[0])["logos_header"]
    assert header["limits"] == {"timeout": 3.0, "max_atoms": 0, "max_mb": 200.0}


def test_max_atoms_does_not_count_the_letters_of_a_protein_sequence(tmp_path):
    """--max-atoms is for SMILES/SDF/reaction records; a 1,601-residue FASTA sequence is a protein, not 1,260 'atoms'."""
    from logos.data.encode import tokenize_files

    seq = "M" + "ACDEFGHIKLMNPQRSTVWY" * 80
    (tmp_path / "long.fasta").write_text(f">long\n{seq}\n")
    (tmp_path / "long.smi").write_text("C" * 1500 + "\n")
    result = tokenize_files([tmp_path / "long.fasta", tmp_path / "long.smi"], tmp_path / "out.jsonl",
                            workers=0, progress=False, echo=lambda line: None)
    (rec,) = records(tmp_path / "out.jsonl")
    assert rec["domain"] == "protein" and seq in rec["text"]
    assert result.errors == 1  # the SMILES chain is still refused before RDKit


def test_long_invalid_smiles_gives_a_bounded_error_line(tmp_path):
    src = tmp_path / "long.smi"
    src.write_text("C" * 10_000 + "(\n" + GOOD[0] + "\n")
    out = tmp_path / "out.jsonl"
    proc, _ = _tokenize(src, out, "--max-atoms", 0)
    assert proc.returncode == 1 and len(records(out)) == 1
    (error,) = [json.loads(l) for l in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    # the echoed input is cut, and RDKit's reason says where the SMILES breaks
    assert len(error["reason"]) <= 200 and "...[" in error["reason"], error
    assert "SMILES parse error at position 10001: syntax error" in error["reason"], error


def test_a_killed_run_keeps_what_it_wrote(tmp_path):
    """The good records before a stalled one are on disk while it stalls, and stay there when the run is killed."""
    src = tmp_path / "stall.smi"
    good = (ASSETS / "molecules" / "moses_test_200.smi").read_text().splitlines()
    src.write_text("\n".join(good + ["C" * 200_000]) + "\n")
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "logos.cli", "tokenize", str(src), "-o", str(out), "-q",
                             "--max-atoms", "0", "--timeout", "0"], env=ENV, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if out.exists() and len(out.read_text().splitlines()) == 1 + len(good):
                break
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    lines = out.read_text().splitlines()
    assert len(lines) == 1 + len(good)
    assert [json.loads(l)["source"] for l in lines[1:]] == [f"{src}:{i}" for i in range(1, len(good) + 1)]


# ---------------------------------------------------------------- the pool itself
def _crashy(x: int) -> int:
    if x == 7:
        os.kill(os.getpid(), signal.SIGSEGV)
    if x == 13:
        time.sleep(60)
    return x * x


@pytest.mark.parametrize("workers", [1, 3])
def test_pool_restarts_crashed_and_stalled_workers_and_keeps_order(workers):
    from logos.util.isolate import Failure, imap_isolated

    out = list(imap_isolated(range(40), _crashy, workers=workers, timeout=1.5, batch=5))
    assert [item for item, _ in out] == list(range(40))
    failed = {item: r.reason for item, r in out if isinstance(r, Failure)}
    assert set(failed) == {7, 13}
    assert "SIGSEGV" in failed[7] and "timed out" in failed[13]
    assert all(r == item * item for item, r in out if item not in failed)  # batch-mates of 7 and 13 were redone



# ---------------------------------------------------------------- safety
def test_no_remote_code_anywhere_in_the_package():
    """``trust_remote_code`` is never true: every mention in the package source sets it False."""
    import re

    hits = []
    for path in (REPO / "logos").rglob("*.py"):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if "trust_remote_code" in line and not re.search(r"trust_remote_code\s*[=:]\s*False", line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not hits, hits


@pytest.mark.parametrize("ident", ["../../etc/passwd", "/etc/passwd", "a\x00b", "..", ".", "", "a/../../b",
                                   "C:\\Windows\\x", "~/.ssh/id", "\n\t"])
def test_safe_name_stays_inside_the_folder(tmp_path, ident):
    from logos.util.records import safe_name

    name = safe_name(ident)
    assert name and "/" not in name and "\\" not in name and "\x00" not in name and not name.startswith(".")
    assert (tmp_path / name).resolve().parent == tmp_path.resolve()
    assert safe_name("1abc_LIG1-2.x") == "1abc_LIG1-2.x"  # ordinary ids are kept as they are


# ------------------------------------------------------------------ one isolated call from an event loop (servers)
def _asks_twice(channel, x):
    channel.stage("asking")
    return channel.ask(x) + channel.ask(x + 1)


def _stalls(channel, seconds):
    channel.stage("input 3")
    time.sleep(seconds)  # a library call that does not return
    return "never"


def _crashes(channel):
    channel.stage("reading the structure")
    os.kill(os.getpid(), signal.SIGSEGV)


def _refuses(channel):
    from logos.util.records import RecordError

    raise RecordError("input 1: SMILES parse error at position 4")


def _waits_for_a_slow_answer(channel):
    return channel.ask("slow")


def _run(coro_fn):
    import asyncio

    return asyncio.run(coro_fn())


def test_an_isolated_call_asks_its_caller_and_returns():
    from logos.util.isolate import call_isolated

    async def answer(x):
        return 10 * x

    assert _run(lambda: call_isolated(_asks_twice, 2, answer=answer, timeout=30)) == 50


def test_a_stalled_call_is_killed_at_its_time_limit_while_the_loop_goes_on():
    from logos.util.isolate import IsolatedFailure, call_isolated

    async def main():
        async with loop_ticks() as ticks:
            start = time.monotonic()
            with pytest.raises(IsolatedFailure) as e:
                await call_isolated(_stalls, 600, timeout=2)
        return e.value, time.monotonic() - start, ticks[0]

    failure, seconds, ticks = _run(main)
    assert "timed out after 2 s" in failure.reason and failure.stage == "input 3"
    assert seconds < 20 and ticks >= 10  # the loop kept running while the call stalled


def test_a_crashed_call_names_its_signal_and_stage():
    from logos.util.isolate import IsolatedFailure, call_isolated

    with pytest.raises(IsolatedFailure) as e:
        _run(lambda: call_isolated(_crashes, timeout=30))
    assert "SIGSEGV" in e.value.reason and e.value.stage == "reading the structure"


def test_an_isolated_call_raises_its_own_exception_here():
    from logos.util.isolate import call_isolated
    from logos.util.records import RecordError

    with pytest.raises(RecordError, match="input 1: SMILES parse error at position 4"):
        _run(lambda: call_isolated(_refuses, timeout=30))


def test_the_time_limit_does_not_count_waits_for_the_caller():
    import asyncio

    from logos.util.isolate import call_isolated

    async def answer(message):
        await asyncio.sleep(3)  # the engine, say: longer than the call's own time limit
        return "answered"

    assert _run(lambda: call_isolated(_waits_for_a_slow_answer, answer=answer, timeout=1.5)) == "answered"


def _asks_big(channel, size):
    reply = channel.ask("x" * size)
    return len(reply)


def test_messages_larger_than_a_pipe_travel_whole_both_ways():
    from logos.util.isolate import call_isolated

    async def answer(message):
        return message * 2

    assert _run(lambda: call_isolated(_asks_big, 3_000_000, answer=answer, timeout=60)) == 6_000_000


# ------------------------------------------------------------------ logos generate --input: the same bounds
def _generate(src, out, *flags, timeout=600):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "logos.cli", "generate", "--task", "forward", "--input", src,
                           "-n", "1", "--max-new-tokens", "16", "--resamples", "0", "-o", out, "-q", *map(str, flags)],
                          capture_output=True, text=True, timeout=timeout, env=ENV)
    errors = {e["source"]: e["reason"] for e in map(json.loads, out.with_name(out.name + ".errors.jsonl")
                                                     .read_text().splitlines()) if ":" in e["source"]}
    samples = [json.loads(l) for l in out.with_name(out.stem + ".samples.jsonl").read_text().splitlines()]
    return proc, errors, samples, time.monotonic() - start


def test_generate_input_refuses_a_megabyte_smiles_before_rdkit_and_keeps_the_good_records(tmp_path):
    src = tmp_path / "reactants.smi"
    src.write_text("CCO.CC(=O)O ester\n" + "C" * 1_000_000 + "\nC1CC(\n" + "C" * 5_000 + "\n")
    proc, errors, samples, _ = _generate(src, tmp_path / "out.rsmi")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert errors == {f"{src}:2": "1,000,000 characters, more than --max-chars 100,000 (not parsed)",
                      f"{src}:3": "invalid SMILES 'C1CC(': SMILES parse error at position 5: syntax error",
                      f"{src}:4": "5,000 atoms, more than --max-atoms 1,000 (not parsed)"}
    assert [s["id"] for s in samples] == ["ester"]


def test_generate_input_isolates_a_library_crash_or_stall_to_its_record(tmp_path):
    """The limits off: RDKit really reads a 20,000-atom chain (a crash, or a stall past --timeout); that record is
    refused with the reason, the good one is generated, the run ends."""
    src = tmp_path / "reactants.smi"
    src.write_text("C" * 20_000 + "\nCCO.CC(=O)O ester\n")
    proc, errors, samples, seconds = _generate(src, tmp_path / "out.rsmi", "--max-atoms", 0, "--max-chars", 0,
                                               "--timeout", 5)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert list(errors) == [f"{src}:1"]
    assert "timed out after 5 s" in errors[f"{src}:1"] or "crash" in errors[f"{src}:1"], errors
    assert [s["id"] for s in samples] == ["ester"]
