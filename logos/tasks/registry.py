"""The task registry: each LOGOS task as one object, read alike by the CLI, generation, finetuning and evaluation.

| task | prompt | completion (grammar) | stops at | finetuning pairs | evaluation |
|---|---|---|---|---|---|
| ``molecule`` | ``<MoleculeS>`` | SMILES | ``<MoleculeE>`` | - | MOSES metrics |
| ``forward`` | reactant spans ``<React>`` | product spans | end of sequence | reactions | top-k |
| ``retro`` (``reaction``) | product span ``<ReverseReact>`` | reactant spans [``<Reagent>`` agents] | end of sequence | reactions | top-k |
| ``protein``, ``antibody`` | ``<ProteinS>`` / ``<AntibodyS>`` | the 20 standard amino acids | the closing tag | - | protein metrics (``protein``) |
| ``pocket`` | chains ``<Search>`` | the same chains, residue for residue, with pocket marks | end of sequence | records cut at ``<Search>`` | DCC, pocket overlap |
| ``ligand`` | chains with pocket marks | a molecule span | ``<MoleculeE>`` | records cut at ``<MoleculeS>`` | ligand metrics |
| ``crystal`` | ``<CrystalS>`` [cell composition, space group] | [the cell composition,] the crystal body | ``<CrystalE>`` | - | CDVAE/CrystaLLM validity |
| ``csp`` | formula or cell composition [space group] (``generate --task crystal --input``) | the crystal | - | composition -> crystal | match rate, RMSE |
| ``mof`` | ``<MaterialS><MetalS>`` [node ``<MetalE>``] | a node formula of real elements, linker spans | ``<MaterialE>`` | records cut at ``<MetalE>`` | MOF validity, novelty |
| ``pairs`` | a user's ``{"prompt", "completion"}`` JSONL | - | - | as given | - |

Every molecule span a task writes (molecules, reactants, products, ligands, linkers) decodes under
the chemistry constraint. The binding-site search grammar is built per request: the output side
must spell the input sequence exactly, only pocket marks are free. These formats are the released
LOGOS checkpoints' formats (``<MoleculeS>p<MoleculeE><ReverseReact>``, ``<ProteinS>seq<ProteinE><Search>``,
``<MaterialS>``), so any causal LM whose tokenizer holds the tags runs them unchanged.

Importing this module is cheap (no RDKit, no torch): a task's behaviour is reached through small
functions that import their module when first called, so ``logos --help`` can list the tasks.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from logos.language.grammar import special_tokens
from logos.science.elements import ELEMENTS, LAST_CLASSICAL
from logos.util.records import InputError

__all__ = ["Task", "TASKS", "ALIASES", "get", "names", "build_pairs", "AMINO_ACIDS"]

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
JOBS = ("generate", "finetune", "evaluate")


# -- behaviour, imported on first use ---------------------------------------------------------------------------

def _prompts(name: str, *args):
    def build(task: "Task", inputs: Path | None, n: int, errors, **bounds):
        from logos.tasks import prompts

        return getattr(prompts, name)(task, inputs, n, errors, *args, **bounds)
    build.__name__ = name
    return build


def _chemistry_rows(table, texts: list[str], choices=None):  # valences, rings, aromaticity of every molecule span
    from logos.decoding.rows import SmilesRow, SmilesVocab

    vocab = SmilesVocab.of(table)
    return [SmilesRow(vocab, t) for t in texts]


def _composition_rows(table, texts: list[str], choices=None):  # the sites must add up to the prompt's composition
    from logos.decoding.rows import CompositionRow                 # (or to the header the model chose)

    return [CompositionRow(table, t, c) for t, c in zip(texts, choices or [""] * len(texts))]


def _copy_rows(table, texts: list[str], choices=None):  # the input sequence copied exactly, pocket marks kept closable
    from logos.decoding.rows import CopyRow

    return [CopyRow(table, t) for t in texts]


def _reaction_answer(side: str):
    def answer(text: str) -> str | None:
        from logos.tasks.answers import reaction_answer

        return reaction_answer(text, side)
    return answer


def _copy_budget(texts: list[str], budget: int) -> int:
    """A copy task (binding-site search) needs the input's length, whatever the default budget."""
    return max(max(len(t) for t in texts) + 32, 64)


def _marked_fasta(samples, out: Path) -> None:
    from logos.tasks.answers import write_marked_fasta

    write_marked_fasta(samples, out)


def _pairs(name: str):
    def build(path: Path, options, errors):
        from logos.tasks import pairs

        return getattr(pairs, name)(path, options, errors)
    build.__name__ = name
    return build


@dataclass(frozen=True)
class Task:
    """One LOGOS task. Generation reads the first group of fields, finetuning the second, evaluation the third."""

    name: str
    summary: str
    # -- generation (``start`` None: the task is not generated under its own name)
    start: str | None = None
    """Grammar start rule of the completion."""
    stop: str = "eos"
    """A closing tag, or ``eos``."""
    symbols: frozenset[str] = frozenset()
    """Grammar symbols the completion may write."""
    conditional: bool = False
    """Needs ``--input``; answers are ranked per input."""
    rules: str = ""
    """Grammar rules added to the shipped grammar (per-request rules come with each prompt)."""
    budget: int = 96
    """Default length budget (new tokens)."""
    temperature: float = 1.0
    """Default sampling temperature (when none is asked). Ranked tasks may sample cooler: more of their samples are
    distinct likely answers."""
    prompts: Callable | None = None
    """``(task, inputs, n, errors, limits=, workers=, on_record=, options=) -> [(Prompt, samples)]``
    (:func:`logos.tasks.prompts.build_prompts`; options: a :class:`~logos.tasks.prompts.PromptOptions` or None)."""
    rows: Callable | None = None
    """``(token table, prompt texts, prompt choices) -> [row constraint]`` (:mod:`logos.decoding.rows`), one per
    prompt: chemistry of molecule spans, a crystal's composition, a copied sequence. The choices are each prompt's
    :attr:`~logos.tasks.prompts.Prompt.choices` (None: none)."""
    answer: Callable[[str], str | None] | None = None
    """The canonical answer of a sample's text; samples with equal answers merge when ranked (reactions)."""
    row_budget: Callable[[list[str], int], int] | None = None
    """``(prompt texts, default budget) -> budget`` of a batch, where the input sets the length (copy tasks)."""
    unmarked_ok: bool = False
    """A completion that marks no pocket is an answer (a binding-site search that finds none), not a failure."""
    extra_output: Callable | None = None
    """``(ranked samples, out path)``: a file written beside the task's output."""
    whole_document: bool = False
    """The completion is a whole record: a finished sample is kept with the model's probability of the end of
    document after it and drawn again otherwise (rejection sampling), so what the model writes as the start of a
    longer record (a reaction's first molecule) is not taken for a standalone one."""
    # -- finetuning
    pairs: Callable | None = None
    """``(path, PairOptions, errors) -> records``: prompt -> completion pairs of a source file."""
    marker: str | None = None
    """Split builders: the symbol after which the completion starts."""
    finetune_metric: str = "exact_match"
    """Held-out score after every checkpoint: ``top1`` (ranked generation) or ``exact_match`` (greedy completion)."""
    # -- evaluation
    evaluate: bool = False
    """``logos evaluate --task NAME`` scores this task's predictions."""
    reference: str | None = None
    """Default reference set of the evaluation (a ``logos fetch`` name)."""

    @property
    def chemistry(self) -> bool:
        """Molecule spans decode under the chemistry constraint."""
        return self.rows is _chemistry_rows

    @property
    def composition(self) -> bool:
        """Whether the task's rows must add up to a composition given in the prompt (crystals)."""
        return self.rows is _composition_rows

    def jobs(self) -> tuple[str, ...]:
        return tuple(j for j, on in zip(JOBS, (self.start is not None, self.pairs is not None, self.evaluate)) if on)


_MOL = frozenset({"<MoleculeS>", "<MoleculeE>"})
_CRYSTAL_SYMBOLS = frozenset(t for t in special_tokens() if re.fullmatch(r"<(sg\d+|w[a-zA-Z])>", t))
_NODE = "(" + "|".join(sorted(ELEMENTS[:LAST_CLASSICAL], key=len, reverse=True)) + r")[0-9]*"
_CHAINS = frozenset({"<ProteinS>", "<ProteinE>", "<PocketS>", "<PocketE>", "<AntibodyS>", "<AntibodyE>"})

TASKS: dict[str, Task] = {t.name: t for t in (
    Task("molecule", "molecules (unconditional)", "task_molecule", "<MoleculeE>", frozenset({"<MoleculeE>"}),
         rules="task_molecule: molecule", prompts=_prompts("head_prompts", "<MoleculeS>"), rows=_chemistry_rows,
         whole_document=True, evaluate=True, reference="moses-test"),
    Task("forward", "reaction products from reactants", "task_forward", "eos", _MOL, conditional=True, budget=128,
         rules="task_forward: molecules op_react molecules", prompts=_prompts("reaction_prompts", "forward"),
         rows=_chemistry_rows, answer=_reaction_answer("products"), pairs=_pairs("reaction_pairs"),
         finetune_metric="top1", evaluate=True),
    Task("retro", "reactants from a product (retrosynthesis)", "task_retro", "eos", _MOL | {"<Reagent>"},
         conditional=True, budget=128, temperature=0.7,
         rules="task_retro: molecules op_reverse_react molecules (op_reagent molecules)?",
         prompts=_prompts("reaction_prompts", "retro"), rows=_chemistry_rows, answer=_reaction_answer("reactants"),
         pairs=_pairs("reaction_pairs"), finetune_metric="top1", evaluate=True),
    Task("protein", "protein sequences (unconditional)", "task_protein", "<ProteinE>", frozenset({"<ProteinE>"}),
         budget=512, rules=f"task_protein: protein_open AMINO_ACIDS protein_close\nAMINO_ACIDS: /[{AMINO_ACIDS}]+/",
         prompts=_prompts("head_prompts", "<ProteinS>"), evaluate=True, reference="pyhmmer-proteins"),
    Task("antibody", "antibody chains (unconditional)", "task_antibody", "<AntibodyE>", frozenset({"<AntibodyE>"}),
         budget=256, rules=f"task_antibody: antibody_open AMINO_ACIDS antibody_close\nAMINO_ACIDS: /[{AMINO_ACIDS}]+/",
         prompts=_prompts("head_prompts", "<AntibodyS>")),
    Task("pocket", "binding sites of proteins (site search)", "task_pocket", "eos", _CHAINS, conditional=True,
         budget=0,  # rules: per request (the copied sequence)
         prompts=_prompts("chain_prompts", "search"), rows=_copy_rows, row_budget=_copy_budget, unmarked_ok=True, extra_output=_marked_fasta,
         pairs=_pairs("split_pairs"), marker="<Search>", evaluate=True),
    Task("ligand", "ligands for marked pockets", "task_ligand", "<MoleculeE>", _MOL, conditional=True, budget=96,
         rules="task_ligand: chains molecule", prompts=_prompts("chain_prompts", "marked"), rows=_chemistry_rows,
         pairs=_pairs("split_pairs"), marker="<MoleculeS>", evaluate=True),
    Task("crystal", "crystals (unconditional, or from formulas)", "task_crystal", "<CrystalE>",
         frozenset({"<CrystalE>", "<Occ>"}) | _CRYSTAL_SYMBOLS, budget=256,  # rules: per request (grammar v2)
         prompts=_prompts("crystal_prompts"), rows=_composition_rows, evaluate=True, reference="mp-dielectric"),
    Task("csp", "crystal structure prediction (generate with --task crystal --input)", pairs=_pairs("csp_pairs"),
         evaluate=True),
    Task("mof", "metal-organic frameworks", "task_mof", "<MaterialE>", _MOL | {"<MetalE>", "<MaterialE>"}, budget=256,
         rules=f"task_mof: material_open metal_open MOF_NODE metal_close molecules material_close\n"
               f"MOF_NODE: /{_NODE}({_NODE})*(\\{{[123]D\\}})?(\\.{_NODE}({_NODE})*(\\{{[123]D\\}})?)*/",
         prompts=_prompts("head_prompts", "<MaterialS><MetalS>"), rows=_chemistry_rows, pairs=_pairs("split_pairs"),
         marker="<MetalE>", evaluate=True),
    Task("pairs", "a prompt -> completion JSONL of your own (finetuning)", pairs=_pairs("jsonl_pairs")),
)}
ALIASES = {"reaction": "retro"}  # the 0.1 name of retrosynthesis


def names(job: str | None = None, aliases: bool = True) -> list[str]:
    """Task names (sorted) that ``job`` (``generate``, ``finetune``, ``evaluate``; None: any) accepts."""
    out = [n for n, t in TASKS.items() if job is None or job in t.jobs()]
    if aliases:
        out += [a for a, n in ALIASES.items() if n in out]
    return sorted(out)


def get(name: str, job: str | None = None) -> Task:
    """The task called ``name`` (or an alias) that ``job`` accepts; InputError naming the known ones otherwise."""
    task = TASKS.get(ALIASES.get(name, name))
    if task is None or (job is not None and job not in task.jobs()):
        raise InputError(f"unknown task {name!r}" + (f" for {job}" if job else "")
                         + f" (known: {', '.join(names(job, aliases=False))})")
    return task


def build_pairs(sources: list[Path], options, out: Path, errors, append: bool = False) -> int:
    """Write (or ``append``) the finetuning pairs of ``options.task`` (a :class:`logos.tasks.pairs.PairOptions`) built
    from every source to ``out`` (JSONL); the count written."""
    task = get(options.task, "finetune")
    if options.marker is None and task.marker is not None:
        options = dataclasses.replace(options, marker=task.marker)
    count = 0
    with open(out, "a" if append else "w") as fh:
        for source in sources:
            for rec in task.pairs(Path(source), options, errors):
                fh.write(json.dumps(rec) + "\n")
                count += 1
    return count
