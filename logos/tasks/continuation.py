"""The grammar of what follows a task's prompt: for engines whose grammar sees only the generated tokens.

The built-in engine compiles the task grammar (start rule ``task_*``) and feeds it the prompt's
tokens before sampling. vLLM's structured outputs start the grammar at the first generated token, so
each request carries a grammar whose start rule is the *continuation* of its prompt: the same
shipped grammar and task rules, plus one rule ``task_continue`` for what may follow the prompt.

| task | prompt ends with | ``task_continue`` |
|---|---|---|
| ``molecule`` | ``<MoleculeS>`` | ``smiles molecule_close`` |
| ``forward`` / ``retro`` | ``<React>`` / ``<ReverseReact>`` | the product / reactant spans (retro: optional ``<Reagent>`` spans) |
| ``protein`` / ``antibody`` | the opening tag | residues and the closing tag |
| ``pocket`` | ``<Search>`` | the copied chains with pocket marks (the request's own rules) |
| ``ligand`` | the marked chains | one molecule span |
| ``crystal`` | ``<CrystalS>`` [composition] [``<sgN>``] | [the header: one of the request's choices, or any] the body (of group N when given) and ``<CrystalE>`` |
| ``mof`` | ``<MetalS>`` [a node] | the node (or its optional rest), ``<MetalE>``, linker spans, ``<MaterialE>`` |

A crystal prompt whose composition has whole counts (``Cl4Na4``) is continued with fully occupied
sites only: the composition constraint counts every site's multiplicity, and a partially occupied
site (``<Occ>``) would escape the count (the built-in engine lets it through and the writer then
refuses the crystal). Fractional compositions keep ``<Occ>``.

The one approximation: a MOF prompt that already holds part of a node is continued by further
whole formula parts (``Zn2`` + ``Cu``), not by digits of its last count; the writer still checks
the node. Everything else accepts exactly the texts the built-in grammar accepts after the prompt.
"""

from __future__ import annotations

import re

from logos.decoding.constraints import task_grammar
from logos.tasks.prompts import Prompt
from logos.tasks.registry import Task

__all__ = ["START", "continuation_rule", "continuation_grammar"]


def _whole_composition(prompt_text: str) -> bool:
    from logos.decoding.composition import CompositionRows

    return CompositionRows._target(prompt_text) is not None

START = "task_continue"


def continuation_rule(task: Task, prompt: Prompt) -> str:
    """The right-hand side of ``task_continue`` for ``prompt`` of ``task``."""
    name, text = task.name, prompt.text
    if name == "molecule":
        return "smiles molecule_close"
    if name == "forward":
        return "molecules"
    if name in ("retro", "reaction"):
        return "molecules (op_reagent molecules)?"
    if name in ("protein", "antibody"):
        return f"AMINO_ACIDS {name}_close"
    if name == "pocket":
        chains = len(re.findall(r"<ProteinS>|<AntibodyS>", text.split("<Search>")[0]))
        return " ".join(f"copy{c}" for c in range(chains))
    if name == "ligand":
        return "molecule"
    if name == "crystal":
        if text.endswith("<CrystalS>"):  # the model writes the composition header: one of the request's, or any
            head = "xtal_head" if re.search(r"(?m)^xtal_head:", prompt.rules) else "XTAL_COMP"
            return f"{head} xtal_body crystal_close"
        m = re.search(r"<sg(\d+)>$", text)
        if m is None:
            return "xtal_body crystal_close"
        sg = m.group(1)
        rule = re.search(rf"(?m)^xtal_sg{sg}: <sg{sg}> (.*)$", prompt.rules)
        if rule is None:
            raise ValueError(f"no rules for space group {sg} in the request")
        return f"{rule.group(1)} crystal_close"
    if name == "mof":
        rest = "metal_close molecules material_close"
        return f"MOF_NODE {rest}" if text.endswith("<MetalS>") else f"MOF_NODE? {rest}"
    raise ValueError(f"no continuation grammar for task {name!r}")


def continuation_grammar(task: Task, prompt: Prompt) -> str:
    """The whole Lark grammar (llguidance dialect) for what the model may write after ``prompt``."""
    rules = "\n".join(r for r in (task.rules, prompt.rules) if r)
    if task.name == "crystal" and _whole_composition(prompt.text):
        rules = rules.replace(" xtal_occ?", "")  # whole counts: fully occupied sites, each one counted
    return task_grammar(START, rules + f"\n{START}: {continuation_rule(task, prompt)}")
