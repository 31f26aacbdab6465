"""Prompts of each task: from the user's input files (or none) to the grammar text before the completion.

The builders are named by the tasks of :mod:`logos.tasks.registry`; each returns ``(prompt, samples)``
pairs: ``n`` samples in all for an unconditional task, ``n`` per input for a conditional one.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from pathlib import Path

from logos.util.records import InputError, RecordError, plain_name

__all__ = ["Prompt", "PromptOptions", "build_prompts", "head_prompts", "reaction_prompts", "chain_prompts",
           "crystal_prompts", "choose_alternatives", "search_rules", "UNCONDITIONAL", "MAX_CELL_ATOMS"]

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
    from logos.science.chemistry import canonical_smiles, parse_smiles

    return sorted(canonical_smiles(parse_smiles(s)) for s in smiles.split(".") if s)


def reaction_prompts(task, path: Path, n: int, errors, direction: str, *, options=None) -> list[tuple[Prompt, int]]:
    """``forward``: reactants (the left side of a reaction SMILES, or a whole line) -> ``<React>``; ``retro``: the
    product (the right side, or the whole line) -> ``<ReverseReact>``. Molecules canonical and sorted."""
    from logos.domains.reaction import REACT, RETRO
    from logos.science.chemistry import span

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
def _crystal_rules(space_group: int | None, composition: str | None, headers: tuple[str, ...] = ()) -> str:
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
            raise RecordError(f"unknown element {part!r} in {text[:40]!r}")
        stack[-1][part] = stack[-1].get(part, 0.0) + n
    if len(stack) != 1:
        raise RecordError(f"unbalanced brackets in {text[:40]!r}")
    if not stack[0] or any(v <= 0 for v in stack[0].values()):
        raise RecordError(f"not a chemical formula: {text[:40]!r}")
    return stack[0]


def _group_name(sg: int) -> str:
    import gemmi

    return f"group {sg} ({gemmi.find_spacegroup_by_number(sg).hm.replace(' ', '')})"


def _crystal_prompt(ident: str, formula_text: str, sg: int | None, units: int | None, options: PromptOptions
                    ) -> Prompt:
    """The prompt of one input line; RecordError, naming the line's formula and group, for a line no cell can
    answer: a group outside 1-230, or no cell of the formula that the group's Wyckoff positions can hold (with the
    fewest formula units that would fit)."""
    from logos.decoding.composition import cell_counts, formula_units, placement_problem, smallest_formula_units
    from logos.science.materials.parse import composition_text

    def fixed(comp: str) -> Prompt:
        return Prompt(ident, f"<CrystalS>{comp}" + (f"<sg{sg}>" if sg else ""), _crystal_rules(sg, comp))

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
    return Prompt(ident, "<CrystalS>", _crystal_rules(sg, None, headers), "|".join(headers),
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


def crystal_prompts(task, inputs: Path | None, n: int, errors, *, options: PromptOptions | None = None
                    ) -> list[tuple[Prompt, int]]:
    """Unconditional crystals, or one prompt per input line ``FORMULA [SPACE_GROUP] [Z=N] [ID]``: crystal
    structure prediction. ``-`` in place of the space group leaves it to the model and lets a numeric ID follow
    (``NaCl - 3961``). The formula is one formula unit (``LiFePO4``, ``Fe2O3``, ``Ca(OH)2``): the model writes the
    cell's composition, ``Z`` units, choosing among the cells of at most ``options.max_cell_atoms`` atoms that the
    group's Wyckoff positions can hold (``Fe2O3 167``: Fe12O18 only; ``NaCl 225``: Cl4Na4 or Cl24Na24);
    ``Z=4`` on the line fixes the cell. With ``options.cell_composition`` the formula is the cell's composition
    (``Na4Cl4 225``, written canonically as ``Cl4Na4``), as the CDVAE benchmarks give it. A line no cell can answer
    is refused here, before any sampling, with the fewest formula units that would fit."""
    from logos.util.records import open_text

    options = options or PromptOptions()
    if inputs is None:
        return [(Prompt(UNCONDITIONAL, "<CrystalS>", _crystal_rules(None, None)), n)]
    out = []
    with open_text(inputs) as fh:
        for line_no, line in enumerate(fh, 1):
            fields = line.split()
            if not fields or fields[0].lower() in ("formula", "composition"):
                continue
            zs = [f for f in fields[1:] if _Z.fullmatch(f)]
            fields = [fields[0]] + [f for f in fields[1:] if not _Z.fullmatch(f)]
            sg = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
            rest = fields[2:] if sg is not None or fields[1:2] == ["-"] else fields[1:]
            ident = rest[0] if rest else f"line{line_no}"
            try:
                units = None
                if zs:
                    value = _Z.fullmatch(zs[-1]).group(1)
                    if len(zs) > 1 or not value.isdigit() or int(value) < 1:
                        raise RecordError(f"{' '.join(zs)}: Z is one whole number of formula units, 1 or more")
                    units = int(value)
                prompt = _crystal_prompt(ident, fields[0], sg, units, options)
            except (RecordError, ValueError) as e:
                errors.add(f"{inputs}:{ident}", str(e))
                continue
            out.append((prompt, n))
    return out


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


def head_prompts(task, inputs: Path | None, n: int, errors, head: str, *, options=None) -> list[tuple[Prompt, int]]:
    """The task's opening tags, or one prompt per input line appended to them (e.g. MOF metal nodes)."""
    if inputs is None:
        return [(Prompt(UNCONDITIONAL, head), n)]
    return [(Prompt(ident, head + value), n) for ident, value in _lines(inputs)]


def chain_prompts(task, inputs: Path, n: int, errors, form: str, *, options=None) -> list[tuple[Prompt, int]]:
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


def build_prompts(task, inputs: Path | None, n: int, errors, options: PromptOptions | None = None
                  ) -> list[tuple[Prompt, int]]:
    """(prompt, samples) pairs of ``task`` (a :class:`logos.tasks.registry.Task`): ``n`` in all for unconditional
    tasks, ``n`` per input for conditional ones; ``options`` say how input lines are read."""
    if task.conditional and inputs is None:
        raise InputError(f"--task {task.name} needs --input")
    return task.prompts(task, inputs, n, errors, options)
