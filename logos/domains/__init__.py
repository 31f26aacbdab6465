"""Domain registry: which encoder reads a file, which detokenizer writes an output suffix.

Every domain is a :class:`~logos.domains.base.Domain` (see :mod:`logos.domains.base` for the
interface), so the CLI, the tokenize pipeline and the corpus builder know nothing domain-specific.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from logos.domains import crystal, mof, molecule, pocket, protein, reaction
from logos.domains.base import Domain, DomainOptions, Writer, options_from_values
from logos.util.records import InputError, open_text, plain_name

__all__ = ["DOMAINS", "Domain", "detect", "writer_for", "writer_suffixes", "default_options", "encoder_options"]

# Order matters for detection: the first domain that claims a file wins.
# Structures (PDB, mmCIF with an ``_atom_site.`` table) go to ``pocket``, FASTA to ``protein``.
# Small-molecule crystal ``.cif`` files (fractional sites + cell) go to ``crystal``; MOFs are chosen
# with --domain mof.
DOMAINS: dict[str, Domain] = {d.name: d for d in (reaction.ReactionDomain(), molecule.MoleculeDomain(),
                                                  protein.ProteinDomain(), pocket.PocketDomain(),
                                                  crystal.CrystalDomain(), mof.MofDomain())}


def encoder_options(values: Mapping[str, Any] | None = None, strict: bool = True) -> dict[str, DomainOptions]:
    """Every domain's typed options from flat values keyed by option name (``strict``: unknown names are errors)."""
    return options_from_values(DOMAINS.values(), dict(values or {}), strict=strict)


def default_options() -> dict[str, DomainOptions]:
    return encoder_options({})


def detect(path: Path) -> Domain:
    """The domain of an input file, from its name and, for SMILES-like text, its first lines."""
    for domain in DOMAINS.values():
        if domain.claims(path):
            if domain.name == molecule.NAME and _holds_reactions(path):
                return DOMAINS[reaction.NAME]
            return domain
    raise InputError(f"cannot tell the domain of {path.name!r} from its name; pass --domain")


def _holds_reactions(path: Path) -> bool:
    """True when a .smi/.txt/.csv file's first data values are reaction SMILES."""
    name = plain_name(path)
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


def writer_suffixes() -> dict[str, type[Writer]]:
    return {suffix: writer for d in DOMAINS.values() for writer in d.writers for suffix in writer.suffixes}


def writer_for(path: Path) -> type[Writer]:
    name = path.name.lower()
    for suffix, writer in sorted(writer_suffixes().items(), key=lambda kv: -len(kv[0])):
        if name.endswith(suffix):
            return writer
    raise InputError(f"no detokenizer writes {path.suffix or path.name!r} files "
                     f"(known: {', '.join(sorted(writer_suffixes()))})")
