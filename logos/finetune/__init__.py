"""Finetuning: task data builders, LoRA and the task-metric loop around the one trainer (``logos finetune``)."""

from logos.finetune.data import PairOptions, build_pairs
from logos.finetune.run import FinetuneResult, finetune

__all__ = ["PairOptions", "build_pairs", "finetune", "FinetuneResult"]
