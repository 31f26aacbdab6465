"""``logos plan``: parameters, memory per GPU and per node for each ZeRO stage, and tokens per step.

The model is built on the ``meta`` device (no memory) from the recipe's transformers config, so the
parameter count and the largest layer are exact. Memory for model states (weights, gradients,
optimizer) comes from DeepSpeed's own estimators: ``estimate_zero2_model_states_mem_needs`` and
``estimate_zero3_model_states_mem_needs`` (bf16 weights, fp32 master copy and Adam moments). DeepSpeed
ships no estimator for stages 0 and 1; those rows use the same accounting (2 bytes of 16-bit
weights + 18 bytes of gradients, fp32 weights and Adam states per parameter, optimizer states split
across GPUs for stage 1). Activations are not included: they depend on micro-batch, sequence and
gradient checkpointing, and are reported separately as an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ModelSize", "model_size", "zero_memory", "plan_rows", "activation_bytes", "format_plan"]

GiB = 1024**3


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


def activation_bytes(hf_config, micro_batch: int, seq_len: int, checkpointing: bool) -> int:
    """Rough bf16 activation memory per GPU (Korthikanti et al. 2022 without sequence parallelism)."""
    h, layers = hf_config.hidden_size, hf_config.num_hidden_layers
    per_layer = seq_len * micro_batch * h * 34  # attention + MLP activations, flash attention (no s^2 term)
    if checkpointing:
        return int(layers * seq_len * micro_batch * h * 2 + per_layer)
    return int(layers * per_layer)


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
