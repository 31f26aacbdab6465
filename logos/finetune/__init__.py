"""Finetuning: task data builders, LoRA and the task-metric loop around the one trainer (``logos finetune``)."""

from logos.tasks import build_pairs
from logos.tasks.pairs import PairOptions
from logos.finetune.run import FinetuneResult, describe, finetune

__all__ = ["PairOptions", "build_pairs", "describe", "finetune", "FinetuneResult"]
