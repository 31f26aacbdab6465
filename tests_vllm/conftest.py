"""The vLLM tests (``make test-vllm``, in ``.venv-vllm``): never collected by ``make test`` (``testpaths = tests``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "checkpoints" / "logos-tiny"

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # a shared machine: no core pinning
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def pytest_collection_modifyitems(config, items):
    pytest.importorskip("vllm", reason="make test-vllm runs these in .venv-vllm")
