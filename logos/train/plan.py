"""``logos plan``: parameters, memory per GPU and per node for each ZeRO stage, and tokens per step; on CPU, resident
memory per process.

The model is built on the ``meta`` device (no memory) from the recipe's transformers config, so the
parameter count and the largest layer are exact. Memory for model states (weights, gradients,
optimizer) comes from DeepSpeed's own estimators: ``estimate_zero2_model_states_mem_needs`` and
``estimate_zero3_model_states_mem_needs`` (bf16 weights, fp32 master copy and Adam moments). DeepSpeed
ships no estimator for stages 0 and 1; those rows use the same accounting (2 bytes of 16-bit
weights + 18 bytes of gradients, fp32 weights and Adam states per parameter, optimizer states split
across GPUs for stage 1). Activations are not included: they depend on micro-batch, sequence and
gradient checkpointing, and are reported separately as an estimate.

On CPU (``--device cpu``) there is no DeepSpeed estimator to call: :func:`cpu_memory` adds up what one
training process of this trainer holds at its peak, term by term, as DeepSpeed 0.19 with a torch AdamW
allocates it (``logos.train.engine``):

- **fixed**: interpreter, torch, transformers, DeepSpeed, the gloo group, the tokenizer and the model's
  Python objects (``PROCESS_BYTES``, measured);
- **model states** per parameter: weights, gradients and the two AdamW moments, in fp32 (or, for
  ``bf16``, DeepSpeed's bf16 weights and gradients plus an fp32 master copy), partitioned by the stage:
  ZeRO-3 splits all of them (its fp32 master partition is the weight partition itself), ZeRO-1/2 keep
  the full weights and split the master copy and moments (ZeRO-1 the gradients too only after reducing);
- **working set** of the backward pass under ZeRO-3: parameters gathered for the layers in flight (at
  most ``stage3_max_live_parameters`` + ``stage3_prefetch_bucket_size``), the reduce bucket and the
  largest layer's full gradient; without ZeRO-3 the largest layer's gradient only;
- **heap slack**: glibc serves blocks under its mmap threshold (at most 32 MiB) from heaps it keeps after
  they are freed, and the blocks of one step do not fit the holes another left: after a few steps the
  peak stood about twice the working set above the live tensors (94M and 277M parameters, 2 ranks,
  ``benchmarks/scale_check.py``; an estimate from those runs, not a bound);
- **activations** (:func:`activation_bytes` at the run's element size);
- on rank 0 at a save, the export: a copy of the whole model in the export dtype plus one safetensors
  shard being serialized.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ModelSize", "model_size", "zero_memory", "plan_rows", "activation_bytes", "format_plan", "cpu_memory",
           "CpuPlan", "format_cpu_plan", "PROCESS_BYTES"]

GiB = 1024**3
# A training process before its model states: interpreter, torch, transformers, DeepSpeed, the gloo group (0.25 GiB
# after imports and joining the group), then the tokenizer and the model's Python objects. Measured at 94M and
# 277M parameters under ZeRO-3 (resident set after building the model, less its parameter partition): 0.42-0.44 GiB.
PROCESS_BYTES = int(0.43 * GiB)
GLIBC_MMAP_THRESHOLD_MAX = 32 * 1024**2  # blocks above this are mmapped and go back to the system when freed


@dataclass
class ModelSize:
    total_params: int
    largest_layer_params: int


def model_size(hf_config) -> ModelSize:
    """Exact parameter count and largest single module's own parameters (meta device: no memory)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    total = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    return ModelSize(total, largest)


def zero_memory(size: ModelSize, stage: int, gpus_per_node: int, nodes: int, offload: bool = False) -> tuple[int, int]:
    """(bytes per GPU, bytes of CPU memory per node) for the model states at one ZeRO stage."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    n = size.total_params
    gpus = gpus_per_node * nodes
    if stage == 3:
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(n, size.largest_layer_params, gpus_per_node, nodes,
                                                            cpu_offload=offload, cpu_offload_params=offload)
        return gpu, cpu
    if stage == 2:
        cpu, gpu = estimate_zero2_model_states_mem_needs(n, gpus_per_node, nodes, cpu_offload=offload)
        return gpu, cpu
    # Stages 0 and 1, same accounting as DeepSpeed's stage-2 estimator (no offload for these stages).
    per_param_replicated = 2 + 18 if stage == 0 else 2 + 6
    partitioned = 0 if stage == 0 else 12 * n / gpus
    cpu = n * 4 * gpus_per_node * 1.5
    return int(per_param_replicated * n + partitioned), int(cpu)


def plan_rows(size: ModelSize, gpus_per_node: int, nodes: int, offload: bool = False) -> list[dict]:
    rows = []
    for stage in (0, 1, 2, 3):
        gpu, cpu = zero_memory(size, stage, gpus_per_node, nodes, offload and stage >= 2)
        rows.append({"stage": stage, "gpu_bytes": gpu, "node_gpu_bytes": gpu * gpus_per_node, "node_cpu_bytes": cpu,
                     "offload": offload and stage >= 2})
    return rows


def activation_bytes(hf_config, micro_batch: int, seq_len: int, checkpointing: bool, element_bytes: int = 2) -> int:
    """Rough activation memory per process (Korthikanti et al. 2022 without sequence parallelism) plus the logits.

    Per layer 34 bytes per token and hidden unit in 16-bit (17 values; flash attention, no s^2 term), scaled to
    ``element_bytes``; with checkpointing every layer's input plus one layer recomputed. The trainer's loss
    takes fp32 logits: logits, log-softmax and their gradient, 3 x 4 bytes per token and vocabulary entry.
    """
    h, layers = hf_config.hidden_size, hf_config.num_hidden_layers
    tokens = seq_len * micro_batch
    per_layer = tokens * h * 17 * element_bytes  # attention + MLP activations
    logits = tokens * hf_config.vocab_size * 4 * 3
    if checkpointing:
        return int(layers * tokens * h * element_bytes + per_layer + logits)
    return int(layers * per_layer + logits)


@dataclass
class CpuPlan:
    """Resident bytes of one training process on CPU, term by term (see the module docstring)."""

    terms: dict[str, int]      # name -> bytes at the training peak of every process
    save_terms: dict[str, int]  # name -> extra bytes on rank 0 while it writes the export at a save
    processes: int
    stage: int
    precision: str

    @property
    def peak(self) -> int:
        return sum(self.terms.values())

    @property
    def rank0_peak(self) -> int:
        """Rank 0's peak: the training peak, or at a save its model states plus the export, whichever is larger
        (the working set, slack and activations are gone between steps)."""
        states = sum(v for k, v in self.terms.items() if k in ("fixed", "weights", "gradients", "optimizer"))
        return max(self.peak, states + sum(self.save_terms.values()))

    @property
    def node(self) -> int:
        return self.rank0_peak + (self.processes - 1) * self.peak


def cpu_memory(size: ModelSize, hf_config, stage: int, processes: int, precision: str, micro_batch: int,
               seq_len: int, checkpointing: bool, zero: dict | None = None, export_dtype: str = "float32",
               shard_size: int = 10**9) -> CpuPlan:
    """Peak resident memory of one training process on CPU (see the module docstring); ``zero``: the run's
    ``zero_optimization`` (``logos.train.engine.ds_config``)."""
    zero = zero or {}
    n, w = size.total_params, max(1, processes)
    bf16 = precision == "bf16"               # DeepSpeed's bf16 mode: 16-bit weights and gradients, fp32 master
    weight, grad = (2, 2) if bf16 else (4, 4)
    master = 4 if bf16 else 0                # fp32 weights are their own master copy (stage 3: see engine.py)
    adam = 8
    if stage == 3:
        per_param = {"weights": (weight + master) * n / w, "gradients": grad * n / w, "optimizer": adam * n / w}
        live = zero.get("stage3_max_live_parameters", 1e9) + zero.get("stage3_prefetch_bucket_size", 5e7)
        working = weight * min(n, live) + grad * (zero.get("reduce_bucket_size", 5e8) + size.largest_layer_params)
    elif stage in (1, 2):
        per_param = {"weights": weight * n + master * n / w, "optimizer": adam * n / w,
                     "gradients": grad * n if stage == 1 else grad * n / w}
        if not bf16:
            per_param["weights"] += 4 * n / w  # ZeRO-1/2 clone the fp32 partition as the master copy
        working = grad * size.largest_layer_params
    else:
        per_param = {"weights": (weight + master) * n, "gradients": grad * n + (4 * n if bf16 else 0),
                     "optimizer": adam * n}
        working = grad * size.largest_layer_params
    element = 4 if precision == "fp32" else 2
    terms = {"fixed": PROCESS_BYTES, **{k: int(v) for k, v in per_param.items()}, "working set": int(working),
             "heap slack": int(2 * working),
             "activations": activation_bytes(hf_config, micro_batch, seq_len, checkpointing, element)}
    export_bytes = (2 if export_dtype == "bfloat16" else 4) * n
    save = {"export copy": export_bytes, "shard being written": min(export_bytes, shard_size)}
    return CpuPlan(terms, save, w, stage, precision)


def format_cpu_plan(name: str, size: ModelSize, plan: CpuPlan, tokens_per_step: int) -> str:
    lines = [f"plan: {name} on CPU, {plan.processes} process(es), ZeRO-{plan.stage}, {plan.precision}",
             f"  parameters: {size.total_params:,} ({size.total_params / 1e9:.2f} B); "
             f"largest layer: {size.largest_layer_params:,}",
             f"  tokens/step: {tokens_per_step:,}",
             "  | resident memory per process | GiB |", "  |---|---:|"]
    lines += [f"  | {k} | {v / GiB:.2f} |" for k, v in plan.terms.items()]
    lines.append(f"  | **peak per process** | **{plan.peak / GiB:.2f}** |")
    lines += [f"  | rank 0 at a save: model states + {k} | {v / GiB:.2f} |" for k, v in plan.save_terms.items()]
    lines.append(f"  | **rank 0 peak** | **{plan.rank0_peak / GiB:.2f}** |")
    lines.append(f"  | **node (all processes)** | **{plan.node / GiB:.2f}** |")
    return "\n".join(lines)


def format_plan(name: str, size: ModelSize, rows: list[dict], tokens_per_step: int, activations: int,
                gpus_per_node: int, nodes: int) -> str:
    lines = [f"plan: {name} on {nodes} node(s) x {gpus_per_node} GPU(s)",
             f"  parameters: {size.total_params:,} ({size.total_params / 1e9:.2f} B); "
             f"largest layer: {size.largest_layer_params:,}",
             f"  tokens/step: {tokens_per_step:,}",
             f"  activations per GPU (estimate, bf16): {activations / GiB:.1f} GiB",
             "  | ZeRO stage | model states per GPU | per node (GPU) | CPU per node | source |",
             "  |---:|---:|---:|---:|---|"]
    for r in rows:
        src = "DeepSpeed estimator" if r["stage"] >= 2 else "same accounting (no DS estimator)"
        off = " +offload" if r["offload"] else ""
        lines.append(f"  | {r['stage']}{off} | {r['gpu_bytes'] / GiB:.1f} GiB | {r['node_gpu_bytes'] / GiB:.1f} GiB | "
                     f"{r['node_cpu_bytes'] / GiB:.1f} GiB | {src} |")
    return "\n".join(lines)
