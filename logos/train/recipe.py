"""Typed training recipes: the schema that every YAML recipe under ``pretrain/`` instantiates.

A recipe has two sections, ``model`` (:class:`ModelConfig`, the transformers architecture and its
shape) and ``train`` (:class:`TrainConfig`, data, optimizer, schedule, DeepSpeed and precision).
Unknown keys are errors (a typo never silently falls back to a default); checks live in
``__post_init__``. ``load_recipe(path, overrides)`` applies ``section.key=value`` overrides.

The vocabulary is padded to a multiple of 64 (``padded_vocab``); the extra rows are never targets,
and generation masks them out.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

from logos.util.config import check_types

__all__ = ["ModelConfig", "TrainConfig", "Recipe", "load_recipe", "padded_vocab", "ConfigError"]

ARCHITECTURES = ("llama", "qwen3")
PRECISIONS = ("auto", "fp32", "bf16-autocast", "bf16")
SCHEDULES = ("cosine", "linear", "constant")


class ConfigError(ValueError):
    """A recipe that cannot be used; the message names the field."""


def padded_vocab(n: int, multiple: int = 64) -> int:
    """>>> padded_vocab(2394)
    2432
    """
    return int(math.ceil(n / multiple) * multiple)


@dataclass
class ModelConfig:
    """Shape of the decoder; becomes a transformers ``LlamaConfig`` or ``Qwen3Config``."""

    arch: str = "llama"
    """``llama`` (LlamaForCausalLM) or ``qwen3`` (Qwen3ForCausalLM)."""
    hidden_size: int = 256
    """Width of the residual stream."""
    num_layers: int = 6
    """Decoder blocks."""
    num_heads: int = 8
    """Query heads; ``hidden_size`` need not divide by it when ``head_dim`` is given."""
    num_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); default: ``num_heads``."""
    head_dim: int | None = None
    """Per-head width; default ``hidden_size // num_heads``."""
    intermediate_size: int | None = None
    """MLP width; default ``4 * hidden_size`` rounded."""
    max_position: int = 2048
    """Longest sequence the position embedding (RoPE) is configured for."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    rms_norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    tie_embeddings: bool = True
    """Share input embedding and output head weights."""
    vocab_size: int | None = None
    """Embedding rows; default: the tokenizer's size padded to a multiple of 64 (filled in at run time)."""
    init_std: float = 0.02
    """Standard deviation of the initial weights."""

    def __post_init__(self):
        if self.arch not in ARCHITECTURES:
            raise ConfigError(f"model.arch must be one of {ARCHITECTURES}, got {self.arch!r}")
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ConfigError("model.hidden_size must divide by model.num_heads (or give head_dim)")
            self.head_dim = self.hidden_size // self.num_heads
        if self.num_heads % self.num_kv_heads:
            raise ConfigError("model.num_heads must divide by model.num_kv_heads")
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"model.{name} must be positive")

    def hf_config(self, vocab_size: int, bos_id: int = 1, eos_id: int = 2, pad_id: int = 3):
        """The transformers config object for this shape and vocabulary."""
        from transformers import LlamaConfig, Qwen3Config

        common = dict(
            vocab_size=self.vocab_size or vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_position, rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_embeddings, initializer_range=self.init_std,
            bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id,
        )
        if self.arch == "llama":
            cfg = LlamaConfig(**common, hidden_act="silu", attention_bias=False, mlp_bias=False)
        else:
            cfg = Qwen3Config(**common, hidden_act="silu", attention_bias=False)
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": self.rope_theta}
        return cfg


@dataclass
class TrainConfig:
    """Data, optimizer, schedule, parallelism and bookkeeping of one pretraining run."""

    data: str = "shards"
    """Shard directory written by ``logos pack``."""
    tokenizer: str = "tokenizers/default"
    """Tokenizer directory (copied into every exported checkpoint)."""
    out_dir: str = "runs/tiny"
    """Run directory: DeepSpeed checkpoints, ``hf/`` export, ``metrics.csv``, ``loss.png``."""
    seq_len: int = 128
    """Tokens per packed training row."""
    micro_batch: int = 16
    """Rows per process per forward/backward."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    max_steps: int = 1000
    """Most optimizer steps (the LR schedule's length unless ``max_minutes`` or ``schedule_steps`` fixes it)."""
    max_minutes: float | None = None
    """Wall-clock budget (training, evaluation, saving). A hard stop; and, unless ``schedule_steps`` is given, the
    LR schedule's length is fixed once from measured throughput: after ``max(warmup_steps, 10)`` steps the run
    computes how many steps fit in the budget, records that step count in every checkpoint and decays the LR over
    it (the LR holds its peak until then), so a resumed run follows the same LR as an uninterrupted one."""
    schedule_steps: int | None = None
    """The LR schedule's length in steps, given explicitly (default: ``max_steps``, or measured under ``max_minutes``);
    the run stops there. Given on ``--resume``, it re-plans the rest of the run (the decay from the resumed step
    follows the new length) instead of the length the checkpoint recorded."""
    lr: float = 1e-3
    """Peak learning rate."""
    min_lr_ratio: float = 0.1
    """Final LR as a fraction of ``lr`` (cosine/linear)."""
    warmup_steps: int = 50
    """Linear warm-up steps."""
    schedule: str = "cosine"
    """``cosine``, ``linear`` or ``constant`` after warm-up."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay (not applied to norms and biases)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    grad_clip: float = 1.0
    """Global gradient-norm clipping (0 disables)."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0-3."""
    precision: str = "auto"
    """``fp32``; ``bf16-autocast`` (fp32 weights, bf16 matmuls: faster than fp32 on CPUs with AVX512-BF16 or AMX, much
    slower on AVX2-only CPUs, which emulate bf16); ``bf16`` (DeepSpeed bf16 weights + fp32 master, the GPU
    choice); ``auto``: bf16 on a GPU, bf16-autocast on a CPU with native bf16, else fp32 (recorded in the run)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward (large models)."""
    seed: int = 0
    """Seeds initialization and the data order."""
    log_every: int = 10
    """Steps between console/CSV log rows."""
    eval_every: int = 200
    """Steps between validation-loss evaluations (0: only at the end)."""
    eval_rows: int = 64
    """Validation rows per evaluation."""
    save_every: int = 500
    """Steps between DeepSpeed checkpoints (each also refreshes the ``hf/`` export)."""
    keep_checkpoints: int = 2
    """DeepSpeed checkpoints kept on disk (older ones are deleted)."""
    export_dtype: str = "float32"
    """dtype of the exported ``model.safetensors`` (``float32`` or ``bfloat16``)."""
    deepspeed: str | None = None
    """A DeepSpeed JSON (``pretrain/ds_zero3.json``, ...) merged over the config generated from this recipe:
    ZeRO details, CPU offload, communication buckets. Batch sizes, clipping and precision still come from the
    recipe; its ``zero_optimization.stage`` must equal ``zero_stage``."""
    mixture: dict[str, float] | None = None
    """Sampling weight per domain (``{molecule: 0.6, protein: 0.3, crystal: 0.1}``); the loader draws training
    rows from each domain in exactly these proportions. Default: rows in their packed proportions."""
    on_nonfinite: str = "stop"
    """A NaN/inf loss (detected before backward): ``stop`` (the last checkpoint stays intact) or ``skip`` (reload
    the last checkpoint in place and replay without the offending batch; see :mod:`logos.train.faults`)."""
    on_bad_batch: str = "stop"
    """A batch with token ids outside the vocabulary (a corrupt shard): ``stop`` or ``skip`` it."""
    max_skips: int = 3
    """Most batches ``skip`` may leave out in one process before the run stops anyway."""
    on_save_error: str = "stop"
    """A checkpoint that cannot be written (disk full, I/O error): ``stop``, or ``continue`` training to the next
    save (the partial checkpoint is removed either way; the previous one stays the resume point)."""
    init_from: str | None = None
    """Continued pretraining: a local Llama/Qwen3 Hugging Face directory whose tokenizer gains the grammar
    symbols and whose embeddings are resized (``logos.language.extend``); ``model`` then only names the architecture."""

    def __post_init__(self):
        self.betas = tuple(float(b) for b in self.betas)
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"train.zero_stage must be 0-3, got {self.zero_stage}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"train.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"train.schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name, allowed in (("on_nonfinite", ("stop", "skip")), ("on_bad_batch", ("stop", "skip")),
                              ("on_save_error", ("stop", "continue"))):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"train.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.export_dtype not in ("float32", "bfloat16"):
            raise ConfigError("train.export_dtype must be float32 or bfloat16")
        for name in ("seq_len", "micro_batch", "grad_accum", "max_steps", "log_every", "save_every", "eval_rows"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"train.{name} must be positive")
        if self.lr <= 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError("train.lr must be positive and train.min_lr_ratio in [0, 1]")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ConfigError("train.max_minutes must be positive (or null)")
        if self.schedule_steps is not None and not 0 < self.schedule_steps <= self.max_steps:
            raise ConfigError("train.schedule_steps must be in 1..max_steps (or null)")
        if self.warmup_steps < 0 or self.eval_every < 0 or self.keep_checkpoints < 1:
            raise ConfigError("train.warmup_steps/eval_every must be >= 0 and keep_checkpoints >= 1")
        if self.mixture is not None:
            if not isinstance(self.mixture, dict) or not self.mixture or \
                    any(not isinstance(w, (int, float)) or w < 0 for w in self.mixture.values()) or \
                    sum(self.mixture.values()) <= 0:
                raise ConfigError("train.mixture must map domain names to non-negative weights with a positive sum")
            total = float(sum(self.mixture.values()))
            self.mixture = {str(d): float(w) / total for d, w in self.mixture.items()}


@dataclass
class LoraConfig:
    """LoRA finetuning (``peft``; :mod:`logos.train.lora`): adapters on every projection, symbol rows trainable.

    The export is always both: ``hf/`` with the adapters merged into the weights, and ``adapter/`` in peft's format."""

    rank: int = 16
    alpha: float = 32.0
    dropout: float = 0.05

    def __post_init__(self):
        if self.rank <= 0 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ConfigError("lora.rank and lora.alpha must be positive and lora.dropout in [0, 1)")


@dataclass
class FinetuneConfig:
    """What a finetune trains on and how it is scored (:mod:`logos.finetune`)."""

    task: str = "retro"
    """``retro``, ``forward``, ``csp``, ``pocket``, ``ligand``, ``mof`` or ``pairs`` (a prompt/completion JSONL)."""
    sources: list[str] = field(default_factory=list)
    """Input files (``.rsmi``, USPTO CSV, CDVAE CSV, CIFs, ``logos tokenize`` JSONL, pairs JSONL)."""
    val_sources: list[str] = field(default_factory=list)
    """Held-out files (default: ``val_fraction`` of the sources' groups, by seeded hash)."""
    val_fraction: float = 0.05
    augment: int = 0
    """Randomized-SMILES variants per reaction (all on the reaction's side of the split)."""
    augment_side: str = "both"
    """``both``: a variant randomizes prompt and completion; ``prompt``: only the prompt (one canonical target)."""
    marker: str | None = None
    """Where ``pocket``/``ligand``/``mof`` records are cut into prompt and completion (default per task)."""
    with_space_group: bool = False
    """``csp``: the prompt gives the space group as well as the composition."""
    metric_items: int = 50
    """Held-out items scored with the task's metric at every checkpoint (0: none)."""
    metric_samples: int = 5
    """Samples per held-out item for the metric (top-1 after ranking)."""
    parts: list[dict] = field(default_factory=list)
    """Multitask (``task: multitask``): ``[{task, sources, weight, augment?, marker?}, ...]``; records carry their
    task as their domain and ``train.mixture`` is set to the weights, so each task's share of the training rows is
    exact. The metric follows the first part."""

    def __post_init__(self):
        if not 0 <= self.val_fraction < 1 or self.augment < 0 or self.metric_items < 0 or self.metric_samples < 1:
            raise ConfigError("finetune: val_fraction in [0, 1), augment/metric_items >= 0, metric_samples >= 1")
        if self.augment_side not in ("both", "prompt"):
            raise ConfigError(f"finetune.augment_side must be 'both' or 'prompt', got {self.augment_side!r}")
        if (self.task == "multitask") != bool(self.parts):
            raise ConfigError("finetune.parts is for task: multitask (and multitask needs parts)")
        for part in self.parts:
            if not isinstance(part, dict) or not part.get("task") or not part.get("sources") \
                    or not isinstance(part.get("weight", 1.0), (int, float)):
                raise ConfigError(f"finetune.parts: each part needs task, sources and a numeric weight, got {part!r}")


@dataclass
class Recipe:
    """A recipe: ``name``, ``model`` and ``train`` sections; finetuning adds ``finetune`` (and ``lora``)."""

    name: str = "unnamed"
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    finetune: FinetuneConfig | None = None
    lora: LoraConfig | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _build(cls, values: dict, section: str):
    if not isinstance(values, dict):
        raise ConfigError(f"{section} must be a mapping")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) in {section}: {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    values = dict(values)
    for f in fields(cls):
        if f.name in values and f.type in ("float", "float | None") and isinstance(values[f.name], (str, int)) \
                and not isinstance(values[f.name], bool):
            try:  # YAML 1.1 reads 3e-4 (no dot) as a string; ints are fine floats
                values[f.name] = float(values[f.name])
            except ValueError:
                raise ConfigError(f"{section}.{f.name} must be a number, got {values[f.name]!r}") from None
    check_types(cls, values, section, ConfigError)
    try:
        return cls(**values)
    except TypeError as e:
        raise ConfigError(f"{section}: {e}") from None


SECTIONS = ("model", "train", "finetune", "lora")


def _parse_override(item: str) -> tuple[str, str, object]:
    key, sep, raw = item.partition("=")
    section, dot, name = key.partition(".")
    if not sep or not dot or section not in SECTIONS:
        raise ConfigError(f"override {item!r}: expected SECTION.KEY=VALUE with SECTION one of {', '.join(SECTIONS)}")
    return section, name, yaml.safe_load(raw)


def recipe_from_dict(data: dict, overrides: list[str] = ()) -> Recipe:
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in (data or {}).items()}
    unknown = sorted(set(data) - {"name", *SECTIONS})
    if unknown:
        raise ConfigError(f"unknown top-level key(s): {', '.join(unknown)}")
    for item in overrides:
        section, name, value = _parse_override(item)
        data.setdefault(section, {})[name] = value
    return Recipe(name=str(data.get("name", "unnamed")),
                  model=_build(ModelConfig, data.get("model", {}), "model"),
                  train=_build(TrainConfig, data.get("train", {}), "train"),
                  finetune=_build(FinetuneConfig, data["finetune"], "finetune") if data.get("finetune") is not None
                  else None,
                  lora=_build(LoraConfig, data["lora"], "lora") if data.get("lora") is not None else None)


def load_recipe(path: Path, overrides: list[str] = ()) -> Recipe:
    """Read a YAML recipe (a user path, else a shipped one such as ``pretrain/tiny.yaml``) and apply
    ``section.key=value`` overrides (values parsed as YAML)."""
    from logos.util.resources import ResourceNotFound, resolve

    try:
        path = resolve(path)
    except ResourceNotFound as e:
        raise ConfigError(f"cannot read recipe {e}") from None
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read recipe {path}: {e.strerror or e}") from None
    return recipe_from_dict(data, overrides)
