"""Shared test helpers: fixture paths and an in-process CLI runner."""

from __future__ import annotations

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
