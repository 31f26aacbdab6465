"""Domain registry: which encoder reads a file, which detokenizer writes an output suffix.

Every domain module provides the same small interface, so the CLI and the parallel pipeline know
nothing domain-specific:

- ``NAME``: the domain name used in records and ``--domain``;
- ``add_arguments(parser)`` / ``options(args) -> dict``: its CLI flags, as a picklable dict;
- ``claims(path) -> bool``: whether a file of this name belongs to the domain;
- ``read(path, opts)`` yields :class:`~logos.records.WorkItem`; ``count(path)`` estimates records;
- ``encode(item, opts) -> list[dict]`` turns one item into records (RecordError on bad input); an
  item that yields several records may report one bad part without losing the others by putting
  ``{"error": reason, "source": where}`` in the list instead of a record;
- ``WRITERS``: detokenizer classes with ``suffixes``, ``write(record)`` and ``close()``.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from logos.domains import crystal, mof, molecule, pocket, protein, reaction
from logos.records import InputError, open_text

__all__ = ["DOMAINS", "detect", "writer_for", "writer_suffixes"]

# Order matters for detection: the first module that claims a file wins.
# Structures (PDB, mmCIF with an ``_atom_site.`` table) go to ``pocket``, FASTA to ``protein``.
# Small-molecule crystal ``.cif`` files (fractional sites + cell) go to ``crystal``; MOFs are chosen
# with --domain mof.
DOMAINS: dict[str, ModuleType] = {m.NAME: m for m in (reaction, molecule, protein, pocket, crystal, mof)}


def detect(path: Path) -> ModuleType:
    """The domain of an input file, from its name and, for SMILES-like text, its first lines."""
    for module in DOMAINS.values():
        if module.claims(path):
            if module is molecule and _holds_reactions(path):
                return reaction
            return module
    raise InputError(f"cannot tell the domain of {path.name!r} from its name; pass --domain")


def _holds_reactions(path: Path) -> bool:
    """True when a .smi/.txt/.csv file's first data values are reaction SMILES."""
    name = path.name.lower().removesuffix(".gz")
    if name.endswith(molecule.SDF_SUFFIXES):
        return False
    try:
        with open_text(path) as fh:
            lines = [fh.readline() for _ in range(6)]
    except InputError:
        return False
    sep = "," if name.endswith(".csv") else "\t" if name.endswith(".tsv") else None
    values = []
    for line in lines[1:] if sep else lines:
        fields = line.split(sep) if sep else line.split()
        values.extend(f.strip() for f in fields if f.strip())
    if sep and lines and any(h.strip().lower() in ("rxn", "reaction", "reaction_smiles", "rxn_smiles")
                             for h in lines[0].split(sep)):
        return True
    return any(reaction.looks_like_reaction(v) for v in values)


def writer_suffixes() -> dict[str, type]:
    return {suffix: writer for m in DOMAINS.values() for writer in m.WRITERS for suffix in writer.suffixes}


def writer_for(path: Path) -> type:
    name = path.name.lower()
    for suffix, writer in sorted(writer_suffixes().items(), key=lambda kv: -len(kv[0])):
        if name.endswith(suffix):
            return writer
    raise InputError(f"no detokenizer writes {path.suffix or path.name!r} files "
                     f"(known: {', '.join(sorted(writer_suffixes()))})")
