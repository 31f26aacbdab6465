"""Records and their files: JSONL in and out, input opening (gzip, binary check), the error log.

A record is one JSON object per line: ``text`` (grammar text), ``domain``, ``source``
(``file:record``), optional ``id``, ``meta`` and ``group`` (records with one group always share a
split). A finetuning pair has ``prompt`` and ``completion`` (the TRL convention); its ``text`` is
their concatenation. The first line of a tokenized file is a header
object ``{"logos_header": {...}}`` with the grammar version and every encoder parameter (cut-offs,
precision) used to write it; readers skip it.

Bad input never raises past a record: encoders raise :class:`RecordError`, and the
:class:`ErrorLog` prints one line on stderr (``file:record: reason``) and keeps a JSONL copy.
"""

from __future__ import annotations

import gzip
import io
import json
import lzma
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterator

__all__ = [
    "RecordError",
    "InputError",
    "WorkItem",
    "ErrorLog",
    "open_text",
    "read_records",
    "read_header",
    "errors_path_for",
    "bounded",
    "safe_name",
]

HEADER_KEY = "logos_header"


class RecordError(ValueError):
    """One input record (or a whole input file) that cannot be encoded or decoded; the message is the reason."""


class InputError(RecordError):
    """A whole input file is unusable (missing, unreadable, binary, not gzip, missing column)."""


@dataclass
class WorkItem:
    """One unit of encoding work: where it came from and what an encoder needs (picklable)."""

    source: str
    payload: object
    id: str | None = None
    extra: dict = field(default_factory=dict)


def errors_path_for(out: Path) -> Path:
    """The error log next to an output: ``out.jsonl`` -> ``out.errors.jsonl``, ``out.smi`` -> ``out.smi.errors.jsonl``.

    Logs of different outputs never share a name, so detokenizing ``c.jsonl`` to ``c.smi`` keeps
    the tokenize run's ``c.errors.jsonl``.
    """
    out = Path(out)
    name = out.name
    for suffix in (".jsonl.gz", ".jsonl"):
        if name.endswith(suffix):
            return out.with_name(name[: -len(suffix)] + ".errors.jsonl")
    return out.with_name(name + ".errors.jsonl")


MAX_REASON = 200  # characters of one error reason (the echoed input and the library's message together)
_LONG_WORD = 60  # a longer run without spaces is an echoed input (SMILES, a line of a file): cut to 40


def bounded(text: object, limit: int = MAX_REASON) -> str:
    """One line of at most ``limit`` characters: long words (echoed inputs) cut, then the whole.

    Libraries repeat the whole input in their messages (RDKit's "syntax error while parsing:
    <the SMILES>"), so a 10,000-atom SMILES would give a 10,000-character error line; cutting
    each long word first keeps the reason's own words readable.
    """
    words = []
    for w in str(text).split():
        words.append(w if len(w) <= _LONG_WORD else f"{w[:40]}...[{len(w):,} chars]")
    line = " ".join(words)
    return line if len(line) <= limit else line[: limit - 3] + "..."


_UNSAFE = re.compile(r"[^A-Za-z0-9._+=@-]+")


def safe_name(ident: object, default: str = "record", max_len: int = 100) -> str:
    """The one sanitizer of output file names built from input identifiers (ids, titles, CIF blocks).

    Keeps letters, digits and ``. _ + = @ -``; every other run (``/``, ``\\``, NUL, spaces,
    control characters) becomes ``_``; leading dots are dropped (no ``..``, no hidden files), so the
    result is always one plain name inside the output folder; empty -> ``default``.
    """
    name = _UNSAFE.sub("_", str(ident)).strip("._")[:max_len].rstrip("._")
    return name or default


class ErrorLog:
    """Collects bad records: one line each on stderr, and a JSONL file of ``{source, reason}``."""

    def __init__(self, path: Path | None, echo=None):
        self.path = path
        self.count = 0
        self.first: str | None = None  # the first line added (``source: reason``)
        self._fh: IO[str] | None = None
        self._echo = echo or (lambda line: print(line, file=sys.stderr))

    def add(self, source: str, reason: str) -> None:
        reason = bounded(reason)
        source = str(source) if len(str(source)) <= 300 else str(source)[:297] + "..."
        self.count += 1
        if self.first is None:
            self.first = f"{source}: {reason}"
        self._echo(f"{source}: {reason}")
        if self.path is not None:
            if self._fh is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "w", encoding="utf-8")
            self._fh.write(json.dumps({"source": source, "reason": reason}) + "\n")
            self._fh.flush()  # a killed run keeps its error log too

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
        elif self.path is not None and self.path.exists():
            self.path.unlink()  # a stale log from an earlier run would mislead


_GZIP_MAGIC = b"\x1f\x8b"
_XZ_MAGIC = b"\xfd7zXZ\x00"  # benchmark sets ship as .xz (USPTO-50k, CDVAE's CSVs)


def plain_name(path: Path) -> str:
    """The file name in lower case without a compression suffix (``x.csv.xz`` -> ``x.csv``): what format it holds."""
    name = Path(path).name.lower()
    for suffix in (".gz", ".xz"):
        name = name.removesuffix(suffix)
    return name


def _open_checked(path: Path) -> tuple[IO[bytes], bytes]:
    """The decompressed byte stream of a text input and its first 8 KiB; InputError if it is unusable."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(8192)
    except OSError as e:
        raise InputError(f"cannot read file: {e.strerror or e}") from None
    if path.suffix == ".gz" and not head.startswith(_GZIP_MAGIC):
        raise InputError("named .gz but is not gzip data")
    if path.suffix == ".xz" and not head.startswith(_XZ_MAGIC):
        raise InputError("named .xz but is not xz data")
    opener = gzip.open if head.startswith(_GZIP_MAGIC) else lzma.open if head.startswith(_XZ_MAGIC) else None
    if opener is not None:
        try:
            with opener(path, "rb") as fh:
                head = fh.read(8192)
        except (OSError, EOFError, lzma.LZMAError) as e:
            raise InputError(f"corrupt {'gzip' if opener is gzip.open else 'xz'} data: {e}") from None
        raw: IO[bytes] = opener(path, "rb")
    else:
        raw = open(path, "rb")
    if b"\x00" in head:
        raw.close()
        raise InputError("binary file, not text")
    return raw, head


def open_text(path: Path) -> IO[str]:
    """Open a text input, plain, gzip or xz (by content, not name); InputError if it is unusable."""
    raw, head = _open_checked(path)
    encoding = "utf-8-sig"  # a byte-order mark is dropped, not read as part of the first field
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not just a multi-byte character cut at the 8 KiB boundary
            encoding = "latin-1"  # legacy 8-bit text (names with accents); SMILES are ASCII anyway
    return io.TextIOWrapper(raw, encoding=encoding, errors="replace", newline=None)


def read_text_bytes(path: Path) -> bytes:
    """The whole content of a text input as bytes (plain, gzip or xz), for byte-oriented parsers such as
    gemmi: the checks of :func:`open_text` without decoding; InputError if it is unusable."""
    raw, _ = _open_checked(path)
    with raw:
        try:
            data = raw.read()
        except (OSError, EOFError, lzma.LZMAError) as e:
            raise InputError(f"corrupt compressed data: {e}") from None
    return data[3:] if data.startswith(b"\xef\xbb\xbf") else data  # a byte-order mark is not content


def read_header(path: Path) -> dict:
    """The header of a tokenized JSONL file ({} when it has none)."""
    with open_text(path) as fh:
        first = fh.readline()
    try:
        obj = json.loads(first)
    except json.JSONDecodeError:
        return {}
    return obj.get(HEADER_KEY, {}) if isinstance(obj, dict) else {}


def read_records(path: Path, errors: ErrorLog | None = None) -> Iterator[dict]:
    """Yield the records of a JSONL file; lines that are not records go to ``errors``."""
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            source = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                if errors is not None:
                    errors.add(source, f"not JSON: {e.msg}")
                continue
            if isinstance(obj, dict) and HEADER_KEY in obj:
                continue
            if isinstance(obj, dict) and "text" not in obj and isinstance(obj.get("prompt"), str) \
                    and isinstance(obj.get("completion"), str):
                obj["text"] = obj["prompt"] + obj["completion"]
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                if errors is not None:
                    errors.add(source, "not a record: needs a string field 'text' (or 'prompt' and 'completion')")
                continue
            obj.setdefault("source", source)
            yield obj
