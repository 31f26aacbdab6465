"""Crash- and stall-proof worker processes: a parsing library that segfaults or hangs costs one record, not the run.

:func:`imap_isolated` maps a function over items in forked worker processes and yields the results
in input order. Items travel in batches (one pickle and one pipe round trip per batch, which keeps
the per-record overhead of cheap records such as SMILES small: a message per record costs ~30 us,
a batch of 256 ~0.4 us per record); a batch still running after 0.25 s sends what it has done, so
results reach the output file (and survive a kill) within a fraction of a second. Before each
item a worker writes the item's index and start time into a shared array, so the parent always
knows which record a worker is on without any message per record. Workers die with the parent
(``PR_SET_PDEATHSIG``): a killed run leaves no orphan stuck on a record.

- **Crash** (RDKit, gemmi or spglib killing the process with a signal, or any other exit): the
  record the worker was on gets a :class:`Failure` naming the signal; the other items of its batch
  (done or not: their results died with the process) are queued again as a new batch, and a fresh
  worker takes the slot. Only the crashed record is lost; nothing else is retried twice for it.
- **Stall**: a record running longer than ``timeout`` seconds is treated like a crash (the worker
  is killed with SIGKILL, the record fails with ``timed out after N s``).
- The parent never blocks on a dead worker (it waits on the pipes and the process sentinels
  together), so a pool of N workers cannot hang the way ``multiprocessing.Pool`` does when a
  worker dies.

``workers=0`` runs the function in this process (no isolation: for debugging and for measuring
the encoders alone). Workers are forked by default; ``context="spawn"`` starts them as fresh
interpreters (for work that must not inherit the parent's state, such as a torch model whose thread
pool the parent already started: a forked OpenMP runtime can hang); ``func`` and ``init`` must then
be module-level functions.

:func:`call_isolated` is the same protection for one call made from an event loop (a server's
request): the call runs in a fresh process while the loop goes on serving; the process may ask the
caller for work (the caller's engine, say) through its :class:`Channel`, and its clock stops while
it waits for the answer, so the time limit bounds its own work only. A crash or a stall raises
:class:`IsolatedFailure` naming the stage the process had reached (``Channel.stage``).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Iterator

__all__ = ["Failure", "imap_isolated", "Channel", "IsolatedFailure", "call_isolated"]

PARTIAL_AFTER = 0.25  # seconds: a batch still running sends the results it has (bounds what a kill loses)
STARTUP = 120.0  # seconds an isolated call may take to start (fork, imports) before its own time limit counts


@dataclass(frozen=True)
class Failure:
    """An item whose worker crashed or ran past the time limit; ``reason`` is one line."""

    reason: str


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the parent dies (a killed run leaves no orphan stuck on a record)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _loop(conn, slot: int, progress, func: Callable, init: Callable | None, initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _die_with_parent()
    if init is not None:
        init(*initargs)
    mark = 2 * slot
    clock = time.monotonic
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        out: list = []
        sent = clock()
        for index, item in task:
            now = clock()
            if out and now - sent > PARTIAL_AFTER:  # a slow batch hands over what is done so far
                conn.send((False, out))
                out, sent = [], now
            progress[mark] = index
            progress[mark + 1] = now
            out.append(func(item))
        progress[mark + 1] = 0.0
        conn.send((True, out))


class _Slot:
    def __init__(self, ctx, slot: int, progress, target: tuple):
        self.slot, self.progress = slot, progress
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_loop, args=(child, slot, progress, *target), daemon=True)
        self.proc.start()
        child.close()
        self.task: list | None = None

    def give(self, task: list) -> None:
        self.progress[2 * self.slot] = task[0][0]  # blamed if the worker dies before it starts the batch
        self.progress[2 * self.slot + 1] = 0.0
        self.task = task
        self.conn.send(task)

    def current(self) -> tuple[int, float]:
        return int(self.progress[2 * self.slot]), self.progress[2 * self.slot + 1]

    def stop(self, kill: bool = False) -> None:
        if self.proc.is_alive():
            if kill:
                self.proc.kill()
            else:
                try:
                    self.conn.send(None)
                except OSError:
                    pass
        self.proc.join(timeout=None if kill else 2)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.conn.close()


def _death(proc) -> str:
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def imap_isolated(items: Iterable[Any], func: Callable[[Any], Any], *, workers: int = 1, timeout: float = 0.0,
                  batch: int = 256, heavy: Callable[[Any], bool] | None = None, init: Callable | None = None,
                  initargs: tuple = (), before_wait: Callable[[], None] | None = None,
                  context: str = "fork") -> Iterator[tuple[Any, Any]]:
    """``(item, func(item))`` for every item, in input order, each run in a worker process (see module docstring).

    A crashed or timed-out item yields a :class:`Failure` instead of its result. ``batch``: items
    per task; ``heavy(item)``: items that travel alone (slow ones: a crash re-runs nothing else).
    ``timeout``: seconds per item, 0 for none. ``before_wait()`` is called whenever the parent is
    about to block on its workers (the caller flushes its output there). ``context``: ``fork`` or
    ``spawn`` (see the module docstring).
    """
    if workers <= 0:
        if init is not None:
            init(*initargs)
        for item in items:
            yield item, func(item)
        return
    heavy = heavy or (lambda item: False)
    size = max(1, batch)
    source = enumerate(items)
    carry: list = []

    def next_batch() -> list | None:
        task = carry[:]
        carry.clear()
        if task and heavy(task[0][1]):
            return task
        for pair in source:
            if heavy(pair[1]):
                if task:
                    carry.append(pair)
                    return task
                return [pair]
            task.append(pair)
            if len(task) >= size:
                return task
        return task or None

    ctx = mp.get_context(context)
    progress = ctx.RawArray("d", 2 * workers)
    target = (func, init, initargs)
    slots = [_Slot(ctx, k, progress, target) for k in range(workers)]
    requeued: deque[list] = deque()
    results: dict[int, Any] = {}
    next_out = 0
    pulled = 0  # items taken from the source
    exhausted = False
    ahead = max(8 * workers * size, 64)  # results held for in-order writing, at most

    def fail(s: _Slot, reason: str) -> None:
        index, _ = s.current()
        task, s.task = s.task or [], None
        results[index] = (dict(task).get(index), Failure(reason))
        rest = [pair for pair in task if pair[0] != index]
        if rest:
            requeued.appendleft(rest)
        s.stop(kill=True)
        slots[s.slot] = _Slot(ctx, s.slot, progress, target)

    try:
        while True:
            for s in slots:
                if s.task is not None:
                    continue
                if requeued:
                    s.give(requeued.popleft())
                elif not exhausted and pulled - next_out < ahead:
                    task = next_batch()
                    if task is None:
                        exhausted = True
                    else:
                        pulled += len(task)
                        s.give(task)
            busy = [s for s in slots if s.task is not None]
            if not busy:
                if exhausted and not requeued:
                    break
            else:
                if before_wait is not None:
                    before_wait()
                ready = set(wait([s.conn for s in busy] + [s.proc.sentinel for s in busy],
                                 timeout=min(0.5, timeout / 4) if timeout else None))
                now = time.monotonic()
                for s in busy:
                    if s.conn in ready:
                        try:
                            final, out = s.conn.recv()
                        except (EOFError, OSError):
                            final = None
                        if final is not None:
                            for (index, item), res in zip(s.task, out):
                                results[index] = (item, res)
                            s.task = None if final else s.task[len(out):]
                            continue
                    if s.proc.sentinel in ready or not s.proc.is_alive():
                        s.proc.join()
                        fail(s, f"worker process {_death(s.proc)} on this record (a crash in the parsing library)")
                        continue
                    index, started = s.current()
                    if timeout and started and now - started > timeout:
                        fail(s, f"timed out after {timeout:g} s (record skipped; raise --timeout to allow more)")
            while next_out in results:
                yield results.pop(next_out)
                next_out += 1
    finally:
        for s in slots:
            s.stop(kill=s.task is not None)



# ------------------------------------------------------------------------------------------- one call, from a loop
class Channel:
    """The isolated process's line to its caller (:func:`call_isolated`): ``ask`` for work the caller does,
    ``stage`` to say what it is doing (named when it fails there)."""

    def __init__(self, conn):
        self._conn = conn

    def ask(self, message: Any) -> Any:
        """The caller's answer to ``message`` (the caller's ``answer(message)``); this process's clock is stopped
        meanwhile."""
        self._conn.send(("ask", message))
        kind, value = self._conn.recv()
        if kind == "raise":
            raise value
        return value

    def stage(self, text: str) -> None:
        self._conn.send(("stage", text))


class IsolatedFailure(RuntimeError):
    """An isolated call that crashed, ran past its time limit or raised something that cannot travel back.
    ``stage``: the last stage it named (``Channel.stage``), None before the first."""

    def __init__(self, reason: str, stage: str | None):
        super().__init__(reason)
        self.reason, self.stage = reason, stage


def _call_entry(conn, func: Callable | str, args: tuple) -> None:
    """The isolated process: ``func(channel, *args)``, its result or its exception sent back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the caller's to handle
    _die_with_parent()
    try:
        if isinstance(func, str):  # "module:name", imported here (the caller need not import it)
            import importlib

            module, _, name = func.partition(":")
            func = getattr(importlib.import_module(module), name)
        conn.send(("ready", None))  # the time limit starts now
        result = ("done", func(Channel(conn), *args))
    except BaseException as e:  # noqa: BLE001 - every outcome goes back to the caller
        result = ("raised", e)
    try:
        conn.send(result)
    except Exception as e:  # noqa: BLE001 - an exception or result that does not pickle
        conn.send(("raised", RuntimeError(f"{type(result[1]).__name__}: {result[1]} ({e})")))
    conn.close()


async def call_isolated(func: Callable | str, *args: Any, ctx=None, timeout: float = 0.0,
                        answer: Callable[[Any], Any] | None = None) -> Any:
    """``func(channel, *args)`` in a fresh process of the multiprocessing context ``ctx`` (default: forkserver;
    ``func`` and ``args`` must pickle; ``func`` may be ``"module:name"``, imported in the process only), awaited
    without blocking the event loop.

    ``await answer(message)`` answers each ``channel.ask(message)`` (an exception it raises is raised in the
    process). ``timeout``: seconds the process may work, not counting its start (imports: at most ``STARTUP``
    seconds) and its waits for answers (0: no limit). Its
    exception is raised here; a crash, a stall past ``timeout`` or a cancellation kills the process (a
    crash and a stall raise :class:`IsolatedFailure`).
    """
    loop = asyncio.get_running_loop()
    ctx = ctx or mp.get_context("forkserver")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_call_entry, args=(child, func, args), daemon=True)
    proc.start()
    child.close()
    stage: str | None = None
    used = 0.0
    ready = False  # the process has imported what it runs: its time limit counts from here

    def wake(fut: asyncio.Future) -> None:
        if not fut.done():
            fut.set_result(None)

    try:
        while True:
            woken = loop.create_future()
            loop.add_reader(conn.fileno(), wake, woken)
            loop.add_reader(proc.sentinel, wake, woken)
            started = time.monotonic()
            limit = (timeout - used if ready else STARTUP) if timeout else None
            try:
                await asyncio.wait_for(woken, limit)
            except asyncio.TimeoutError:
                raise IsolatedFailure(f"timed out after {timeout:g} s" if ready else
                                      f"did not start within {STARTUP:g} s", stage) from None
            finally:
                loop.remove_reader(conn.fileno())
                loop.remove_reader(proc.sentinel)
                for fd in (conn.fileno(), proc.sentinel):  # uvloop leaves them non-blocking: the pipe's
                    os.set_blocking(fd, True)             # reads and writes below expect whole messages
                if ready:
                    used += time.monotonic() - started
            if not conn.poll():
                proc.join(1)
                raise IsolatedFailure(f"crashed ({_death(proc)})", stage)
            try:
                kind, value = conn.recv()
            except (EOFError, OSError):
                proc.join(1)
                raise IsolatedFailure(f"crashed ({_death(proc)})", stage) from None
            if kind == "ready":
                ready = True
            elif kind == "stage":
                stage = value
            elif kind == "ask":
                try:
                    reply = ("answer", await answer(value)) if answer is not None else \
                        ("raise", RuntimeError("nothing answers this process's questions"))
                except Exception as e:  # noqa: BLE001 - raised in the process, which decides
                    reply = ("raise", e)
                conn.send(reply)
            elif kind == "done":
                return value
            else:
                raise value
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join(5)
        conn.close()
