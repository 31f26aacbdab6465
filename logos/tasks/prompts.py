"""Prompts of each task: from the user's input files (or none) to the grammar text before the completion.

The builders are named by the tasks of :mod:`logos.tasks.registry`; each returns ``(prompt, samples)``
pairs: ``n`` samples in all for an unconditional task, ``n`` per input for a conditional one.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from logos.science.chemistry import canonical_smiles, parse_smiles, span
from logos.util.records import InputError, RecordError, plain_name

__all__ = ["Prompt", "build_prompts", "head_prompts", "reaction_prompts", "chain_prompts", "crystal_prompts",
           "search_rules", "UNCONDITIONAL"]


@dataclass
class Prompt:
    """One prompt: the input it came from, its id, the grammar text before the completion, extra grammar rules.
    Unconditional prompts (no input) have the id :data:`UNCONDITIONAL`."""

    input_id: str
    text: str
    rules: str = ""


UNCONDITIONAL = "gen"
"""The input id of unconditional samples (no input line): their order in an output is generation order."""


def _lines(path: Path) -> list[tuple[str, str]]:
    """(id, first field) of each non-empty line of a SMILES-like file; ids are the names or line numbers."""
    from logos.util.records import open_text

    out = []
    with open_text(path) as fh:
        for n, line in enumerate(fh, 1):
            fields = line.split()
            if fields and fields[0].lower() not in ("smiles", "smi", "reactants", "product"):
                out.append((fields[1] if len(fields) > 1 else f"line{n}", fields[0]))
    return out


def _canonical_set(smiles: str) -> list[str]:
    return sorted(canonical_smiles(parse_smiles(s)) for s in smiles.split(".") if s)


def reaction_prompts(task, path: Path, n: int, errors, direction: str) -> list[tuple[Prompt, int]]:
    """``forward``: reactants (the left side of a reaction SMILES, or a whole line) -> ``<React>``; ``retro``: the
    product (the right side, or the whole line) -> ``<ReverseReact>``. Molecules canonical and sorted."""
    from logos.domains.reaction import REACT, RETRO

    prompts = []
    for ident, value in _lines(path):
        side = value.split(">")[0] if direction == "forward" and ">" in value else \
            value.split(">")[-1] if ">" in value else value
        try:
            mols = _canonical_set(side)
        except RecordError as e:
            errors.add(f"{path}:{ident}", str(e))
            continue
        if not mols:
            errors.add(f"{path}:{ident}", "no molecule")
            continue
        op = REACT if direction == "forward" else RETRO
        prompts.append((Prompt(ident, "".join(span(m) for m in mols) + op), n))
    return prompts


def _chains_of(path: Path) -> list[tuple[str, list[str], str]]:
    """(id, chain sequences, marked text or '') of a FASTA, a structure file or a JSONL of grammar records."""
    from logos.domains.protein import parse_chains

    name = plain_name(path)
    if name.endswith(".jsonl"):
        from logos.util.records import read_records

        out = []
        for rec in read_records(path):
            text = rec["text"].split("<Search>")[-1]
            chains = [c.sequence for c in parse_chains(text)]
            ligand_free = re.sub(r"<MoleculeS>.*?<MoleculeE>", "", text)
            out.append((str(rec.get("id") or rec["source"]), chains, re.sub(r"<a\d+>", "", ligand_free)))
        return out
    if name.endswith((".fasta", ".fa", ".faa", ".fas")):
        from Bio import SeqIO

        from logos.util.records import open_text

        with open_text(path) as fh:
            return [(rec.id, [str(rec.seq).upper()], "") for rec in SeqIO.parse(fh, "fasta")]
    from logos.domains import structure

    st = structure.read_structure(path)
    return [(st.name, [c.sequence for c in st.chains], "")]


def search_rules(chains: list[str]) -> str:
    """Grammar of the output side of a binding-site search: exactly these chains, a pocket mark allowed anywhere."""
    lines = ["task_pocket: chains op_search " + " ".join(f"copy{c}" for c in range(len(chains)))]
    for c, seq in enumerate(chains):
        lines.append(f"copy{c}: protein_open " + " ".join(f"r{c}_{i}" for i in range(len(seq))) + " protein_close")
        for i, letter in enumerate(seq):
            lines.append(f'r{c}_{i}: "{letter}" | pocket_open "{letter}" pocket_close')
    return "\n".join(lines)


@functools.lru_cache(maxsize=64)
def _crystal_rules(space_group: int | None, composition: str | None) -> str:
    from logos.decoding.crystal_rules import crystal_task_rules

    rules = crystal_task_rules([space_group] if space_group else None, 4, composition)
    if composition is not None:  # sites may only name the composition's elements
        elements = sorted(set(re.findall(r"[A-Z][a-z]?", composition)), key=len, reverse=True)
        rules = re.sub(r"(?m)^XTAL_EL: .*$", f"XTAL_EL: / ({'|'.join(elements)})/", rules)
    return rules


def _formula(text: str) -> dict[str, float]:
    """Element counts of a formula as users write it (``TiO2``, ``Na4Cl4``, ``Fe1.5O2``); implicit counts are 1."""
    parts = re.findall(r"([A-Z][a-z]?)(\d+(?:\.\d+)?)?", text)
    if not parts or "".join(e + c for e, c in parts) != text:
        raise RecordError(f"not a chemical formula: {text[:40]!r}")
    counts: dict[str, float] = {}
    for element, count in parts:
        counts[element] = counts.get(element, 0.0) + float(count or 1)
    return counts


def crystal_prompts(task, inputs: Path | None, n: int, errors) -> list[tuple[Prompt, int]]:
    """Unconditional crystals, or one prompt per input line ``FORMULA [SPACE_GROUP] [ID]`` (the conventional
    cell's formula, e.g. ``Na4Cl4 225``, written canonically as ``Cl4Na4``): crystal structure prediction.
    ``-`` in place of the space group leaves it to the model and lets a numeric ID follow (``Cl4Na4 - 3961``)."""
    from logos.science.materials.parse import composition_text
    from logos.util.records import open_text

    if inputs is None:
        return [(Prompt(UNCONDITIONAL, "<CrystalS>", _crystal_rules(None, None)), n)]
    out = []
    with open_text(inputs) as fh:
        for line_no, line in enumerate(fh, 1):
            fields = line.split()
            if not fields or fields[0].lower() in ("formula", "composition"):
                continue
            sg = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
            rest = fields[2:] if sg is not None or fields[1:2] == ["-"] else fields[1:]
            ident = rest[0] if rest else f"line{line_no}"
            try:
                comp = composition_text(_formula(fields[0]))
                if sg is not None and not 1 <= sg <= 230:
                    raise RecordError(f"space group {sg} outside 1-230")
            except (RecordError, ValueError) as e:
                errors.add(f"{inputs}:{ident}", str(e))
                continue
            text = f"<CrystalS>{comp}" + (f"<sg{sg}>" if sg else "")
            out.append((Prompt(ident, text, _crystal_rules(sg, comp)), n))
    return out


def head_prompts(task, inputs: Path | None, n: int, errors, head: str) -> list[tuple[Prompt, int]]:
    """The task's opening tags, or one prompt per input line appended to them (e.g. MOF metal nodes)."""
    if inputs is None:
        return [(Prompt(UNCONDITIONAL, head), n)]
    return [(Prompt(ident, head + value), n) for ident, value in _lines(inputs)]


def chain_prompts(task, inputs: Path, n: int, errors, form: str) -> list[tuple[Prompt, int]]:
    """``search`` (binding-site search): the chains then ``<Search>``, the answer must copy them (the per-request
    grammar); ``marked`` (ligand design): the chains with their pocket marks."""
    out = []
    for ident, chains, marked in _chains_of(inputs):
        if not chains:
            errors.add(f"{inputs}:{ident}", "no protein chain")
            continue
        if form == "search":
            text = "".join(f"<ProteinS>{s}<ProteinE>" for s in chains) + "<Search>"
            out.append((Prompt(ident, text, search_rules(chains)), n))
        elif not marked or "<PocketS>" not in marked:
            errors.add(f"{inputs}:{ident}", "ligand design needs pocket marks (a marked sequence, e.g. a record of "
                                            "`logos tokenize` or the output of --task pocket)")
        else:
            out.append((Prompt(ident, marked), n))
    return out


def build_prompts(task, inputs: Path | None, n: int, errors) -> list[tuple[Prompt, int]]:
    """(prompt, samples) pairs of ``task`` (a :class:`logos.tasks.registry.Task`): ``n`` in all for unconditional
    tasks, ``n`` per input for conditional ones."""
    if task.conditional and inputs is None:
        raise InputError(f"--task {task.name} needs --input")
    return task.prompts(task, inputs, n, errors)
