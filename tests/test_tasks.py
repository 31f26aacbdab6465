"""The task registry: one object per task, read by the CLI, generation, finetuning and evaluation alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from logos import tasks

ROOT = Path(__file__).resolve().parent.parent / "logos"


def test_every_job_reads_the_registry():
    from logos.cli.main import build_parser
    from logos.evaluate import tasks as evaluation

    parser = build_parser("*")
    sub = next(a for a in parser._actions if a.dest == "command").choices
    generate_choices = next(a for a in sub["generate"]._actions if a.dest == "task").choices
    evaluate_choices = next(a for a in sub["evaluate"]._actions if a.dest == "task").choices
    assert list(generate_choices) == tasks.names("generate")
    assert list(evaluate_choices) == tasks.names("evaluate", aliases=False)
    assert set(evaluation._RUNNERS) == set(tasks.names("evaluate", aliases=False))
    assert tasks.names("generate") == ["antibody", "crystal", "forward", "ligand", "mof", "molecule", "pocket",
                                       "protein", "reaction", "retro"]
    assert tasks.names("finetune", aliases=False) == ["csp", "forward", "ligand", "mof", "pairs", "pocket", "retro"]


def test_generation_fields_are_complete():
    for name in tasks.names("generate", aliases=False):
        t = tasks.get(name)
        assert t.prompts is not None and t.stop and (t.stop == "eos" or t.stop.startswith("<")), name


def test_aliases_and_unknown_names():
    assert tasks.get("reaction") is tasks.get("retro")
    with pytest.raises(Exception, match="unknown task 'csp' for generate"):
        tasks.get("csp", "generate")


def test_no_job_branches_on_a_task_name():
    pattern = re.compile(r"task\.name\s*(==|!=|in\b)")
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in ROOT.rglob("*.py") if "tasks" not in p.parts
                 for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not offenders, offenders
