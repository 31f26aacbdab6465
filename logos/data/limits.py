"""Bounds on an input record, checked on its raw text before a parsing library sees it (tokenize, generate, serve).

RDKit, gemmi and spglib crash or stall on absurd inputs (RDKit segfaults on a 20,000-atom SMILES chain
and runs for more than ten minutes on a 200,000-atom one), and a crash or a stall can only be contained
by a separate process or avoided by not parsing. A count on the raw text refuses such records in
microseconds, with a reason that names the option to raise:

- :class:`Limits`: ``logos tokenize``'s (``--timeout``, ``--max-atoms``, ``--max-mb``), recorded in its
  output header and in a corpus build's digests;
- :class:`InputLimits`: the same plus what bounds the inputs of ``logos generate --input`` and of a
  ``logos serve`` request (``--max-chars`` of a record, ``--max-residues`` of a sequence,
  ``--max-records`` of an input).

Atoms of a SMILES are counted by a regex over bracket atoms and organic-subset symbols, only when the
string is longer than the limit (a shorter one cannot hold more atoms than characters).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Limits", "InputLimits", "smiles_atoms", "too_many_atoms", "too_long", "too_many_residues", "too_big",
           "SERVE_LIMITS"]

SERVE_LIMITS = {"max_mb": 16.0, "max_records": 64}  # logos serve's defaults where a request differs from a file


@dataclass(frozen=True)
class Limits:
    """Per-record limits of ``logos tokenize`` (0 turns a limit off); written to the output header."""

    timeout: float = 60.0
    """Seconds one record may take in its worker before it is killed and reported."""
    max_atoms: int = 1000
    """Atoms in one SMILES, SDF or reaction record (checked on the raw text before RDKit sees it)."""
    max_mb: float = 200.0
    """Megabytes of one structure or crystal file (or CIF block), checked before gemmi sees it."""

    def __post_init__(self):
        if any(getattr(self, f) < 0 for f in self.__dataclass_fields__):
            raise ValueError("limits must be >= 0 (0: no limit)")


@dataclass(frozen=True)
class InputLimits(Limits):
    """The limits of a generation input (``logos generate --input``, a ``logos serve`` request): tokenize's, and
    the length of a record, of a sequence, and the number of records (0 turns a limit off)."""

    max_chars: int = 100_000
    """Characters of one input record (a line, a JSON record, a sequence)."""
    max_residues: int = 10_000
    """Residues of one input record's protein chains together (a FASTA sequence, a structure's chains)."""
    max_records: int = 0
    """Records of one input (a file of ``logos generate --input``, the ``input`` of a request); 0: no limit."""


# Atoms of a SMILES: bracket atoms and organic-subset symbols (ring-bond digits and bonds are not atoms).
_SMILES_ATOM = re.compile(r"\[[^\]]*\]|Br|Cl|[BCNOPSFIbcnops*]")


def smiles_atoms(text: str) -> int:
    """Atoms written in a SMILES or reaction SMILES, counted on the text (no parsing)."""
    return len(_SMILES_ATOM.findall(text))


def too_many_atoms(text: str, limits: Limits) -> str | None:
    """Why a SMILES (or reaction SMILES) is too big for RDKit, or None."""
    if limits.max_atoms and len(text) > limits.max_atoms:
        n = smiles_atoms(text)
        if n > limits.max_atoms:
            return f"{n:,} atoms, more than --max-atoms {limits.max_atoms:,} (not parsed)"
    return None


def too_long(text: str, limits: InputLimits) -> str | None:
    """Why a record is too long to read further, or None."""
    if limits.max_chars and len(text) > limits.max_chars:
        return f"{len(text):,} characters, more than --max-chars {limits.max_chars:,} (not parsed)"
    return None


def too_many_residues(count: int, limits: InputLimits) -> str | None:
    """Why protein chains of ``count`` residues in all are too long, or None."""
    if limits.max_residues and count > limits.max_residues:
        return f"{count:,} residues, more than --max-residues {limits.max_residues:,} (not parsed)"
    return None


def too_big(path_or_bytes: Path | str | int, limits: Limits) -> str | None:
    """Why a file (a path, or a size in bytes) is too big for its parser, or None."""
    if not limits.max_mb:
        return None
    size = path_or_bytes if isinstance(path_or_bytes, int) else \
        os.path.getsize(path_or_bytes) if os.path.exists(path_or_bytes) else 0
    if size > limits.max_mb * 1e6:
        return f"{size / 1e6:,.1f} MB, more than --max-mb {limits.max_mb:g} (not parsed)"
    return None
