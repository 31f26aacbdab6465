"""The domain interface: the ``Domain`` base class, typed encoder options, and the ``Writer`` base of detokenizers.

A domain (molecule, reaction, protein, pocket, crystal, MOF) is one :class:`Domain` subclass with

- ``name`` and ``options_type``: its name in records and ``--domain``, and the frozen dataclass of
  its encoder options (a :class:`DomainOptions`); each field's :func:`option` metadata is its
  command-line flag, so the CLI, corpus configs and the tokenized file's header all describe the
  same typed object;
- ``claims(path)``, ``read(path, opts)`` (yields :class:`~logos.util.records.WorkItem`), ``count(path)``;
- ``encode(item, opts) -> list[dict]``: records (RecordError on bad input); an item that yields
  several records may report one bad part without losing the others by putting
  ``{"error": reason, "source": where}`` in the list instead of a record;
- ``writers``: its detokenizers, :class:`Writer` subclasses chosen by output suffix.

Options are built from flat values (the CLI namespace, or a corpus source's mapping and flags) by
:func:`options_from_values`: a flag shared by several domains (``--column``) feeds each of them.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import IO, Any, ClassVar, Iterator, Mapping

from logos.util.records import InputError, WorkItem

__all__ = ["Domain", "DomainOptions", "option", "Writer", "TextWriter", "CsvWriter", "JsonArrayWriter",
           "WriterOptions", "add_option_arguments", "options_from_values", "parse_flags"]


def option(default: Any, help: str, metavar: str | None = None, choices: tuple | None = None,
           flag: str | None = None) -> Any:
    """A dataclass field that is also a command-line flag (``--field-name`` unless ``flag`` is given)."""
    return field(default=default, metadata={"help": help, "metavar": metavar, "choices": choices, "flag": flag})


@dataclass(frozen=True)
class DomainOptions:
    """Base of every domain's encoder options (frozen, picklable: they travel to worker processes)."""

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


class Domain(ABC):
    """One scientific domain: which files it reads, how it encodes them, which files it writes."""

    name: ClassVar[str]
    options_type: ClassVar[type[DomainOptions]] = DomainOptions
    writers: ClassVar[tuple[type["Writer"], ...]] = ()
    help_title: ClassVar[str] = ""
    """Title of this domain's group of flags in ``logos tokenize --help``."""

    @abstractmethod
    def claims(self, path: Path) -> bool:
        """Whether a file of this name (and, where needed, first bytes) belongs to the domain."""

    @abstractmethod
    def read(self, path: Path, opts: DomainOptions) -> Iterator[WorkItem]:
        """The work items of one input file (cheap: lines, blocks, paths; parsing happens in ``encode``)."""

    @abstractmethod
    def encode(self, item: WorkItem, opts: DomainOptions) -> list[dict]:
        """Records of one work item; RecordError with the reason for a bad one."""

    def count(self, path: Path) -> int:
        """Estimated number of records in a file (for the progress bar's ETA)."""
        return 1

    def __repr__(self) -> str:
        return f"<domain {self.name}>"


# ---------------------------------------------------------------- options <-> flags
def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_option_arguments(parser: argparse.ArgumentParser, domains) -> None:
    """Add every domain's option flags to ``parser`` (a flag shared by several domains is added once)."""
    seen: set[str] = set()
    for domain in domains:
        group = None
        for f in fields(domain.options_type):
            if "help" not in f.metadata or _flag(f) in seen:
                continue
            seen.add(_flag(f))
            group = group or parser.add_argument_group(domain.help_title or domain.name)
            kwargs: dict[str, Any] = {"dest": f.name, "help": f.metadata["help"], "default": f.default}
            if f.default is False:
                kwargs["action"] = "store_true"
            else:
                kwargs["metavar"] = f.metadata.get("metavar")
                if f.metadata.get("choices"):
                    kwargs["choices"] = f.metadata["choices"]
                if isinstance(f.default, (int, float)) and not isinstance(f.default, bool):
                    kwargs["type"] = type(f.default)
            group.add_argument(_flag(f), **kwargs)


def options_from_values(domains, values: Mapping[str, Any], strict: bool = True) -> dict[str, DomainOptions]:
    """Each domain's options from flat values keyed by field name; with ``strict``, unknown names are errors."""
    known = {f.name for d in domains for f in fields(d.options_type)}
    unknown = sorted(set(values) - known)
    if strict and unknown:
        raise InputError(f"unknown encoder option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    out = {}
    for d in domains:
        mine = {f.name: values[f.name] for f in fields(d.options_type) if f.name in values}
        try:
            out[d.name] = d.options_type(**mine)
        except (TypeError, ValueError) as e:
            raise InputError(f"{d.name} options: {e}") from None
    return out


def parse_flags(domains, flags: list[str]) -> dict[str, Any]:
    """Flat option values from ``logos tokenize``-style flags (``["--retro", "--pocket-cutoff", "6"]``)."""
    parser = argparse.ArgumentParser(prog="options", add_help=False, exit_on_error=False)
    add_option_arguments(parser, domains)
    parser.add_argument("--domain")
    try:
        ns, rest = parser.parse_known_args(flags)
    except (argparse.ArgumentError, SystemExit) as e:
        raise InputError(f"bad encoder flags {flags}: {e}") from None
    if rest:
        raise InputError(f"unknown encoder flag(s) {' '.join(rest)}")
    values = {k: v for k, v in vars(ns).items() if v is not None or k == "domain"}
    return values


# ---------------------------------------------------------------- writers
@dataclass(frozen=True)
class WriterOptions:
    """Options of the detokenizers (``logos detokenize`` and ``logos generate`` flags)."""

    three_d: bool = False
    """SDF: embed a 3D conformer (ETKDGv3 + MMFF) instead of a 2D depiction."""
    seed: int = 0
    """Random seed for 3D embedding."""
    cif_multi_block: bool = False
    """CIF: one multi-block file instead of one CIF per record in a folder."""


class Writer(ABC):
    """A detokenizer writing one output file; a context manager (``with Writer(path) as w: w.write(rec)``).

    ``write(record)`` returns the number of objects written, or raises RecordError for a record it
    cannot turn into its format (the caller logs it and goes on).
    """

    suffixes: ClassVar[tuple[str, ...]] = ()

    def __init__(self, path: Path, options: WriterOptions | None = None):
        self.path = Path(path)
        self.options = options or WriterOptions()
        self._closed = False
        self.open()

    def open(self) -> None:  # noqa: B027 - a hook: writers that need no opening keep it
        """Open the destination (called once by ``__init__``)."""

    @abstractmethod
    def write(self, record: dict) -> int:
        """Write one record's objects; returns how many."""

    def finish(self) -> None:  # noqa: B027 - a hook
        """Write what ends the file (a closing bracket) before it is closed."""

    def release(self) -> None:  # noqa: B027 - a hook
        """Close the destination."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.finish()
            finally:
                self.release()

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def ident(record: dict) -> str:
        """The name an object of this record is written under: its id, else its source."""
        return str(record.get("id") or record.get("source", ""))


class TextWriter(Writer):
    """A writer of one text file (``self.fh``)."""

    fh: IO[str]

    def open(self) -> None:
        self.fh = open(self.path, "w", encoding="utf-8", newline="")

    def release(self) -> None:
        self.fh.close()


class CsvWriter(TextWriter):
    """A CSV file with a header row of ``columns``; subclasses yield rows from ``rows(record)``."""

    columns: ClassVar[tuple[str, ...]] = ()

    def open(self) -> None:
        super().open()
        self.csv = csv.writer(self.fh)
        self.csv.writerow(self.columns)

    @abstractmethod
    def rows(self, record: dict) -> list[tuple]:
        """The rows of one record."""

    def write(self, record: dict) -> int:
        rows = self.rows(record)
        self.csv.writerows(rows)
        return len(rows)


class JsonArrayWriter(TextWriter):
    """A JSON array, one object per record; subclasses build it in ``item(record)`` -> (object, count)."""

    def open(self) -> None:
        super().open()
        self.fh.write("[")
        self._n = 0

    @abstractmethod
    def item(self, record: dict) -> tuple[dict, int]:
        """The JSON object of one record and the number of objects it counts as."""

    def write(self, record: dict) -> int:
        obj, n = self.item(record)
        self.fh.write(("," if self._n else "") + "\n" + json.dumps(obj, ensure_ascii=False))
        self._n += 1
        return n

    def finish(self) -> None:
        self.fh.write("\n]\n")
