"""The input-limit flags, one definition for ``logos tokenize``, ``logos generate`` and ``logos serve``.

``--timeout``, ``--max-atoms`` and ``--max-mb`` are tokenize's (:class:`logos.data.limits.Limits`);
generation inputs add ``--max-chars``, ``--max-residues`` and ``--max-records``
(:class:`logos.data.limits.InputLimits`). Each command keeps its own defaults (a server reads less per
request than a batch run per file).
"""

from __future__ import annotations

import argparse

__all__ = ["add_limit_arguments", "limits_of"]


def add_limit_arguments(p: argparse.ArgumentParser, inputs: bool = True, helps: dict | None = None,
                        **defaults) -> None:
    """The limit flags on ``p`` (``inputs``: also the generation-input ones); ``defaults``: per-command defaults
    by field name, else the dataclass's; ``helps``: a command's own wording of a flag's help, by field name (the
    default is appended)."""
    from logos.data.limits import InputLimits

    base = InputLimits()
    helps = helps or {}

    def default(name: str):
        return defaults.get(name, getattr(base, name))

    g = p.add_argument_group("input limits (checked before a parsing library sees a record; 0: no limit)")
    g.add_argument("--timeout", type=float, default=default("timeout"), metavar="S",
                   help=helps.get("timeout", "seconds one record may take in its isolated worker before it is "
                                                        "refused") + f" (default {default('timeout'):g})")
    g.add_argument("--max-atoms", type=int, default=default("max_atoms"), metavar="N",
                   help=f"refuse SMILES/SDF/reaction records (and formulas) with more atoms, before RDKit reads them "
                        f"(default {default('max_atoms')})")
    g.add_argument("--max-mb", type=float, default=default("max_mb"), metavar="MB",
                   help=helps.get("max_mb", "refuse structure and crystal files (and input files) larger than "
                                                       "this") + f" (default {default('max_mb'):g})")
    if inputs:
        g.add_argument("--max-chars", type=int, default=default("max_chars"), metavar="N",
                       help=f"refuse input records (lines, JSON records, sequences) longer than this (default "
                            f"{default('max_chars')})")
        g.add_argument("--max-residues", type=int, default=default("max_residues"), metavar="N",
                       help=f"refuse protein inputs with more residues in all (default {default('max_residues')})")
        g.add_argument("--max-records", type=int, default=default("max_records"), metavar="N",
                       help=f"read at most this many records of an input (default {default('max_records')})")


def limits_of(args: argparse.Namespace, inputs: bool = True):
    """The :class:`Limits` (``inputs``: :class:`InputLimits`) the flags of :func:`add_limit_arguments` name."""
    from logos.data.limits import InputLimits, Limits
    from logos.util.records import InputError

    try:
        if not inputs:
            return Limits(timeout=args.timeout, max_atoms=args.max_atoms, max_mb=args.max_mb)
        return InputLimits(timeout=args.timeout, max_atoms=args.max_atoms, max_mb=args.max_mb,
                           max_chars=args.max_chars, max_residues=args.max_residues, max_records=args.max_records)
    except ValueError as e:
        raise InputError(str(e)) from None
