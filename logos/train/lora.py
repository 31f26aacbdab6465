"""LoRA for finetuning (``peft``): adapters on the attention and MLP projections, the grammar symbols' rows trainable.

The grammar symbols (``<MoleculeS>``, ``<sg225>``, ...) are what a task's prompt and completion are
built of, and a base model that never saw a symbol has an untrained row for it; low-rank adapters
alone cannot fix a row, so those rows are trained directly (peft's ``trainable_token_indices``: only
the listed rows get a delta, the rest of the embedding stays frozen). With tied embeddings the same
rows serve as the output projection.

Export: always one plain Hugging Face checkpoint (``hf/``) with the adapters folded into the weights
(peft's ``merge_and_unload`` on a copy of the model, so training can go on), and beside it ``adapter/``
in peft's own format for ``PeftModel.from_pretrained`` on the base checkpoint. LoRA runs at
ZeRO stages 0-2 (ZeRO-3 partitions the frozen base weights the adapters wrap; use full finetuning there).
"""

from __future__ import annotations

import copy

import torch

__all__ = ["apply_lora", "lora_for_run", "merged_state_dict", "TARGET_MODULES"]

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def apply_lora(model, rank: int, alpha: float, dropout: float, symbol_ids: list[int]):
    """``model`` wrapped by peft: adapters of ``rank`` on every projection, ``symbol_ids`` rows trainable."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=TARGET_MODULES,
                        bias="none", task_type="CAUSAL_LM",
                        trainable_token_indices={"embed_tokens": sorted(set(symbol_ids))} if symbol_ids else None)
    return get_peft_model(model, config)


def lora_for_run(model, recipe, tokenizer_dir):
    """``model`` with the recipe's ``lora`` section applied; the run's tokenizer names the symbol rows."""
    from transformers import AutoTokenizer

    from logos.language.grammar import special_tokens
    from logos.train.recipe import ConfigError

    if recipe.train.zero_stage == 3:
        raise ConfigError("LoRA runs at ZeRO stages 0-2 (use full finetuning under ZeRO-3)")
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    ids = [i for i in tok.convert_tokens_to_ids(special_tokens()) if i is not None and i != tok.unk_token_id]
    lora = recipe.lora
    return apply_lora(model, lora.rank, lora.alpha, lora.dropout, ids)


@torch.no_grad()
def merged_state_dict(module, dtype: torch.dtype) -> dict:
    """The plain model's state dict with the adapters (and trained symbol rows) folded in; ``module`` unchanged."""
    merged = copy.deepcopy(module).merge_and_unload()
    return {k: v.detach().to(dtype, copy=True) for k, v in merged.state_dict().items()}
