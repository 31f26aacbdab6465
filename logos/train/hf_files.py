"""Checkpoint files every Hugging Face reader loads as they are: transformers 4 and 5, vLLM.

transformers 5 writes two things older readers do not know:

- ``config.json`` holds the rotary base only inside ``rope_parameters``; transformers 4 and vLLM
  builds that pin it read ``rope_theta`` (and ``rope_scaling``) at the top level;
- ``tokenizer_config.json`` names the class ``TokenizersBackend`` (new in 5) and lists
  ``extra_special_tokens`` as a list, where transformers 4 expects ``PreTrainedTokenizerFast`` and a
  name -> token mapping there (a list breaks its loader).

:func:`make_portable` adds the old keys beside the new ones (``rope_theta`` next to
``rope_parameters``, ``torch_dtype`` next to ``dtype``) and names ``PreTrainedTokenizerFast``, the
class both major versions load from ``tokenizer.json``; the extra special tokens move to
``additional_special_tokens``, which both read. The weights and ``tokenizer.json`` are untouched, so the
tokenization is the same token for token.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["make_portable"]

FAST_CLASS = "PreTrainedTokenizerFast"


def _rewrite(path: Path, change) -> bool:
    if not path.exists():
        return False
    data = json.loads(path.read_text())
    new = change(json.loads(json.dumps(data)))
    if new == data:
        return False
    path.write_text(json.dumps(new, indent=2, sort_keys=True) + "\n")
    return True


def _config(cfg: dict) -> dict:
    rope = cfg.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        cfg.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default" and "rope_scaling" not in cfg:
            cfg["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    if "dtype" in cfg:
        cfg.setdefault("torch_dtype", cfg["dtype"])
    return cfg


def _tokenizer_config(cfg: dict) -> dict:
    if cfg.get("tokenizer_class") in ("TokenizersBackend", None):
        cfg["tokenizer_class"] = FAST_CLASS
    extra = cfg.get("extra_special_tokens")
    if isinstance(extra, list):
        del cfg["extra_special_tokens"]
        named = {cfg.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        rest = [t for t in extra if t not in named]
        if rest:
            known = cfg.get("additional_special_tokens") or []
            cfg["additional_special_tokens"] = known + [t for t in rest if t not in known]
    cfg.pop("backend", None)  # transformers 5 bookkeeping; 4 passes unknown keys to the tokenizer
    cfg.pop("is_local", None)
    return cfg


def make_portable(checkpoint: Path) -> list[str]:
    """Rewrite ``checkpoint``'s config and tokenizer config in place (see the module docstring); names changed."""
    checkpoint = Path(checkpoint)
    changed = []
    if _rewrite(checkpoint / "config.json", _config):
        changed.append("config.json")
    if _rewrite(checkpoint / "tokenizer_config.json", _tokenizer_config):
        changed.append("tokenizer_config.json")
    return changed
