"""Line and table readers shared by the SMILES-based domains (molecules, reactions).

``.smi``/``.txt`` files hold one string per line with an optional name after whitespace; ``.csv``
and ``.tsv`` files hold a header row, and the column is given or detected. Each yields
:class:`~logos.util.records.WorkItem` objects whose payload is the raw string; a bad line becomes an
item with ``payload=None`` and the reason in ``extra["error"]``, so the order of records is kept
and the caller reports it.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Callable, Iterable, Iterator

from logos.util.records import InputError, WorkItem, open_text, plain_name

__all__ = ["is_table", "iter_lines", "iter_table", "count_records"]

_TABLE_SUFFIXES = {".csv": ",", ".tsv": "\t"}


def _suffix(path: Path) -> str:
    return Path(plain_name(path)).suffix


def is_table(path: Path) -> bool:
    return _suffix(path) in _TABLE_SUFFIXES


def count_records(path: Path) -> int:
    """Cheap estimate of the number of records (lines) for the progress bar's ETA."""
    try:
        with open_text(path) as fh:
            return sum(1 for _ in fh) - (1 if is_table(path) else 0)
    except InputError:
        return 0


def iter_lines(path: Path, header_names: Iterable[str]) -> Iterator[WorkItem]:
    """One item per line of a ``.smi``-style file: ``STRING [name...]``; a header line is skipped."""
    header_names = {h.lower() for h in header_names}
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            source = f"{path}:{lineno}"
            fields = line.split(maxsplit=1)
            if not fields:
                yield WorkItem(source, None, extra={"error": "empty line"})
                continue
            if lineno == 1 and fields[0].lower() in header_names:
                continue
            name = fields[1].strip() if len(fields) > 1 else None
            yield WorkItem(source, fields[0], id=name or None)


def iter_table(
    path: Path,
    column: str | None,
    candidates: Iterable[str],
    looks_right: Callable[[str], bool],
    id_column: str | None = None,
    id_candidates: Iterable[str] = ("id", "name", "mol_id", "compound_id", "chembl_id", "zinc_id", "title"),
) -> Iterator[WorkItem]:
    """One item per data row of a CSV/TSV file, from ``column`` or the detected column.

    Detection: the first header that matches ``candidates`` (case-insensitive), else the first
    column whose first five non-empty values all satisfy ``looks_right``.
    """
    delimiter = _TABLE_SUFFIXES[_suffix(path)]
    csv.field_size_limit(sys.maxsize)  # one huge field must not end the file
    with open_text(path) as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            raise InputError("empty table: no header row") from None
        lowered = [h.strip().lower() for h in header]
        rows = ((reader.line_num, row) for row in reader)  # line_num: last line of the row (quoted newlines)
        if column is not None:
            if column not in header and column.lower() not in lowered:
                raise InputError(f"column {column!r} not found (columns: {', '.join(header)})")
            col = header.index(column) if column in header else lowered.index(column.lower())
        else:
            col = next((lowered.index(c) for c in candidates if c in lowered), None)
            buffered: list[tuple[int, list[str]]] = []
            if col is None:
                for numbered in rows:
                    buffered.append(numbered)
                    if len(buffered) >= 50:
                        break
                col = _probe_column(header, [row for _, row in buffered], looks_right)
                if col is None:
                    raise InputError(
                        f"no column looks like the expected strings (columns: {', '.join(header)}); pass --column"
                    )
            rows = _chain(buffered, rows)
        if id_column is not None:
            if id_column not in header and id_column.lower() not in lowered:
                raise InputError(f"id column {id_column!r} not found (columns: {', '.join(header)})")
            id_col = header.index(id_column) if id_column in header else lowered.index(id_column.lower())
        else:
            id_col = next((lowered.index(c) for c in id_candidates if c in lowered), None)
        for lineno, row in rows:
            source = f"{path}:{lineno}"
            if not row or not any(cell.strip() for cell in row):
                yield WorkItem(source, None, extra={"error": "empty line"})
                continue
            if col >= len(row):
                yield WorkItem(source, None, extra={"error": f"row has {len(row)} fields, no column {header[col]!r}"})
                continue
            value = row[col].strip()
            if not value:
                yield WorkItem(source, None, extra={"error": f"empty value in column {header[col]!r}"})
                continue
            ident = row[id_col].strip() if id_col is not None and id_col < len(row) else None
            yield WorkItem(source, value, id=ident or None)


def _chain(first: list, rest: Iterator) -> Iterator:
    yield from first
    yield from rest


def _probe_column(header: list[str], rows: list[list[str]], looks_right: Callable[[str], bool]) -> int | None:
    for col in range(len(header)):
        values = [r[col].strip() for r in rows if col < len(r) and r[col].strip()][:5]
        if values and all(looks_right(v) for v in values):
            return col
    return None
