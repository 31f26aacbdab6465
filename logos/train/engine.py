"""The DeepSpeed side of training: the engine config a recipe implies, the optimizer, ``deepspeed.initialize``.

The recipe owns batch sizes, clipping and precision; a DeepSpeed JSON named by ``train.deepspeed``
(``pretrain/ds_zero3.json``, ...) adds ZeRO details, CPU offload and communication buckets, and its
``zero_optimization.stage`` must equal ``train.zero_stage``. Precision ``bf16-autocast`` keeps fp32
weights in the engine and runs the forward under ``torch.autocast(bfloat16)`` (faster than fp32 on CPUs with
native bf16); ``bf16`` is DeepSpeed's bf16 mode (bf16 weights, fp32 master copy), the GPU choice.
A torch ``AdamW`` (``fused=True``: one pass over memory) is handed to DeepSpeed (DeepSpeed's own
fused/CPU Adam JIT-compiles for minutes on CPU); the LR schedule is a ``LambdaLR`` over
:class:`~logos.train.schedule.Schedule` that DeepSpeed steps and checkpoints.

ZeRO-3 in fp32 keeps one copy of the weights: DeepSpeed means to use the parameter partition as the fp32 master
partition when their dtypes match, but compares a ``torch.device`` with a device *name* (never equal), so it clones
the partition (4 more bytes per parameter and rank); :func:`build_engine` points the master partition back at the
parameter partition. Its optimizer step also copies each sub-group's gradient partition into a flat fp32 tensor;
``sub_group_size`` bounds that copy (DeepSpeed's default, 1e9 elements, makes it a whole partition).

ZeRO-1/2 in a single process without CPU offload partitions nothing: the engine then runs stage 0
(same memory, without stage 2's copies of every gradient into flat buckets and of the fp32
partition back into the model) and the run says so. On
CPU (gloo) there are no streams to overlap communication with: ZeRO-1/2 run with ``overlap_comm``,
``contiguous_gradients`` and ``reduce_scatter`` off (one all-reduce per bucket); GPU runs keep the
JSON's settings. Measurements: ``BENCHMARKS.md``, Training.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from logos.train.recipe import ConfigError, Recipe
from logos.train.schedule import Schedule

__all__ = ["ds_config", "build_engine", "resolve_precision"]


def resolve_precision(precision: str) -> str:
    """``auto`` -> ``bf16`` on a GPU, ``bf16-autocast`` on a CPU with native bf16 (AVX512-BF16, AMX), else ``fp32``."""
    if precision != "auto":
        return precision
    if torch.cuda.is_available():
        return "bf16"
    native = getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)() or \
        getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return "bf16-autocast" if native else "fp32"


# ZeRO-3 without a DeepSpeed JSON: DeepSpeed's own defaults keep up to 1e9 gathered parameters alive
# and a 5e8-element reduce bucket, i.e. the whole model of anything under 1B is resident on every
# rank and ZeRO-3 used *more* memory than ZeRO-0 (338M Llama, 2 processes: 1.37x). Buckets of a few
# layers' size keep the per-rank peak near the partition plus one layer in flight; a recipe's JSON
# (pretrain/ds_zero3*.json, sized for GPUs) overrides every key.
STAGE3_DEFAULTS = {
    "reduce_bucket_size": 20_000_000,
    "stage3_prefetch_bucket_size": 20_000_000,
    "stage3_max_live_parameters": 50_000_000,
    "stage3_max_reuse_distance": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "stage3_gather_16bit_weights_on_model_save": False,
    "sub_group_size": 50_000_000,  # the optimizer step's flat gradient copy: 200 MB in fp32, not a whole partition
}


def ds_config(recipe: Recipe, world_size: int, gpu: bool | None = None) -> dict:
    """The DeepSpeed config dict for a recipe on ``world_size`` processes (``gpu``: default, this machine's)."""
    t = recipe.train
    cfg = {
        "train_micro_batch_size_per_gpu": t.micro_batch,
        "gradient_accumulation_steps": t.grad_accum,
        "train_batch_size": t.micro_batch * t.grad_accum * world_size,
        "gradient_clipping": t.grad_clip,
        "zero_optimization": {"stage": t.zero_stage},
        "bf16": {"enabled": resolve_precision(t.precision) == "bf16"},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if t.zero_stage == 3:
        cfg["zero_optimization"].update(STAGE3_DEFAULTS)
    if t.deepspeed:
        extra = _read_ds_json(t.deepspeed)
        stage = extra.get("zero_optimization", {}).get("stage", t.zero_stage)
        if stage != t.zero_stage:
            raise ConfigError(f"{t.deepspeed}: zero_optimization.stage {stage} but the recipe's train.zero_stage "
                              f"is {t.zero_stage}")
        for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size",
                    "gradient_clipping", "bf16", "fp16"):
            extra.pop(key, None)  # the recipe owns these
        _merge(cfg, extra)
    zero = cfg["zero_optimization"]
    offload = any(isinstance(v, dict) and v.get("device", "none") != "none" for k, v in zero.items()
                  if k.startswith("offload"))
    if world_size == 1 and zero["stage"] in (1, 2) and not offload:
        zero["stage"] = 0  # one process: nothing to partition (see the module docstring)
    if not (torch.cuda.is_available() if gpu is None else gpu) and zero["stage"] in (1, 2):
        # CPU (gloo): no stream to overlap with; one allreduce of the bucket beats per-slice reduces
        zero.update(overlap_comm=False, contiguous_gradients=False, reduce_scatter=False)
    return cfg


def _read_ds_json(name: str) -> dict:
    """A DeepSpeed JSON: a user path, else the shipped file of that name (``pretrain/ds_zero2.json``)."""
    from logos.util.resources import resolve

    try:
        path = resolve(name)
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"train.deepspeed: cannot read {name}: {e}") from None


def _merge(base: dict, extra: dict) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def build_engine(model, recipe: Recipe, schedule: Schedule, config: dict):
    """(engine, scheduler): AdamW (no weight decay on norms and biases) + LambdaLR over ``schedule``."""
    import deepspeed

    t = recipe.train
    def matrix(p) -> bool:  # ZeRO-3 partitions parameters at construction: their shape is in ds_shape
        return len(getattr(p, "ds_shape", None) or p.shape) >= 2

    trained = [p for p in model.parameters() if p.requires_grad]  # LoRA: adapters and symbol rows only
    decay = [p for p in trained if matrix(p)]
    no_decay = [p for p in trained if not matrix(p)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": t.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=t.lr, betas=t.betas, eps=1e-8,
                                  fused=True)
    engine, _, _, scheduler = deepspeed.initialize(
        model=model, optimizer=optimizer, config=config,
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda step: schedule.multiplier(step)))
    share_fp32_master(engine.optimizer)
    return engine, scheduler


def share_fp32_master(optimizer) -> int:
    """ZeRO-3 with fp32 parameters: make each fp32 master partition the parameter partition itself (no clone).

    DeepSpeed's stage 3 intends this when the dtypes match and no optimizer offload is set, but its device test never
    holds (see the module docstring). Afterwards the optimizer updates the parameter partition in place and
    DeepSpeed's copy back from master to parameters copies a tensor onto itself. Returns the bytes freed per rank.
    """
    lows = getattr(optimizer, "fp16_partitioned_groups_flat", None)
    highs = getattr(optimizer, "fp32_partitioned_groups_flat", None)
    if not lows or not highs or getattr(optimizer, "offload_optimizer", False) or len(lows) != len(highs):
        return 0
    freed = 0
    for low, high in zip(lows, highs):
        if low is None or low.dtype != high.dtype or low.device != high.device or low.shape != high.shape \
                or low.data_ptr() == high.data_ptr():
            continue
        freed += high.numel() * high.element_size()
        high.data = low.data  # same tensor object for the optimizer (its state is keyed by it), shared storage
    return freed
