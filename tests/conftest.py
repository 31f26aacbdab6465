"""Shared test helpers: fixture paths, an in-process CLI runner and an event-loop liveness counter."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import pytest

ASSETS = Path(__file__).parent / "assets"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def run_cli(capsys):
    """Run ``logos ARGS`` in-process; returns (exit_code, stderr)."""
    from logos.cli import main

    def run(*args: str) -> tuple[int, str]:
        code = main([str(a) for a in args])
        return code, capsys.readouterr().err

    return run


def records(path: Path) -> list[dict]:
    out = []
    for line in Path(path).read_text().splitlines():
        obj = json.loads(line)
        if "logos_header" not in obj:
            out.append(obj)
    return out


@contextlib.asynccontextmanager
async def loop_ticks():
    """Count 50 ms ticks of the running event loop while the block runs (``ticks[0]``): whether the loop stayed free."""
    ticks = [0]

    async def ticker():
        while True:
            await asyncio.sleep(0.05)
            ticks[0] += 1

    task = asyncio.create_task(ticker())
    try:
        yield ticks
    finally:
        task.cancel()
