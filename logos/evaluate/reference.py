"""Reference sets for evaluation: read once, canonicalized once, cached by digest with their statistics.

A reference (a test set, or a model's training corpus for novelty and contamination) is named either
by a bundled dataset (``moses-test``, ``moses-train``, ``mp-dielectric``, ... fetched by
:func:`logos.data.fetch`) or by a file. Its canonical form is computed once and cached under
``$LOGOS_CACHE/evaluate/`` (default ``~/.cache/logos``) in a file named by the kind of key and the
sha256 of the source file, so an edited source is never served stale. Cache formats are safe to load:
plain text (one canonical key per line), JSON, and ``.npy`` read with ``allow_pickle=False``; never
pickles. A cache file is written to ``NAME.part`` and renamed, so an interrupted run leaves no
half-written cache.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from logos.data.datasets import DATASETS, fetch
from logos.util.files import atomic_path, cache_dir
from logos.evaluate.report import sha256_of
from logos.util.records import InputError

__all__ = ["jsonl_records", "open_any", "resolve_reference", "cache_path", "cached_keys", "cached_array", "cached_json", "progress"]

# version of each kind's canonical form: bump one when it changes (reactions 2: sides iterated to a fixed point)
CACHE_SCHEMA: dict[str, int] = {"reactions": 2}


def open_any(path: Path):
    """A text file, ``.xz`` or ``.gz`` compressed ones included (utf-8)."""
    import gzip
    import lzma

    path = Path(path)
    if path.suffix == ".xz":
        return lzma.open(path, "rt", encoding="utf-8")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def jsonl_records(path: Path):
    """(line number, record) of a JSONL file, the ``logos_header`` line skipped; bad JSON: InputError naming the line."""
    with open_any(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise InputError(f"{path}:{lineno}: not a JSON object")
            if "logos_header" not in rec:
                yield lineno, rec


def resolve_reference(spec: str | Path) -> Path:
    """A file or folder path as given, else a bundled dataset name (fetched once into the cache)."""
    path = Path(spec)
    if path.exists():
        return path
    if str(spec) in DATASETS:
        return fetch(str(spec))
    raise InputError(f"{spec}: no such file, folder or bundled dataset (known: {', '.join(DATASETS)})")


_DIGESTS: dict[tuple[str, float, int], str] = {}


def _digest(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime, st.st_size)
    if key not in _DIGESTS:
        _DIGESTS[key] = sha256_of(path)
    return _DIGESTS[key]


def cache_path(kind: str, source: Path, suffix: str) -> Path:
    """``$LOGOS_CACHE/evaluate/<kind>-v<schema of kind>-<sha256 of source>[:20]<suffix>``."""
    folder = cache_dir() / "evaluate"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{kind}-v{CACHE_SCHEMA.get(kind, 1)}-{_digest(Path(source))[:20]}{suffix}"


def _atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    with atomic_path(path) as tmp:
        write(tmp)


def cached_keys(kind: str, source: Path, build: Callable[[], Iterable[str]]) -> list[str]:
    """Canonical keys of a reference (one per line, ``build`` run only on a cache miss)."""
    path = cache_path(kind, source, ".txt")
    if not path.exists():
        keys = list(build())
        _atomic_write(path, lambda p: p.write_text("".join(k + "\n" for k in keys), encoding="utf-8"))
        return keys
    return path.read_text(encoding="utf-8").splitlines()


def cached_json(kind: str, source: Path, build: Callable[[], object]):
    path = cache_path(kind, source, ".json")
    if not path.exists():
        obj = build()
        _atomic_write(path, lambda p: p.write_text(json.dumps(obj), encoding="utf-8"))
        return obj
    return json.loads(path.read_text(encoding="utf-8"))


def cached_array(kind: str, source: Path, build: Callable[[], np.ndarray]) -> np.ndarray:
    path = cache_path(kind, source, ".npy")
    if not path.exists():
        arr = np.asarray(build())

        def write(p: Path) -> None:
            with open(p, "wb") as fh:
                np.save(fh, arr, allow_pickle=False)
        _atomic_write(path, write)
        return arr
    return np.load(path, allow_pickle=False)


def progress(items: Iterable, total: int | None, desc: str, enabled: bool | None = None):
    """tqdm over ``items`` on stderr (off when ``enabled`` is False; auto: only for long work)."""
    if enabled is False or (enabled is None and (total or 0) < 20_000):
        return items
    from tqdm import tqdm

    return tqdm(items, total=total, desc=desc, unit=" rec", mininterval=2.0, leave=False)
