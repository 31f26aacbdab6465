"""Generation tasks: what each task prompts with, which grammar and constraints it decodes under, where it stops.

| task | prompt | completion (grammar) | stops at |
|---|---|---|---|
| ``molecule`` | ``<MoleculeS>`` | SMILES | ``<MoleculeE>`` |
| ``forward`` | reactant spans ``<React>`` | product spans | end of sequence |
| ``retro`` (``reaction``) | product span ``<ReverseReact>`` | reactant spans [``<Reagent>`` agents] | end of sequence |
| ``protein``, ``antibody`` | ``<ProteinS>`` / ``<AntibodyS>`` | the 20 standard amino acids | the closing tag |
| ``pocket`` | chains ``<Search>`` | the same chains, residue for residue, with pocket marks | end of sequence |
| ``ligand`` | chains with pocket marks | a molecule span | ``<MoleculeE>`` |
| ``crystal`` | ``<CrystalS>`` [composition, space group] | the crystal body | ``<CrystalE>`` |
| ``mof`` | ``<MaterialS><MetalS>`` [node ``<MetalE>``] | a node formula of real elements, linker spans | ``<MaterialE>`` |

Every molecule span a task writes (molecules, reactants, products, ligands, linkers) decodes under
the chemistry constraint. The binding-site search grammar is built per request: the output side
must spell the input sequence exactly, only pocket marks are free. These formats are the released
LOGOS checkpoints' formats (``<MoleculeS>p<MoleculeE><ReverseReact>``, ``<ProteinS>seq<ProteinE><Search>``,
``<MaterialS>``), so any causal LM whose tokenizer holds the tags runs them unchanged.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from logos.chem import canonical_smiles, parse_smiles, span
from logos.grammar import special_tokens
from logos.records import InputError, RecordError, plain_name

__all__ = ["Task", "TASKS", "Prompt", "build_prompts"]

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
ELEMENTS = ("H He Li Be B C N O F Ne Na Mg Al Si P S Cl Ar K Ca Sc Ti V Cr Mn Fe Co Ni Cu Zn Ga Ge As Se Br Kr Rb Sr "
            "Y Zr Nb Mo Tc Ru Rh Pd Ag Cd In Sn Sb Te I Xe Cs Ba La Ce Pr Nd Pm Sm Eu Gd Tb Dy Ho Er Tm Yb Lu Hf Ta W Re "
            "Os Ir Pt Au Hg Tl Pb Bi Po At Rn Fr Ra Ac Th Pa U Np Pu Am Cm Bk Cf Es Fm Md No Lr").split()


@dataclass(frozen=True)
class Task:
    name: str
    start: str                       # grammar start rule
    stop: str                        # a closing tag, or "eos"
    symbols: frozenset[str]          # grammar symbols the completion may write
    chemistry: bool = True           # molecule spans decode under the chemistry constraint
    conditional: bool = False        # needs --input; answers are ranked per input
    rules: str = ""                  # grammar rules added to the shipped grammar
    budget: int = 96                 # default length budget (new tokens)


_MOL = frozenset({"<MoleculeS>", "<MoleculeE>"})
_CRYSTAL_SYMBOLS = frozenset(t for t in special_tokens() if re.fullmatch(r"<(sg\d+|w[a-zA-Z])>", t))
_NODE = "(" + "|".join(sorted(ELEMENTS, key=len, reverse=True)) + r")[0-9]*"
TASKS: dict[str, Task] = {t.name: t for t in (
    Task("molecule", "task_molecule", "<MoleculeE>", frozenset({"<MoleculeE>"}),
         rules="task_molecule: molecule"),
    Task("forward", "task_forward", "eos", _MOL, conditional=True, budget=128,
         rules="task_forward: molecules op_react molecules"),
    Task("retro", "task_retro", "eos", _MOL | {"<Reagent>"}, conditional=True, budget=128,
         rules="task_retro: molecules op_reverse_react molecules (op_reagent molecules)?"),
    Task("protein", "task_protein", "<ProteinE>", frozenset({"<ProteinE>"}), chemistry=False, budget=512,
         rules=f"task_protein: protein_open AMINO_ACIDS protein_close\nAMINO_ACIDS: /[{AMINO_ACIDS}]+/"),
    Task("antibody", "task_antibody", "<AntibodyE>", frozenset({"<AntibodyE>"}), chemistry=False, budget=256,
         rules=f"task_antibody: antibody_open AMINO_ACIDS antibody_close\nAMINO_ACIDS: /[{AMINO_ACIDS}]+/"),
    Task("pocket", "task_pocket", "eos", frozenset({"<ProteinS>", "<ProteinE>", "<PocketS>", "<PocketE>",
                                                   "<AntibodyS>", "<AntibodyE>"}),
         chemistry=False, conditional=True, budget=0),  # rules: per request (the copied sequence)
    Task("ligand", "task_ligand", "<MoleculeE>", _MOL, conditional=True, budget=96,
         rules="task_ligand: chains molecule"),
    Task("crystal", "task_crystal", "<CrystalE>", frozenset({"<CrystalE>", "<Occ>"}) | _CRYSTAL_SYMBOLS,
         chemistry=False, budget=256),  # rules: per request (logos.materials.constraint, grammar v2)
    Task("mof", "task_mof", "<MaterialE>", _MOL | {"<MetalE>", "<MaterialE>"}, budget=256,
         rules=f"task_mof: material_open metal_open MOF_NODE metal_close molecules material_close\n"
               f"MOF_NODE: /{_NODE}({_NODE})*(\\{{[123]D\\}})?(\\.{_NODE}({_NODE})*(\\{{[123]D\\}})?)*/"),
)}
TASKS["reaction"] = TASKS["retro"]  # the 0.1 name of retrosynthesis


@dataclass
class Prompt:
    """One prompt: the input it came from, its id, the grammar text before the completion, extra grammar rules."""

    input_id: str
    text: str
    rules: str = ""


def _lines(path: Path) -> list[tuple[str, str]]:
    """(id, first field) of each non-empty line of a SMILES-like file; ids are the names or line numbers."""
    from logos.records import open_text

    out = []
    with open_text(path) as fh:
        for n, line in enumerate(fh, 1):
            fields = line.split()
            if fields and fields[0].lower() not in ("smiles", "smi", "reactants", "product"):
                out.append((fields[1] if len(fields) > 1 else f"line{n}", fields[0]))
    return out


def _canonical_set(smiles: str) -> list[str]:
    return sorted(canonical_smiles(parse_smiles(s)) for s in smiles.split(".") if s)


def _reaction_prompts(task: Task, path: Path, errors) -> list[Prompt]:
    from logos.domains.reaction import REACT, RETRO

    prompts = []
    for ident, value in _lines(path):
        side = value.split(">")[0] if task.name == "forward" and ">" in value else \
            value.split(">")[-1] if ">" in value else value
        try:
            mols = _canonical_set(side)
        except RecordError as e:
            errors.add(f"{path}:{ident}", str(e))
            continue
        if not mols:
            errors.add(f"{path}:{ident}", "no molecule")
            continue
        op = REACT if task.name == "forward" else RETRO
        prompts.append(Prompt(ident, "".join(span(m) for m in mols) + op))
    return prompts


def _chains_of(path: Path) -> list[tuple[str, list[str], str]]:
    """(id, chain sequences, marked text or '') of a FASTA, a structure file or a JSONL of grammar records."""
    from logos.domains.protein import parse_chains

    name = plain_name(path)
    if name.endswith(".jsonl"):
        from logos.records import read_records

        out = []
        for rec in read_records(path):
            text = rec["text"].split("<Search>")[-1]
            chains = [c.sequence for c in parse_chains(text)]
            ligand_free = re.sub(r"<MoleculeS>.*?<MoleculeE>", "", text)
            out.append((str(rec.get("id") or rec["source"]), chains, re.sub(r"<a\d+>", "", ligand_free)))
        return out
    if name.endswith((".fasta", ".fa", ".faa", ".fas")):
        from Bio import SeqIO

        from logos.records import open_text

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
    from logos.materials.constraint import crystal_task_rules

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


def _crystal_prompts(inputs: Path | None, n: int, errors) -> list[tuple[Prompt, int]]:
    """Unconditional crystals, or one prompt per input line ``FORMULA [SPACE_GROUP] [ID]`` (the conventional
    cell's formula, e.g. ``Na4Cl4 225``, written canonically as ``Cl4Na4``): crystal structure prediction.
    ``-`` in place of the space group leaves it to the model and lets a numeric ID follow (``Cl4Na4 - 3961``)."""
    from logos.materials.parse import composition_text
    from logos.records import open_text

    if inputs is None:
        return [(Prompt("gen", "<CrystalS>", _crystal_rules(None, None)), n)]
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


def build_prompts(task: Task, inputs: Path | None, n: int, errors) -> list[tuple[Prompt, int]]:
    """(prompt, samples) pairs: ``n`` in all for unconditional tasks, ``n`` per input for conditional ones."""
    if task.conditional and inputs is None:
        raise InputError(f"--task {task.name} needs --input")
    if not task.conditional:
        head = {"molecule": "<MoleculeS>", "protein": "<ProteinS>", "antibody": "<AntibodyS>",
                "crystal": "<CrystalS>", "mof": "<MaterialS><MetalS>"}[task.name]
        if task.name == "crystal":
            return _crystal_prompts(inputs, n, errors)
        if inputs is None:
            return [(Prompt("gen", head), n)]
        return [(Prompt(ident, head + value), n) for ident, value in _lines(inputs)]  # metal nodes
    if task.name in ("forward", "retro"):
        return [(p, n) for p in _reaction_prompts(task, inputs, errors)]
    out = []
    for ident, chains, marked in _chains_of(inputs):
        if not chains:
            errors.add(f"{inputs}:{ident}", "no protein chain")
            continue
        if task.name == "pocket":
            text = "".join(f"<ProteinS>{s}<ProteinE>" for s in chains) + "<Search>"
            out.append((Prompt(ident, text, search_rules(chains)), n))
        elif not marked or "<PocketS>" not in marked:
            errors.add(f"{inputs}:{ident}", "ligand design needs pocket marks (a marked sequence, e.g. a record of "
                                            "`logos tokenize` or the output of --task pocket)")
        else:
            out.append((Prompt(ident, marked), n))
    return out
