"""``logos tokenize``: scientific files -> grammar-text JSONL, in parallel, with progress and an error log.

Files are read in the main process (cheap: lines, SDF blocks, paths); the domain encoders run in
``workers`` processes on chunks of items, and results are written in input order. A bad record or
file is reported once (stderr line + ``OUT.errors.jsonl``) and never stops the run.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import json
import multiprocessing as mp
import sys
import time
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterable, Iterator

from tqdm import tqdm

from logos import __version__
from logos.domains import DOMAINS, detect
from logos.records import HEADER_KEY, ErrorLog, InputError, RecordError, WorkItem, errors_path_for

__all__ = ["TokenizeResult", "tokenize_files"]

CHUNK = 1024  # items per task sent to a worker: large enough to amortize pickling and IPC


@dataclass
class TokenizeResult:
    records: int
    inputs: int
    errors: int
    seconds: float

    @property
    def exit_code(self) -> int:
        """0: everything written; 1: some records or files rejected (all good ones written)."""
        return 1 if self.errors else 0


def _items(paths: Iterable[Path], domain: str | None, options: dict) -> Iterator[tuple[str | None, WorkItem]]:
    for path in paths:
        try:
            dom = DOMAINS[domain] if domain else detect(path)
            for item in dom.read(path, options[dom.name]):
                yield dom.name, item
        except (InputError, OSError, EOFError, UnicodeError, csv.Error) as e:
            reason = str(e) if isinstance(e, RecordError) else f"cannot read: {e}"
            yield None, WorkItem(str(path), None, extra={"error": reason})


_OPTIONS: dict = {}


def _init_worker(options: dict) -> None:
    global _OPTIONS
    _OPTIONS = options


def _encode_one(domain: str | None, item: WorkItem) -> tuple[str, list[str], list[tuple[str, str]]]:
    """(source, JSON lines of the good records, (source, reason) of the bad ones) for one work item.

    Records are serialized here, in the worker, so the main process only writes lines.
    """
    if item.payload is None:
        return item.source, [], [(item.source, item.extra.get("error", "unreadable record"))]
    try:
        records = DOMAINS[domain].encode(item, _OPTIONS[domain])
    except RecordError as e:
        return item.source, [], [(item.source, str(e))]
    except Exception as e:  # an encoder bug must not lose the other records
        return item.source, [], [(item.source, f"internal error ({type(e).__name__}): {e}")]
    lines, bad = [], []
    for rec in records:
        if "text" not in rec and "error" in rec:  # one bad part of a multi-record item
            bad.append((rec.get("source", item.source), rec["error"]))
        else:
            lines.append(_json_line(rec))
    return item.source, lines, bad


_quote = json.encoder.encode_basestring  # the C string encoder behind json.dumps(..., ensure_ascii=False)


def _json_line(rec: dict) -> str:
    """``json.dumps(rec) + "\\n"``, faster for the common all-string record (no meta)."""
    if all(type(v) is str for v in rec.values()):
        return "{" + ", ".join(f"{_quote(k)}: {_quote(v)}" for k, v in rec.items()) + "}\n"
    return json.dumps(rec, ensure_ascii=False) + "\n"


def _encode_chunk(chunk: list[tuple[str | None, WorkItem]]) -> list[tuple[str, list[str], list[tuple[str, str]]]]:
    return [_encode_one(domain, item) for domain, item in chunk]


def _chunks(it: Iterator, size: int) -> Iterator[list]:
    while chunk := list(islice(it, size)):
        yield chunk


def _estimate(paths: list[Path], domain: str | None) -> int | None:
    total = 0
    for path in paths:
        try:
            total += (DOMAINS[domain] if domain else detect(path)).count(path)
        except (InputError, OSError, EOFError, UnicodeError):
            continue
    return total or None


def tokenize_files(
    paths: list[Path],
    out: Path,
    options: dict | None = None,
    domain: str | None = None,
    workers: int = 1,
    progress: bool | None = None,
    echo=None,
) -> TokenizeResult:
    """Encode ``paths`` into ``out`` (JSONL). ``options`` maps domain name -> its typed options
    (:func:`logos.domains.encoder_options`; default: every domain's defaults)."""
    from logos.domains import default_options

    options = {**default_options(), **(options or {})}
    start = time.perf_counter()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=_estimate(paths, domain), unit="rec", disable=None if progress is None else not progress,
               desc="tokenize", dynamic_ncols=True, mininterval=0.5, file=sys.stderr)
    errors = ErrorLog(errors_path_for(out), echo=echo or (lambda line: bar.write(line, file=sys.stderr)))
    header = {HEADER_KEY: {
        "logos_version": __version__, "grammar": "v1",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "inputs": [str(p) for p in paths], "domain": domain or "detected",
        "options": {name: dataclasses.asdict(opts) for name, opts in options.items() if name in DOMAINS},
    }}
    n_records = n_inputs = 0
    items = _items(paths, domain, options)
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(header) + "\n")
        if workers <= 1:
            _init_worker(options)
            results: Iterable = ([_encode_one(d, it)] for d, it in items)
        else:
            pool = mp.get_context("fork").Pool(workers, initializer=_init_worker, initargs=(options,))
            results = pool.imap(_encode_chunk, _chunks(items, CHUNK))
        try:
            for batch in results:
                for _, lines, bad in batch:
                    for where, reason in bad:
                        errors.add(where, reason)
                    fh.writelines(lines)
                    n_records += len(lines)
                n_inputs += len(batch)
                bar.update(len(batch))
        finally:
            if workers > 1:
                pool.terminate()
            bar.close()
            errors.close()
    return TokenizeResult(n_records, n_inputs, errors.count, time.perf_counter() - start)
