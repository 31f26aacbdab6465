"""Continued pretraining from a base LLM: add the grammar symbols to its tokenizer and resize its model.

Used by ``logos pretrain --init-from HF_DIR``. The base tokenizer is kept as it is, and every
grammar symbol (``logos.language.grammar.special_tokens()``, in inventory order) that it does not already
hold is added as a special token (``normalized=False``): base text tokenizes exactly as before,
and each symbol is one id. Embeddings and an untied output head are resized (padded to a multiple
of 64) and the new rows initialised.

Initialisation: each new row is the **mean of the rows of the symbol's sub-tokens under the base
tokenizer** (``<MoleculeS>`` starts as the average of ``<``, ``Molecule``, ``S``, ``>``), in the
input embeddings and, when untied, in the output head. Against the usual alternative, the mean of
all rows, this keeps the 1,622 symbols distinct from step 0 (``<sg12>`` and ``<sg225>`` differ, as
do ``<a3>`` and ``<c+3>``) instead of starting them identical, while keeping each new row inside
the distribution of trained rows, so the first logits for the new tokens are of ordinary size.
Padding rows beyond the tokenizer get the mean of all base rows.
"""

from __future__ import annotations

from pathlib import Path

import torch

from logos.language.grammar import special_tokens

__all__ = ["extend_tokenizer", "extend_model", "load_extended", "grammar_tokenizer"]

PAD_MULTIPLE = 64


def extend_tokenizer(tokenizer) -> dict[int, list[int]]:
    """Add the grammar symbols to ``tokenizer`` in place; returns {new id: base sub-token ids}."""
    from tokenizers import AddedToken

    vocab = tokenizer.get_vocab()
    missing = [t for t in special_tokens() if t not in vocab]
    pieces = {t: tokenizer.encode(t, add_special_tokens=False) for t in missing}
    tokenizer.add_tokens([AddedToken(t, special=True, normalized=False) for t in missing], special_tokens=True)
    return {tokenizer.convert_tokens_to_ids(t): pieces[t] for t in missing}


@torch.no_grad()
def extend_model(model, tokenizer, new_rows: dict[int, list[int]]) -> None:
    """Resize ``model`` to the extended tokenizer and initialise the new rows (see module doc)."""
    old_in = model.get_input_embeddings().weight.detach().clone()
    out_layer = model.get_output_embeddings()
    tied = out_layer is None or out_layer.weight is model.get_input_embeddings().weight
    old_out = None if tied else out_layer.weight.detach().clone()
    n_old = old_in.shape[0]
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=PAD_MULTIPLE, mean_resizing=False)
    emb = model.get_input_embeddings().weight
    emb[n_old:] = old_in.mean(0)
    for new_id, sub_ids in new_rows.items():
        ids = [i for i in sub_ids if i < n_old] or list(range(n_old))
        emb[new_id] = old_in[ids].mean(0)
    if not tied:
        head = model.get_output_embeddings().weight
        head[n_old:] = old_out.mean(0)
        for new_id, sub_ids in new_rows.items():
            ids = [i for i in sub_ids if i < n_old] or list(range(n_old))
            head[new_id] = old_out[ids].mean(0)
    model.config.vocab_size = emb.shape[0]


def load_extended(base_dir: Path, dtype=torch.float32):
    """(model, tokenizer) of a local Llama/Qwen3 checkpoint directory with the grammar added."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_dir = Path(base_dir)
    if not (base_dir / "config.json").exists():
        raise FileNotFoundError(f"{base_dir}: not a Hugging Face checkpoint directory (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir), trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=dtype, trust_remote_code=False,
                                                 use_safetensors=True)
    new_rows = extend_tokenizer(tokenizer)
    extend_model(model, tokenizer, new_rows)
    return model, tokenizer


def grammar_tokenizer(path: Path):
    """The tokenizer of a LOGOS tokenizer dir, or of a base LLM dir with the grammar symbols added.

    ``logos pack --tokenizer BASE_DIR`` and ``logos pretrain --init-from BASE_DIR`` both go through
    :func:`extend_tokenizer`, which is deterministic, so shard ids and model rows agree.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    extend_tokenizer(tokenizer)  # a no-op for a LOGOS tokenizer (every symbol is already there)
    return tokenizer
