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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

from logos.data.limits import InputLimits, too_big, too_long, too_many_atoms, too_many_residues
from logos.util.records import InputError, RecordError, plain_name

__all__ = ["Prompt", "PromptOptions", "build_prompts", "head_prompts", "reaction_prompts", "chain_prompts",
           "crystal_prompts", "choose_alternatives", "crystal_rules_for", "search_rules", "UNCONDITIONAL", "MAX_CELL_ATOMS"]

MAX_CELL_ATOMS = 48
"""The largest cell (atoms) the model may choose for a formula whose number of formula units is left open."""


@dataclass
class Prompt:
    """One prompt: the input it came from, its id, the grammar text before the completion, extra grammar rules.
    Unconditional prompts (no input) have the id :data:`UNCONDITIONAL`.

    Where the input leaves part of the text to the model (a crystal formula: the number of formula units, so the
    cell's composition header), ``choices`` says what it may write there, for the task's row constraint (the
    grammar in ``rules`` offers the same): ``'Cl4Na4|Cl24Na24'``. Where the rest of the line (a space group) bears on
    that choice, ``alternatives`` also hold one complete prompt per choice, so that an engine can let the model
    choose before sampling, knowing the rest (:func:`choose_alternatives`): such a prompt's ``logprob`` is the
    model's log-probability of what it chose, which counts in its samples' likelihood."""

    input_id: str
    text: str
    rules: str = ""
    choices: str = ""
    alternatives: tuple["Prompt", ...] = ()
    logprob: float = 0.0
    record: int = 0
    """The input record it was built from (1-based: the line of a line file, the record of a FASTA or JSONL file);
    0 for an unconditional prompt."""


@dataclass(frozen=True)
class PromptOptions:
    """How input lines are read (crystals: whether a formula is the whole cell, the largest cell the model may
    choose)."""

    cell_composition: bool = False
    """Each crystal formula is the cell's whole composition (``Na4Cl4``), as in the CDVAE benchmarks: one formula
    unit per cell unless the line says ``Z=N``. Otherwise a formula is one formula unit and the model chooses the
    cell (``Z`` units) among those the space group can hold."""
    max_cell_atoms: int = MAX_CELL_ATOMS
    """The largest cell (atoms) the model may choose for a formula (``Z=N`` on a line is not capped)."""


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
                     workers: int = 1, on_record=None,
                 options: PromptOptions | None = None) -> list[tuple[Prompt, int]]:
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
                  workers: int = 1, on_record=None,
                 options: PromptOptions | None = None) -> list[tuple[Prompt, int]]:
    """``search`` (binding-site search): the chains then ``<Search>``, the answer must copy them (the per-request
    grammar); ``marked`` (ligand design): the chains with their pocket marks. Inputs: a FASTA, a PDB/mmCIF
    structure, or a JSONL of grammar records (marked sequences)."""
    limits = limits or InputLimits()
    records = _chain_records(Path(inputs), limits, errors)
    made = _made(records, functools.partial(_chains_prompt, form, limits), inputs, errors, limits, workers, on_record)
    return [(Prompt(rec.ident, text, rules, record=rec.number), n) for rec, (text, rules) in made]


@functools.lru_cache(maxsize=64)
def crystal_rules_for(space_group: int | None, composition: str | None, headers: tuple[str, ...] = ()) -> str:
    from logos.decoding.crystal_rules import crystal_task_rules

    rules = crystal_task_rules([space_group] if space_group else None, 4, composition, headers=headers)
    if composition is not None or headers:  # sites may only name the composition's elements
        elements = sorted(set(re.findall(r"[A-Z][a-z]?", composition or headers[0])), key=lambda e: (-len(e), e))
        rules = re.sub(r"(?m)^XTAL_EL: .*$", f"XTAL_EL: / ({'|'.join(elements)})/", rules)
    return rules


_FORMULA_PART = re.compile(r"([A-Z][a-z]?|\(|\[|\)|\])(\d+(?:\.\d+)?)?")


def _formula(text: str) -> dict[str, float]:
    """Element counts of a formula as users write it (``TiO2``, ``Na4Cl4``, ``Fe1.5O2``, ``Ca(OH)2``,
    ``Mg3(PO4)2``); implicit counts are 1, elements must be real."""
    from logos.science.elements import ATOMIC_NUMBER

    parts = _FORMULA_PART.findall(text)
    if not parts or "".join(e + c for e, c in parts) != text:
        raise RecordError(f"not a chemical formula: {text[:40]!r}")
    stack: list[dict[str, float]] = [{}]
    for part, count in parts:
        if part in "([":
            if count:
                raise RecordError(f"not a chemical formula: {text[:40]!r}")
            stack.append({})
            continue
        n = float(count or 1)
        if part in ")]":
            if len(stack) == 1:
                raise RecordError(f"unbalanced brackets in {text[:40]!r}")
            group = stack.pop()
            for element, k in group.items():
                stack[-1][element] = stack[-1].get(element, 0.0) + k * n
            continue
        if part not in ATOMIC_NUMBER:
            raise RecordError(f"formula {text[:40]!r}: {part} is not an element")
        stack[-1][part] = stack[-1].get(part, 0.0) + n
    if len(stack) != 1:
        raise RecordError(f"unbalanced brackets in {text[:40]!r}")
    if not stack[0] or any(v <= 0 for v in stack[0].values()):
        raise RecordError(f"not a chemical formula: {text[:40]!r}")
    return stack[0]


def _group_name(sg: int) -> str:
    import gemmi

    return f"group {sg} ({gemmi.find_spacegroup_by_number(sg).hm.replace(' ', '')})"


def _line_prompt(ident: str, formula_text: str, sg: int | None, units: int | None, options: PromptOptions
                    ) -> Prompt:
    """The prompt of one input line; RecordError, naming the line's formula and group, for a line no cell can
    answer: a group outside 1-230, or no cell of the formula that the group's Wyckoff positions can hold (with the
    fewest formula units that would fit)."""
    from logos.decoding.composition import cell_counts, formula_units, placement_problem, smallest_formula_units
    from logos.science.materials.parse import composition_text

    def fixed(comp: str) -> Prompt:
        return Prompt(ident, f"<CrystalS>{comp}" + (f"<sg{sg}>" if sg else ""), crystal_rules_for(sg, comp))

    formula = _formula(formula_text)
    if sg is not None and not 1 <= sg <= 230:
        raise RecordError(f"{formula_text} {sg}: space group {sg} outside 1-230")
    cell = options.cell_composition and units is None
    if cell:
        units = 1
    if units is not None:  # the cell is fixed: Z units (the formula itself when it is the cell's composition)
        comp = composition_text({el: n * units for el, n in formula.items()})
        whole = cell_counts(formula, units)  # (a cell with fractional counts has partially occupied sites)
        problem = placement_problem(whole, sg) if sg is not None and whole is not None else None
        if problem:
            given = f"the cell composition {formula_text}" if cell else f"{formula_text} Z={units} ({comp})"
            raise RecordError(f"{given} in {_group_name(sg)}: {problem}; "
                              + _smallest(formula_text, formula, smallest_formula_units(formula, sg), cell))
        return fixed(comp)
    zs = formula_units(formula, sg, options.max_cell_atoms)
    if not zs:
        fit = smallest_formula_units(formula, sg)
        if fit is None:
            raise RecordError(f"{formula_text}: no number of formula units up to 1000 gives whole atom counts")
        where = f"on the Wyckoff positions of {_group_name(sg)}" if sg is not None else "in any group"
        raise RecordError(f"{formula_text}: no cell of up to {options.max_cell_atoms} atoms fits {where}; "
                          + _smallest(formula_text, formula, fit, False) + " (or raise --max-cell-atoms)")
    headers = tuple(composition_text(cell_counts(formula, z)) for z in zs)
    if len(headers) == 1:  # one cell fits: the prompt, as if the line said Z=N
        return fixed(headers[0])
    return Prompt(ident, "<CrystalS>", crystal_rules_for(sg, None, headers), "|".join(headers),
                  tuple(fixed(h) for h in headers) if sg is not None else ())


def _smallest(formula_text: str, formula: dict[str, float], units: int, cell: bool) -> str:
    """How to ask for the fewest formula units that fit (``units``)."""
    from logos.decoding.composition import cell_counts
    from logos.science.materials.parse import composition_text

    counts = cell_counts(formula, units)
    comp, atoms = composition_text(counts), sum(counts.values())
    if cell:
        return f"the smallest multiple that can is {units} x {formula_text} = {comp} ({atoms} atoms)"
    return f"the smallest cell that can is Z={units} ({comp}, {atoms} atoms): add Z={units} to the line"


_Z = re.compile(r"Z=(\S*)")

def _crystal_fields(limits: InputLimits, fields: list[str]) -> str | None:
    """Why a composition line is refused before it is read further (space group, atoms), or None."""
    if len(fields) > 1 and fields[1].isdigit() and not 1 <= int(fields[1]) <= 230:
        return f"space group {int(fields[1])}: not in 1-230"
    if limits.max_atoms:
        atoms = sum(float(c or 1) for _, c in re.findall(r"([A-Z][a-z]?)(\d+(?:\.\d+)?)?", fields[0]))
        if atoms > limits.max_atoms:
            return f"{atoms:,g} atoms in the formula, more than --max-atoms {limits.max_atoms:,} (not read)"
    return None


def _crystal_prompt(options: PromptOptions, rec: _Record) -> Prompt:
    fields, units = rec.value
    sg = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return _line_prompt(rec.ident, fields[0], sg, units, options)

def crystal_prompts(task, inputs: Path | None, n: int, errors, limits: InputLimits | None = None, workers: int = 1,
                    on_record=None, options: PromptOptions | None = None) -> list[tuple[Prompt, int]]:
    """Unconditional crystals, or one prompt per input line ``FORMULA [SPACE_GROUP] [Z=N] [ID]``: crystal
    structure prediction. ``-`` in place of the space group leaves it to the model and lets a numeric ID follow
    (``NaCl - 3961``). The formula is one formula unit (``LiFePO4``, ``Fe2O3``, ``Ca(OH)2``): the model writes the
    cell's composition, ``Z`` units, choosing among the cells of at most ``options.max_cell_atoms`` atoms that the
    group's Wyckoff positions can hold (``Fe2O3 167``: Fe12O18 only; ``NaCl 225``: Cl4Na4 or Cl24Na24);
    ``Z=4`` on the line fixes the cell. With ``options.cell_composition`` the formula is the cell's composition
    (``Na4Cl4 225``, written canonically as ``Cl4Na4``), as the CDVAE benchmarks give it. A line no cell can answer
    is refused here, before any sampling, with the fewest formula units that would fit."""
    if inputs is None:
        return [(Prompt(UNCONDITIONAL, "<CrystalS>", crystal_rules_for(None, None)), n)]
    limits = limits or InputLimits()
    options = options or PromptOptions()

    def with_ids() -> Iterator[_Record]:
        for rec in _lines(Path(inputs), limits, errors):
            zs = [f for f in rec.value[1:] if _Z.fullmatch(f)]
            fields = [rec.value[0]] + [f for f in rec.value[1:] if not _Z.fullmatch(f)]
            reason = _crystal_fields(limits, fields)
            units = None
            if not reason and zs:
                value = _Z.fullmatch(zs[-1]).group(1)
                if len(zs) > 1 or not value.isdigit() or int(value) < 1:
                    reason = f"{' '.join(zs)}: Z is one whole number of formula units, 1 or more"
                else:
                    units = int(value)
            if reason:
                errors.add(f"{inputs}:{rec.number}", reason)
                continue
            sg = fields[1].isdigit() if len(fields) > 1 else False
            rest = fields[2:] if sg or fields[1:2] == ["-"] else fields[1:]
            yield _Record(rec.number, rest[0] if rest else f"line{rec.number}", (fields, units))

    made = _made(with_ids(), functools.partial(_crystal_prompt, options), inputs, errors, limits, workers, on_record)
    return [(replace(prompt, record=rec.number), n) for rec, prompt in made]


def choose_alternatives(prompts: list[tuple[Prompt, int]], score, seed: int) -> list[tuple[Prompt, int]]:
    """Let the model choose, before sampling, among each prompt's ``alternatives`` (a crystal line with a space group
    and several cells that fit): each of the prompt's samples takes alternative ``i`` with probability proportional
    to the model's probability of its text after the prompt's (``score``: ``[(prefix, continuation)] -> [summed
    log-probability of the continuation]``, the document start before the prefix), i.e. the model's distribution
    over the cells given the group; ``seed`` makes the draws repeatable. Prompts without alternatives are kept as
    they are, and no draw is made for them."""
    import math
    import random

    rng = random.Random(seed)
    out = []
    for prompt, k in prompts:
        if not prompt.alternatives:
            out.append((prompt, k))
            continue
        scores = score([(prompt.text, alt.text[len(prompt.text):]) for alt in prompt.alternatives])
        top = max(scores)
        weights = [math.exp(x - top) for x in scores]
        drawn = rng.choices(range(len(weights)), weights=weights, k=k)
        for i, (alt, lp) in enumerate(zip(prompt.alternatives, scores)):
            if drawn.count(i):
                out.append((replace(alt, logprob=lp), drawn.count(i)))
    return out

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
                 workers: int = 1, on_record=None,
                 options: PromptOptions | None = None) -> list[tuple[Prompt, int]]:
    """The task's opening tags, or one prompt per input line appended to them (e.g. MOF metal nodes)."""
    if inputs is None:
        return [(Prompt(UNCONDITIONAL, head), n)]
    limits = limits or InputLimits()
    return [(Prompt(rec.ident, head + rec.value[0], record=rec.number), n)
            for rec in _lines(Path(inputs), limits, errors, _head_check(head, limits))]


def build_prompts(task, inputs: Path | None, n: int, errors, options: PromptOptions | None = None,
                  limits: InputLimits | None = None, workers: int = 1,
                  on_record: Callable[[int], None] | None = None) -> list[tuple[Prompt, int]]:
    """(prompt, samples) pairs of ``task`` (a :class:`logos.tasks.registry.Task`): ``n`` in all for unconditional
    tasks, ``n`` per input for conditional ones. ``options`` say how input lines are read (crystal formulas);
    ``limits`` bound the input's records before a library reads them; the library work runs in ``workers``
    isolated processes (0: in this one, ``on_record(number)`` called before each record: the caller isolates it)."""
    if task.conditional and inputs is None:
        raise InputError(f"--task {task.name} needs --input")
    return task.prompts(task, inputs, n, errors, limits=limits or InputLimits(), workers=workers, on_record=on_record,
                        options=options)
