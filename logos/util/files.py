"""Files: the one atomic-write helper (temp file in the same folder, then rename) and the download cache folder."""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import IO, Iterator

__all__ = ["atomic_path", "atomic_open", "write_atomic", "cache_dir"]


def cache_dir() -> Path:
    """``$LOGOS_CACHE``, default ``~/.cache/logos`` (never the repository); created on first use."""
    path = Path(os.environ.get("LOGOS_CACHE", Path.home() / ".cache" / "logos"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def atomic_path(path: Path, fsync: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path``; on success it is renamed to ``path`` (readers never see half a file).

    On an exception the temporary file is removed and ``path`` keeps its old content (or stays absent).
    The name is unique per call (``.NAME.<hex>.tmp``), so concurrent writers never share a temp file.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        yield tmp
        if fsync:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w", fsync: bool = False, **kwargs) -> Iterator[IO]:
    """``open(path, mode)`` that writes a temporary file and renames it over ``path`` when the block succeeds."""
    with atomic_path(path, fsync=fsync) as tmp, open(tmp, mode, **kwargs) as fh:
        yield fh


def write_atomic(path: Path, data: str | bytes, fsync: bool = False) -> None:
    """Write ``data`` (text as UTF-8) to ``path`` atomically."""
    with atomic_open(path, "wb" if isinstance(data, bytes) else "w", fsync=fsync,
                     **({} if isinstance(data, bytes) else {"encoding": "utf-8"})) as fh:
        fh.write(data)
