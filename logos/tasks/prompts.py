"""Prompts of each task: from the user's input files (or none) to the grammar text before the completion.

The builders are named by the tasks of :mod:`logos.tasks.registry`; each returns ``(prompt, samples)``
pairs: ``n`` samples in all for an unconditional task, ``n`` per input for a conditional one.

An input is read in two steps. The records are read as text and bounded before any library sees
them (:class:`logos.data.limits.InputLimits`: the file's size, each record's characters, a SMILES's
atoms, a sequence's residues, the number of records); then each record that passed becomes a
prompt where a parsing library is needed (RDKit canonicalizes reactants and products, gemmi reads
a structure) in an isolated worker process with a time limit (:func:`logos.util.isolate.imap_isolated`),
so a library that crashes or stalls on a record costs that record, not the run. A refused record
is reported as ``FILE:N: reason`` (``N``: the line of a line file, the record of a FASTA or JSONL
file) and the others go on.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from logos.data.limits import InputLimits, too_big, too_long, too_many_atoms, too_many_residues
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
    record: int = 0
    """The input record it was built from (1-based: the line of a line file, the record of a FASTA or JSONL file);
    0 for an unconditional prompt."""


UNCONDITIONAL = "gen"
"""The input id of unconditional samples (no input line): their order in an output is generation order."""

_HEADERS = ("smiles", "smi", "reactants", "product", "formula", "composition")


@dataclass(frozen=True)
class _Record:
    number: int
    ident: str
    value: object
    refused: str | None = None  # why the record is not read further (a bound, a malformed line)


# ---------------------------------------------------------------------------------------------- reading, bounded
def _open_input(path: Path, limits: InputLimits):
    from logos.util.records import open_text

    reason = too_big(path, limits)
    if reason:
        raise InputError(f"{path}: {reason}")
    return open_text(path)


def _counted(records: Iterator[_Record], path: Path, limits: InputLimits, errors) -> Iterator[_Record]:
    """The records not refused; the refused ones reported. At most ``--max-records`` records are read (refused
    ones count too): the first one beyond is reported and the rest are not read."""
    for k, rec in enumerate(records, 1):
        if limits.max_records and k > limits.max_records:
            errors.add(f"{path}:{rec.number}", f"more than --max-records {limits.max_records:,} records in one "
                                               "input (this record and the rest not read)")
            return
        if rec.refused:
            errors.add(f"{path}:{rec.number}", rec.refused)
        else:
            yield rec


def _lines(path: Path, limits: InputLimits, errors, check: Callable[[str], str | None] | None = None
           ) -> Iterator[_Record]:
    """The records of a line file: (line number, the name in the second field or ``lineN``, the first field);
    headers and empty lines skipped, each line bounded (``check``: a further bound on the first field)."""
    def read() -> Iterator[_Record]:
        with _open_input(path, limits) as fh:
            for n, line in enumerate(fh, 1):
                reason = too_long(line.rstrip("\n"), limits)
                if reason:
                    yield _Record(n, f"line{n}", None, reason)
                    continue
                fields = line.split()
                if not fields or fields[0].lower() in _HEADERS:
                    continue
                reason = check(fields[0]) if check is not None else None
                yield _Record(n, fields[1] if len(fields) > 1 else f"line{n}", fields, reason)
    return _counted(read(), path, limits, errors)


def _made(records: Iterator[_Record], make: Callable, path: Path, errors, limits: InputLimits, workers: int,
          on_record: Callable[[int], None] | None = None) -> Iterator[tuple[_Record, object]]:
    """(record, ``make(record)``) of every record ``make`` accepts, the library work isolated: ``workers``
    processes with the ``--timeout`` of :class:`InputLimits` per record (0: here, ``on_record(number)`` called
    before each; the caller isolates). A refusal, a crash or a stall is reported for its record only."""
    from logos.util.isolate import Failure, imap_isolated

    if workers <= 0:
        for rec in records:
            if on_record is not None:
                on_record(rec.number)
            out = _guarded(make, rec)
            if isinstance(out, Failure):
                errors.add(f"{path}:{rec.number}", out.reason)
            else:
                yield rec, out
        return
    results = imap_isolated(records, functools.partial(_guarded, make), workers=workers, timeout=limits.timeout,
                            batch=64)
    try:
        for rec, out in results:
            if isinstance(out, Failure):
                errors.add(f"{path}:{rec.number}", out.reason)
            else:
                yield rec, out
    finally:
        results.close()


def _guarded(make: Callable, rec: _Record):
    """``make(rec)``, or a :class:`Failure` with the reason it refused the record (a worker must not die of it)."""
    from logos.util.isolate import Failure

    try:
        return make(rec)
    except (RecordError, ValueError) as e:
        return Failure(str(e))
    except Exception as e:  # a bug must not lose the other records
        return Failure(f"internal error ({type(e).__name__}): {e}")


# ---------------------------------------------------------------------------------------------- the builders
def _canonical_set(smiles: str) -> list[str]:
    from logos.science.chemistry import canonical_smiles, parse_smiles

    return sorted(canonical_smiles(parse_smiles(s)) for s in smiles.split(".") if s)


def _reaction_prompt(direction: str, rec: _Record) -> str:
    from logos.domains.reaction import REACT, RETRO
    from logos.science.chemistry import span

    value = rec.value[0]
    side = value.split(">")[0] if direction == "forward" and ">" in value else \
        value.split(">")[-1] if ">" in value else value
    mols = _canonical_set(side)
    if not mols:
        raise RecordError("no molecule")
    return "".join(span(m) for m in mols) + (REACT if direction == "forward" else RETRO)


def reaction_prompts(task, path: Path, n: int, errors, direction: str, limits: InputLimits | None = None,
                     workers: int = 1, on_record=None) -> list[tuple[Prompt, int]]:
    """``forward``: reactants (the left side of a reaction SMILES, or a whole line) -> ``<React>``; ``retro``: the
    product (the right side, or the whole line) -> ``<ReverseReact>``. Molecules canonical and sorted."""
    limits = limits or InputLimits()
    records = _lines(path, limits, errors, lambda value: too_many_atoms(value, limits))
    return [(Prompt(rec.ident, text, record=rec.number), n) for rec, text in
            _made(records, functools.partial(_reaction_prompt, direction), path, errors, limits, workers, on_record)]


def _chain_records(path: Path, limits: InputLimits, errors) -> Iterator[_Record]:
    """The records of a FASTA, a structure file or a JSONL of grammar records, bounded; values are
    ``("fasta", sequence)``, ``("jsonl", text)`` or ``("structure", path)``."""
    name = plain_name(path)
    if name.endswith(".jsonl"):
        def jsonl() -> Iterator[_Record]:
            with _open_input(path, limits) as fh:
                for n, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    reason = too_long(line.rstrip("\n"), limits)
                    if reason:
                        yield _Record(n, f"line{n}", None, reason)
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        yield _Record(n, f"line{n}", None, f"not JSON: {e.msg}")
                        continue
                    if isinstance(rec, dict) and rec.get("text") is None and isinstance(rec.get("prompt"), str):
                        rec["text"] = rec["prompt"] + str(rec.get("completion") or "")
                    if not isinstance(rec, dict) or not isinstance(rec.get("text"), str):
                        yield _Record(n, f"line{n}", None, "not a record: needs a string field 'text'")
                        continue
                    yield _Record(n, str(rec.get("id") or f"line{n}"), ("jsonl", rec["text"]))
        return _counted(jsonl(), path, limits, errors)
    if name.endswith((".fasta", ".fa", ".faa", ".fas")):
        def fasta() -> Iterator[_Record]:
            from Bio import SeqIO

            with _open_input(path, limits) as fh:
                n = 0
                try:
                    for n, rec in enumerate(SeqIO.parse(fh, "fasta"), 1):
                        seq = str(rec.seq)
                        reason = too_long(seq, limits) or too_many_residues(len(seq), limits)
                        yield _Record(n, rec.id or f"record{n}", ("fasta", seq), reason)
                except ValueError as e:  # Biopython: text before the first '>' header, ...
                    yield _Record(n + 1, f"record{n + 1}", None, f"not FASTA: {str(e).split('. ')[0]}")
        return _counted(fasta(), path, limits, errors)
    reason = too_big(path, limits)
    if reason:
        raise InputError(f"{path}: {reason}")
    return iter([_Record(1, path.name, ("structure", str(path)))])


def _chains_prompt(form: str, limits: InputLimits, rec: _Record) -> tuple[str, str]:
    """(prompt text, per-request rules) of one chain record (see :func:`chain_prompts`)."""
    from logos.domains.protein import clean_sequence, parse_chains

    kind, value = rec.value
    marked = ""
    if kind == "jsonl":
        text = value.split("<Search>")[-1]
        chains = [c.sequence for c in parse_chains(text)]
        ligand_free = re.sub(r"<MoleculeS>.*?<MoleculeE>", "", text)
        marked = re.sub(r"<a\d+>", "", ligand_free)
    elif kind == "fasta":
        chains = [clean_sequence(value)]
    else:
        from logos.domains import structure

        chains = [c.sequence for c in structure.read_structure(Path(value)).chains]
    if not chains:
        raise RecordError("no protein chain")
    reason = too_many_residues(sum(len(c) for c in chains), limits)
    if reason:
        raise RecordError(reason)
    bad = sorted({x for c in chains for x in c if not "A" <= x <= "Z"})
    if bad:
        raise RecordError(f"sequence has characters that are not residue letters: {''.join(bad)[:20]!r}")
    if form == "search":
        return "".join(f"<ProteinS>{s}<ProteinE>" for s in chains) + "<Search>", search_rules(chains)
    if not marked or "<PocketS>" not in marked:
        raise RecordError("ligand design needs pocket marks (a marked sequence, e.g. a record of `logos tokenize` "
                          "or the output of --task pocket)")
    return marked, ""


def search_rules(chains: list[str]) -> str:
    """Grammar of the output side of a binding-site search: exactly these chains, a pocket mark allowed anywhere."""
    lines = ["task_pocket: chains op_search " + " ".join(f"copy{c}" for c in range(len(chains)))]
    for c, seq in enumerate(chains):
        lines.append(f"copy{c}: protein_open " + " ".join(f"r{c}_{i}" for i in range(len(seq))) + " protein_close")
        for i, letter in enumerate(seq):
            lines.append(f'r{c}_{i}: "{letter}" | pocket_open "{letter}" pocket_close')
    return "\n".join(lines)


def chain_prompts(task, inputs: Path, n: int, errors, form: str, limits: InputLimits | None = None,
                  workers: int = 1, on_record=None) -> list[tuple[Prompt, int]]:
    """``search`` (binding-site search): the chains then ``<Search>``, the answer must copy them (the per-request
    grammar); ``marked`` (ligand design): the chains with their pocket marks. Inputs: a FASTA, a PDB/mmCIF
    structure, or a JSONL of grammar records (marked sequences)."""
    limits = limits or InputLimits()
    records = _chain_records(Path(inputs), limits, errors)
    made = _made(records, functools.partial(_chains_prompt, form, limits), inputs, errors, limits, workers, on_record)
    return [(Prompt(rec.ident, text, rules, record=rec.number), n) for rec, (text, rules) in made]


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
    from logos.science.elements import ATOMIC_NUMBER

    parts = re.findall(r"([A-Z][a-z]?)(\d+(?:\.\d+)?)?", text)
    if not parts or "".join(e + c for e, c in parts) != text:
        raise RecordError(f"not a chemical formula: {text[:40]!r}")
    counts: dict[str, float] = {}
    for element, count in parts:
        if element not in ATOMIC_NUMBER:
            raise RecordError(f"formula {text[:40]!r}: {element} is not an element")
        counts[element] = counts.get(element, 0.0) + float(count or 1)
    return counts


def _crystal_fields(limits: InputLimits, fields: list[str]) -> str | None:
    """Why a composition line is refused before it is read further (space group, atoms), or None."""
    if len(fields) > 1 and fields[1].isdigit() and not 1 <= int(fields[1]) <= 230:
        return f"space group {int(fields[1])}: not in 1-230"
    if limits.max_atoms:
        atoms = sum(float(c or 1) for _, c in re.findall(r"([A-Z][a-z]?)(\d+(?:\.\d+)?)?", fields[0]))
        if atoms > limits.max_atoms:
            return f"{atoms:,g} atoms in the formula, more than --max-atoms {limits.max_atoms:,} (not read)"
    return None


def _crystal_prompt(rec: _Record) -> tuple[str, str, str]:
    from logos.science.materials.parse import composition_text

    fields = rec.value
    sg = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    comp = composition_text(_formula(fields[0]))
    text = f"<CrystalS>{comp}" + (f"<sg{sg}>" if sg else "")
    return text, _crystal_rules(sg, comp), rec.ident


def crystal_prompts(task, inputs: Path | None, n: int, errors, limits: InputLimits | None = None, workers: int = 1,
                    on_record=None) -> list[tuple[Prompt, int]]:
    """Unconditional crystals, or one prompt per input line ``FORMULA [SPACE_GROUP] [ID]`` (the conventional
    cell's formula, e.g. ``Na4Cl4 225``, written canonically as ``Cl4Na4``): crystal structure prediction.
    ``-`` in place of the space group leaves it to the model and lets a numeric ID follow (``Cl4Na4 - 3961``)."""
    if inputs is None:
        return [(Prompt(UNCONDITIONAL, "<CrystalS>", _crystal_rules(None, None)), n)]
    limits = limits or InputLimits()

    def with_ids() -> Iterator[_Record]:
        for rec in _lines(Path(inputs), limits, errors):
            fields = rec.value
            reason = _crystal_fields(limits, fields)
            if reason:
                errors.add(f"{inputs}:{rec.number}", reason)
                continue
            sg = fields[1].isdigit() if len(fields) > 1 else False
            rest = fields[2:] if sg or fields[1:2] == ["-"] else fields[1:]
            yield _Record(rec.number, rest[0] if rest else f"line{rec.number}", fields)

    made = _made(with_ids(), _crystal_prompt, inputs, errors, limits, workers, on_record)
    return [(Prompt(ident, text, rules, record=rec.number), n) for rec, (text, rules, ident) in made]


def _head_check(head: str, limits: InputLimits) -> Callable[[str], str | None]:
    """The bound of a head input: a SMILES's atoms, a sequence's residues; grammar symbols are the task's to write."""
    def check(value: str) -> str | None:
        if "<" in value or ">" in value:
            return "an input holds no grammar symbols (< or >): the task writes them"
        if head.endswith("<MoleculeS>"):
            return too_many_atoms(value, limits)
        if head in ("<ProteinS>", "<AntibodyS>"):
            return too_many_residues(len(value), limits)
        return None
    return check


def head_prompts(task, inputs: Path | None, n: int, errors, head: str, limits: InputLimits | None = None,
                 workers: int = 1, on_record=None) -> list[tuple[Prompt, int]]:
    """The task's opening tags, or one prompt per input line appended to them (e.g. MOF metal nodes)."""
    if inputs is None:
        return [(Prompt(UNCONDITIONAL, head), n)]
    limits = limits or InputLimits()
    return [(Prompt(rec.ident, head + rec.value[0], record=rec.number), n)
            for rec in _lines(Path(inputs), limits, errors, _head_check(head, limits))]


def build_prompts(task, inputs: Path | None, n: int, errors, limits: InputLimits | None = None, workers: int = 1,
                  on_record: Callable[[int], None] | None = None) -> list[tuple[Prompt, int]]:
    """(prompt, samples) pairs of ``task`` (a :class:`logos.tasks.registry.Task`): ``n`` in all for unconditional
    tasks, ``n`` per input for conditional ones. ``limits`` bound the input's records before a library reads them;
    the library work runs in ``workers`` isolated processes (0: in this one, ``on_record(number)`` called before
    each record: the caller isolates it)."""
    if task.conditional and inputs is None:
        raise InputError(f"--task {task.name} needs --input")
    return task.prompts(task, inputs, n, errors, limits=limits or InputLimits(), workers=workers, on_record=on_record)
