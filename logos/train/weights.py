"""The full weights of a training engine's model, for export: plain, ZeRO-3 gathered one module at a time, or LoRA merged."""

from __future__ import annotations

import torch

__all__ = ["full_state_dict"]


def full_state_dict(module, dist, dtype: torch.dtype, zero3: bool, lora: bool) -> dict | None:
    """The model's state dict in ``dtype`` on rank 0 (``None`` elsewhere); collective under ZeRO-3.

    ZeRO-3 gathers one module's own parameters at a time (never the whole model on any rank) and
    rank 0 keeps a copy of each; LoRA runs export the adapters merged (:mod:`logos.train.lora`).
    """
    if lora:
        from logos.train.lora import merged_state_dict

        return merged_state_dict(module, dtype) if dist.is_main else None
    if not zero3:
        return {k: v.detach().to(dtype, copy=True) for k, v in module.state_dict().items()} if dist.is_main else None
    import deepspeed

    out: dict[str, torch.Tensor] = {}
    for prefix, sub in module.named_modules():
        own = list(sub.named_parameters(recurse=False))
        with deepspeed.zero.GatheredParameters([p for _, p in own], modifier_rank=None):
            if dist.is_main:
                for name, p in own:
                    out[f"{prefix}.{name}" if prefix else name] = p.detach().to(dtype, copy=True)
                for name, b in sub.named_buffers(recurse=False):
                    if name not in sub._non_persistent_buffers_set:
                        out[f"{prefix}.{name}" if prefix else name] = b.detach().clone()
    return out if dist.is_main else None
