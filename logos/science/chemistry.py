"""RDKit molecule helpers shared by every layer above: parsing with RDKit's own reason, the one canonical
SMILES, and molecule spans of grammar text.

**Canonical SMILES** means one thing everywhere (tokenization, splits, generation's merging of equal
answers, finetuning pairs and metrics, evaluation): RDKit's canonical isomeric SMILES iterated to a
fixed point. RDKit's output is not always a fixed point of parse-and-write (some ring stereo and
aromatic systems change once more when reread), so :func:`canonical_smiles` rereads its own output
until it stops changing (at most ``FIXED_POINT_ROUNDS`` times).

RDKit's log is routed to Python logging and captured, so a failure is reported in one line with
RDKit's most specific reason ("unclosed ring", "Explicit valence ...") instead of being printed.
"""

from __future__ import annotations

import logging
import re

from rdkit import Chem, rdBase

from logos.language.grammar import split_symbols
from logos.util.records import RecordError

__all__ = ["OPEN", "CLOSE", "parse_smiles", "parse_molblock", "canonical_smiles", "canonical", "canonical_set", "span",
           "molecules_in_text", "is_smiles", "FIXED_POINT_ROUNDS"]

OPEN, CLOSE = "<MoleculeS>", "<MoleculeE>"
FIXED_POINT_ROUNDS = 3


class _Captured(logging.Handler):
    """Keeps RDKit's log lines so a failure's reason can be reported in one line."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        msg = record.getMessage()
        self.lines.append(msg.split("] ", 1)[-1] if msg.startswith("[") else msg)


_captured = _Captured()
rdBase.LogToPythonLogger()
_rdlog = logging.getLogger("rdkit")
_rdlog.handlers = [_captured]
_rdlog.propagate = False
_rdlog.setLevel(logging.WARNING)  # mol-block problems are logged as warnings


_PARSE_ERROR = re.compile(r"SMILES Parse Error: (.+?)(?: while parsing:| for input:)")
_POSITION = re.compile(r"check for mistakes around position (\d+)")


def _reason(default: str) -> str:
    lines = [l.strip() for l in _captured.lines if l.strip()]
    _captured.lines.clear()
    if not lines:
        return default
    # RDKit's first line is the most specific ("unclosed ring", "Explicit valence ..."); a parse error is told
    # with the position RDKit points at ("SMILES parse error at position 5: syntax error").
    what = _PARSE_ERROR.match(lines[0])
    if what:
        where = next((m.group(1) for m in map(_POSITION.search, lines) if m), None)
        return f"SMILES parse error{f' at position {where}' if where else ''}: {what.group(1)}"
    return lines[0]


def parse_smiles(smiles: str) -> Chem.Mol:
    """Sanitized RDKit molecule, or RecordError with RDKit's own reason."""
    if not smiles:
        raise RecordError("empty SMILES")
    _captured.lines.clear()
    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        raise RecordError(f"invalid SMILES {smiles[:80]!r}: {_reason('RDKit cannot parse it')}")
    if mol.GetNumAtoms() == 0:
        raise RecordError("SMILES has no atoms")
    return mol


def parse_molblock(block: str) -> Chem.Mol:
    _captured.lines.clear()
    mol = Chem.MolFromMolBlock(block, sanitize=True, removeHs=True)
    if mol is None:
        raise RecordError(f"invalid molecule block: {_reason('RDKit cannot read it')}")
    if mol.GetNumAtoms() == 0:
        raise RecordError("molecule has no atoms")
    return mol


def canonical_smiles(mol: Chem.Mol, kekule: bool = False) -> str:
    """The canonical isomeric SMILES of ``mol`` (a fixed point: see the module docstring); ``kekule``: written
    with explicit single and double bonds instead of aromatic atoms."""
    if kekule:
        mol = Chem.Mol(mol)
        Chem.Kekulize(mol, clearAromaticFlags=True)
        return Chem.MolToSmiles(mol, isomericSmiles=True, kekuleSmiles=True)
    smiles = Chem.MolToSmiles(mol, isomericSmiles=True)
    for _ in range(FIXED_POINT_ROUNDS):
        again = Chem.MolFromSmiles(smiles)
        if again is None:
            break
        again_smiles = Chem.MolToSmiles(again, isomericSmiles=True)
        if again_smiles == smiles:
            break
        smiles = again_smiles
    return smiles


def canonical(smiles: str | None) -> str | None:
    """:func:`canonical_smiles` of a SMILES string, or None when RDKit cannot read it (quietly)."""
    if not smiles:
        return None
    _captured.lines.clear()
    mol = Chem.MolFromSmiles(smiles)
    _captured.lines.clear()
    return canonical_smiles(mol) if mol is not None and mol.GetNumAtoms() else None


def canonical_set(smiles: str | None, drop_atom_maps: bool = True) -> str | None:
    """The sorted, ``.``-joined canonical SMILES of every molecule of a dotted SMILES (atom maps removed):
    the identity of a reactant or product set. None when empty or when any molecule is unreadable."""
    if not smiles or not smiles.strip():
        return None
    parts = []
    for piece in smiles.strip().split("."):
        _captured.lines.clear()
        mol = Chem.MolFromSmiles(piece)
        _captured.lines.clear()
        if mol is None:
            return None
        if drop_atom_maps:
            for atom in mol.GetAtoms():
                atom.SetAtomMapNum(0)
        parts.append(canonical_smiles(mol))
    return ".".join(sorted(parts))


def span(smiles: str) -> str:
    return OPEN + smiles + CLOSE


def molecules_in_text(text: str) -> list[str]:
    """The SMILES of every molecule span of a grammar text, in order."""
    pieces = split_symbols(text)
    out = []
    for i, p in enumerate(pieces):
        if p == OPEN:
            if i + 2 >= len(pieces) or pieces[i + 2] != CLOSE or pieces[i + 1] in (OPEN, CLOSE):
                raise RecordError(f"unclosed or empty {OPEN} span")
            out.append(pieces[i + 1])
    return out


def is_smiles(value: str) -> bool:
    """Whether RDKit parses ``value`` as a single SMILES (quietly; for column detection)."""
    _captured.lines.clear()
    ok = " " not in value and ">" not in value and Chem.MolFromSmiles(value) is not None
    _captured.lines.clear()
    return ok
