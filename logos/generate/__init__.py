"""Generation: constrained sampling from a checkpoint for every LOGOS task, detokenized into files (the job;
the sampler and its constraints are in :mod:`logos.decoding`).

- :mod:`~logos.tasks` - the task registry: prompts, grammars, stops and row constraints of each task;
- :mod:`~logos.decoding.chemistry` - incremental SMILES validity (rings, branches, valences);
- :mod:`~logos.decoding.constraints` - the grammar (llguidance) and chemistry constraints per row;
- :mod:`~logos.decoding.policy` - the per-row sampling policy both engines call (draws, checks, redraws, endings);
- :mod:`~logos.decoding.sampler` - the built-in batched sampling loop (KV cache, masks, the policies, budgets);
- :mod:`~logos.generate.pipeline` - ``logos generate``: batches, resampling, ranking, files;
- :mod:`~logos.generate.resample` - the resample queue both engines' front ends draw from;
- :mod:`~logos.generate.vllm_engine`, :mod:`~logos.generate.vllm_processor` - the vLLM engine: its front end, and
  the logits processor that runs the same policy inside it.
"""

from logos.decoding.sampler import Sampling
from logos.generate.pipeline import GenerateOptions, GenerateResult, generate, load_checkpoint, run
from logos.tasks import TASKS

__all__ = ["GenerateOptions", "GenerateResult", "Sampling", "TASKS", "generate", "load_checkpoint", "run"]
