"""Training: pretraining and finetuning through one DeepSpeed loop (``logos pretrain``, ``logos finetune``).

The file list is the architecture:

- :mod:`~logos.train.recipe` - the typed recipe (model shape, data, optimizer, schedule, ZeRO, precision);
- :mod:`~logos.train.schedule` - the LR schedule (warm-up, decay over a fixed step count, budget runs);
- :mod:`~logos.train.model` - the model factory (fresh, or a base LLM extended with the grammar; ZeRO-3 partitioned);
- :mod:`~logos.train.engine` - the DeepSpeed config, optimizer and engine;
- :mod:`~logos.train.distributed` - the process group and its few collectives;
- :mod:`~logos.train.checkpoint` - the atomic checkpoint store and resume;
- :mod:`~logos.train.metrics` - ``metrics.csv`` and the loss curve;
- :mod:`~logos.train.trainer` - the loop.

DeepSpeed is imported by this package (and by :mod:`logos.train.plan`, for its memory estimators); model
code never sees it.
"""

from logos.train.engine import ds_config
from logos.train.model import build_model, describe, vocab_of
from logos.train.recipe import ConfigError, Recipe, load_recipe, padded_vocab
from logos.train.schedule import Schedule
from logos.train.trainer import TrainResult, Trainer, pretrain

__all__ = ["Trainer", "TrainResult", "pretrain", "describe", "ds_config", "build_model", "vocab_of", "Schedule",
           "Recipe", "load_recipe", "padded_vocab", "ConfigError"]
