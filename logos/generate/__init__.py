"""Generation: constrained sampling from a checkpoint for every LOGOS task, detokenized into files.

- :mod:`~logos.generate.tasks` - prompts, grammars and stops of each task;
- :mod:`~logos.generate.chemistry` - incremental SMILES validity (rings, branches, valences);
- :mod:`~logos.generate.constraints` - the grammar (llguidance) and chemistry constraints per row;
- :mod:`~logos.generate.sampler` - the batched sampling loop (KV cache, masks, rejection, budgets);
- :mod:`~logos.generate.pipeline` - ``logos generate``: batches, resampling, ranking, files.
"""

from logos.generate.pipeline import GenerateOptions, GenerateResult, generate, load_checkpoint, molecule_summary
from logos.generate.sampler import Sampling
from logos.generate.tasks import TASKS

__all__ = ["GenerateOptions", "GenerateResult", "Sampling", "TASKS", "generate", "load_checkpoint",
           "molecule_summary"]
