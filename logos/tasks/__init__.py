"""The LOGOS tasks: one registry (:mod:`~logos.tasks.registry`) read by the CLI, generation, finetuning and
evaluation; each task's prompt builders (:mod:`~logos.tasks.prompts`), finetuning pair builders
(:mod:`~logos.tasks.pairs`) and answer readers (:mod:`~logos.tasks.answers`)."""

from logos.tasks.registry import ALIASES, TASKS, Task, build_pairs, get, names

__all__ = ["Task", "TASKS", "ALIASES", "get", "names", "build_pairs"]
