"""The model factory: a transformers decoder from a recipe, or a base LLM extended with the grammar.

Models are plain Hugging Face classes (``LlamaForCausalLM``, ``Qwen3ForCausalLM``) and know nothing
of DeepSpeed. Under ZeRO-3 they are *built partitioned*: a ``HfDeepSpeedConfig`` is alive while the
model is constructed (``from_config``, or ``from_pretrained`` for ``--init-from``), so transformers
constructs it under ``deepspeed.zero.Init`` and no rank ever holds the full fp32 model; it is unset
right after, so later models in the same process are built normally.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from logos.train.recipe import ConfigError, Recipe, padded_vocab

__all__ = ["build_model", "load_base", "vocab_of", "describe", "zero3_construction"]


@contextlib.contextmanager
def zero3_construction(config: dict | None):
    """While active, transformers builds models partitioned under ZeRO-3 (no-op for other stages)."""
    if not config or config.get("zero_optimization", {}).get("stage") != 3:
        yield
        return
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    keep_alive = HfDeepSpeedConfig(config)  # transformers holds only a weak reference
    try:
        yield
    finally:
        unset_hf_deepspeed_config()
        del keep_alive


def build_model(recipe: Recipe, vocab: int, bos: int, eos: int, pad: int | None, ds_config: dict | None = None):
    """A freshly initialised decoder of the recipe's shape (seeded by ``train.seed``)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(recipe.train.seed)
    cfg = recipe.model.hf_config(padded_vocab(vocab), bos, eos, pad)
    with zero3_construction(ds_config):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    if recipe.train.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model


def load_base(recipe: Recipe, base: Path, shard_vocab: int, ds_config: dict | None = None):
    """Continued pretraining: (model, tokenizer) of a base LLM with the grammar added (:mod:`logos.language.extend`).

    Its tokenizer with the grammar must be the one the shards were packed with.
    """
    from logos.language.extend import load_extended

    torch.manual_seed(recipe.train.seed)
    with zero3_construction(ds_config):
        model, tokenizer = load_extended(Path(base))
    if len(tokenizer) != shard_vocab:
        raise ConfigError(f"the shards in {recipe.train.data} hold {shard_vocab} token ids but {base}'s tokenizer "
                          f"with the grammar has {len(tokenizer)}: pack the corpus with `logos pack --tokenizer {base}`")
    if recipe.train.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return model, tokenizer


def vocab_of(recipe: Recipe) -> tuple[int, str]:
    """The vocabulary size a recipe trains with, and where it was read (shards, else the tokenizer)."""
    from logos.util.resources import ResourceNotFound, resolve

    data = Path(recipe.train.data)
    if (data / "meta.json").exists():
        return int(json.loads((data / "meta.json").read_text())["vocab_size"]), str(data)
    try:
        tok = resolve(recipe.train.tokenizer)
    except ResourceNotFound:
        tok = None
    if tok is not None and (tok / "tokenizer.json").exists():
        from transformers import AutoTokenizer

        return len(AutoTokenizer.from_pretrained(str(tok))), str(tok)
    return 2394, "the default tokenizer's size (neither data nor tokenizer found)"


def describe(recipe: Recipe) -> str:
    """Resolved config and parameter count (``--dry-run``), the model built on the meta device: the recipe's shape,
    or with ``train.init_from`` the base checkpoint's with the grammar symbols added; with a ``lora`` section also
    the parameters that train."""
    import warnings

    import yaml
    from transformers import AutoModelForCausalLM

    from logos.train.engine import ds_config

    if recipe.train.init_from:
        from transformers import AutoConfig

        from logos.language.extend import PAD_MULTIPLE, grammar_tokenizer

        base = Path(recipe.train.init_from)
        if not (base / "config.json").exists():
            raise ConfigError(f"train.init_from: {base} is not a Hugging Face checkpoint directory (no config.json)")
        tokenizer = grammar_tokenizer(base)
        vocab, source = len(tokenizer), f"{base} with the grammar symbols"
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(base), trust_remote_code=False))
        model.resize_token_embeddings(vocab, pad_to_multiple_of=PAD_MULTIPLE, mean_resizing=False)
    else:
        vocab, source = vocab_of(recipe)
        tokenizer = None
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(recipe.model.hf_config(padded_vocab(vocab)))
    n = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight.numel()
    lines = [yaml.safe_dump(recipe.to_dict(), sort_keys=False).rstrip(),
             f"# vocabulary: {vocab} from {source}, padded to {padded_vocab(vocab)}",
             f"# architecture: {type(model).__name__}",
             f"# parameters: {n:,} ({n / 1e6:.2f}M; {n - emb:,} without the embedding)"]
    if recipe.lora is not None:
        from logos.language.grammar import special_tokens
        from logos.train.lora import apply_lora

        if tokenizer is None:
            from transformers import AutoTokenizer

            from logos.util.resources import ResourceNotFound, resolve

            try:
                tokenizer = AutoTokenizer.from_pretrained(str(resolve(recipe.train.tokenizer)))
            except ResourceNotFound:
                tokenizer = None
        ids = [] if tokenizer is None else [i for i in tokenizer.convert_tokens_to_ids(special_tokens())
                                            if i is not None and i != tokenizer.unk_token_id]
        with warnings.catch_warnings():  # peft asks a deprecated transformers property
            warnings.simplefilter("ignore", FutureWarning)
            wrapped = apply_lora(model, recipe.lora.rank, recipe.lora.alpha, recipe.lora.dropout, ids)
        trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        lines.append(f"# trainable with LoRA rank {recipe.lora.rank}: {trainable:,} ({trainable / 1e6:.2f}M: the "
                     f"adapters and {len(set(ids))} grammar-symbol rows)")
    lines.append(f"# deepspeed (1 process on this machine): {json.dumps(ds_config(recipe, 1))}")
    return "\n".join(lines)
