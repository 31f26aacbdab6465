"""``logos tokenize``: scientific files -> grammar-text JSONL, in parallel, with progress and an error log.

Files are read in the main process (cheap: lines, SDF blocks, paths); the domain encoders run in
``workers`` isolated processes (:mod:`logos.util.isolate`) on batches of items, and results are written
in input order. A bad record or file is reported once (stderr line + ``OUT.errors.jsonl``) and
never stops the run.

Isolation (:class:`logos.data.limits.Limits`, recorded in the output header): RDKit, gemmi and spglib only ever run
in worker processes, so a segfault or a stall costs one record (its error line says so), never the
run; ``--timeout`` bounds each record. Before a library sees a record, cheap checks on the raw text
refuse the absurd ones (``--max-atoms`` for SMILES, SDF and reaction records, counted by a regex
only when the string is longer than the limit; ``--max-mb`` for structure and crystal files): a
20,000-atom SMILES chain is refused in microseconds instead of crashing RDKit's recursion. Light
records (lines, SDF blocks) travel in batches of 256, files alone, so a crash re-runs at most one
batch and the overhead per SMILES stays a few microseconds. The output is flushed as records arrive:
a killed run keeps everything it wrote (the file is flushed whenever the main process waits for
its workers, and workers hand over a slow batch's finished records every 0.25 s).
"""

from __future__ import annotations

import csv
import dataclasses
import datetime as _dt
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from tqdm import tqdm

from logos.util.version import VERSION as __version__
from logos.domains import DOMAINS, detect
from logos.language.grammar import GRAMMAR_VERSION
from logos.data.limits import Limits, smiles_atoms, too_big
from logos.util.isolate import Failure, imap_isolated
from logos.util.records import HEADER_KEY, ErrorLog, InputError, RecordError, WorkItem, errors_path_for

__all__ = ["TokenizeResult", "tokenize_files", "encode_items", "oversize", "is_heavy", "work_items"]

BATCH = 256  # light items per task sent to a worker: amortizes pickling and IPC, bounds what a crash re-runs


LONG_TEXT = 2000  # characters: a longer SMILES/SDF record travels alone, like a file


def is_heavy(pair: tuple[str | None, WorkItem]) -> bool:
    """Items that travel alone: whole files, CIF blocks, and long records (the ones that crash or stall a
    library): the batch before them is finished and written first, and a crash re-runs nothing else."""
    p, extra = pair[1].payload, pair[1].extra
    if p is None:
        return False
    return not isinstance(p, str) or bool(extra.get("format") or extra.get("structure")) or len(p) > LONG_TEXT


ATOM_COUNTED = ("molecule", "reaction")  # domains whose text records are SMILES / SDF (a protein sequence is not)


def oversize(item: WorkItem, limits: Limits, domain: str | None = None) -> str | None:
    """Why an item is too big for its library (a cheap look at the raw text), or None. ``--max-atoms``
    applies to the SMILES, SDF and reaction records of ``ATOM_COUNTED`` domains (all text records when
    ``domain`` is None)."""
    p = item.payload
    if p is None:
        return None
    if isinstance(p, str) and not item.extra.get("format") and not item.extra.get("structure"):
        if limits.max_atoms and len(p) > limits.max_atoms and (domain is None or domain in ATOM_COUNTED):
            if item.extra.get("sdf"):
                counts = p.split("\n", 4)[3] if p.count("\n") >= 4 else ""
                m = re.search(r"COUNTS\s+(\d+)", p[:4000]) if "V3000" in counts else None
                n = int(m.group(1)) if m else int(counts[:3]) if counts[:3].strip().isdigit() else 0
            else:
                n = smiles_atoms(p)
            if n > limits.max_atoms:
                return f"{n:,} atoms, more than --max-atoms {limits.max_atoms:,} (not parsed)"
        return None
    paths = [p] if item.extra.get("structure") else [p.get("structure")] if isinstance(p, dict) else []
    size = len(p) if isinstance(p, str) and item.extra.get("format") else \
        max((os.path.getsize(x) for x in paths if x and os.path.exists(x)), default=0)
    return too_big(size, limits)


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


def work_items(paths: Iterable[Path], domain: str | None, options: dict,
           limits: Limits) -> Iterator[tuple[str | None, WorkItem]]:
    for path in paths:
        try:
            dom = DOMAINS[domain] if domain else detect(path)
            for item in dom.read(path, options[dom.name]):
                reason = oversize(item, limits, dom.name)
                if reason:
                    item = WorkItem(item.source, None, item.id, extra={"error": reason})
                yield dom.name, item
        except (InputError, OSError, EOFError, UnicodeError, csv.Error) as e:
            reason = str(e) if isinstance(e, RecordError) else f"cannot read: {e}"
            yield None, WorkItem(str(path), None, extra={"error": reason})


_OPTIONS: dict = {}


def _init_worker(options: dict) -> None:
    global _OPTIONS
    _OPTIONS = options


def _encode_one(pair: tuple[str | None, WorkItem]) -> tuple[str, list[str], list[tuple[str, str]]]:
    """(source, JSON lines of the good records, (source, reason) of the bad ones) for one work item.

    Records are serialized here, in the worker, so the main process only writes lines.
    """
    domain, item = pair
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


def encode_items(pairs: Iterable[tuple[str | None, WorkItem]], options: dict, limits: Limits, workers: int = 1,
                 before_wait=None) -> Iterator[tuple[WorkItem, list[str], list[tuple[str, str]]]]:
    """(item, JSON lines of its good records, (source, reason) of its bad ones) per (domain, work item), in
    input order; the encoders run in ``workers`` isolated processes (a crash or a timeout is one bad record)."""
    results = imap_isolated(pairs, _encode_one, workers=workers, timeout=limits.timeout, batch=BATCH, heavy=is_heavy,
                            init=_init_worker, initargs=(options,), before_wait=before_wait)
    try:
        for (_, item), result in results:
            if isinstance(result, Failure):
                result = (item.source, [], [(item.source, result.reason)])
            yield item, result[1], result[2]
    finally:
        results.close()


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
    limits: Limits | None = None,
) -> TokenizeResult:
    """Encode ``paths`` into ``out`` (JSONL). ``options`` maps domain name -> its typed options
    (:func:`logos.domains.encoder_options`; default: every domain's defaults). ``workers``: isolated
    encoder processes (0: encode in this process, without isolation)."""
    from logos.domains import default_options

    options = {**default_options(), **(options or {})}
    limits = limits or Limits()
    start = time.perf_counter()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=_estimate(paths, domain), unit="rec", disable=None if progress is None else not progress,
               desc="tokenize", dynamic_ncols=True, mininterval=0.5, file=sys.stderr)
    errors = ErrorLog(errors_path_for(out), echo=echo or (lambda line: bar.write(line, file=sys.stderr)))
    header = {HEADER_KEY: {
        "logos_version": __version__, "grammar": GRAMMAR_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "inputs": [str(p) for p in paths], "domain": domain or "detected",
        "options": {name: dataclasses.asdict(opts) for name, opts in options.items() if name in DOMAINS},
        "limits": dataclasses.asdict(limits),
    }}
    n_records = n_inputs = 0
    items = work_items(paths, domain, options, limits)
    with open(out, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(header) + "\n")
        fh.flush()
        encoded = encode_items(items, options, limits, workers, before_wait=fh.flush)
        try:
            for _, lines, bad in encoded:
                for where, reason in bad:
                    errors.add(where, reason)
                fh.writelines(lines)
                n_records += len(lines)
                n_inputs += 1
                bar.update(1)
        finally:
            encoded.close()  # stops the workers now, also when the loop ends early
            bar.close()
            errors.close()
    return TokenizeResult(n_records, n_inputs, errors.count, time.perf_counter() - start)
