"""The shared tokenizer: SentencePiece BPE trained on grammar text, exported as a Hugging Face fast tokenizer.

Choices:

- BPE, not unigram: the HF conversion reproduces SentencePiece's ids exactly for BPE.
- Every grammar symbol (``logos.language.grammar.special_tokens()``, in id order) is a user-defined symbol,
  so it is one atomic piece that no merge crosses, and its id is fixed: ``<unk>``=0, ``<s>``=1,
  ``</s>``=2, ``<pad>``=3, then the grammar symbols in inventory order, then 256 byte-fallback
  pieces, then learned pieces. In the HF export the symbols are also registered as special added
  tokens (needed for constrained decoding); ids and vocabulary size do not change.
- Identity normalization, no dummy prefix, whitespace kept: ``decode(encode(t)) == t`` exactly.
- ``split_by_unicode_script`` and ``split_by_number`` are off so BPE may merge across letters,
  digits and brackets (``c1``, ``=O``, ``C(``), which roughly halves the tokens of a SMILES.
- Every printable ASCII character is a required piece, so proteins, crystals and other domains
  never need byte fallback for ordinary text even when the training sample lacks them.

Never call ``decode(..., skip_special_tokens=True)`` before a detokenizer: it deletes the tags.
"""

from __future__ import annotations

import json
import random
import string
import sys
import tempfile
from pathlib import Path

from logos.language.grammar import special_tokens
from logos.util.records import read_records

__all__ = ["build_tokenizer", "load_tokenizer", "SPECIALS"]

SPECIALS = {"unk": "<unk>", "bos": "<s>", "eos": "</s>", "pad": "<pad>"}
# "\u2581" is SentencePiece's space: required so spaces are one piece even when the sample has none.
_REQUIRED_CHARS = "\u2581" + "".join(c for c in string.printable if c not in " \t\n\r\x0b\x0c")


def _sample_texts(corpus: list[Path], max_sentences: int, seed: int, per_domain: int | None = None) -> list[str]:
    """A seeded reservoir sample of record texts from the corpus files.

    With ``per_domain``, one reservoir of at most that many records per domain (the record's ``domain``
    field), so a domain of a few thousand records is not drowned by one of millions; ``max_sentences``
    still caps the total (each domain's reservoir shrinks in proportion).
    """
    rng = random.Random(seed)
    samples: dict[str, list[str]] = {}
    seen: dict[str, int] = {}
    cap = max_sentences if per_domain is None else per_domain
    for path in corpus:
        for rec in read_records(path):
            key = rec.get("domain", "") if per_domain is not None else ""
            text = rec["text"].replace("\n", " ")
            seen[key] = seen.get(key, 0) + 1
            sample = samples.setdefault(key, [])
            if len(sample) < cap:
                sample.append(text)
            else:
                j = rng.randrange(seen[key])
                if j < cap:
                    sample[j] = text
    total = sum(len(v) for v in samples.values())
    if not total:
        raise ValueError(f"no records in {', '.join(map(str, corpus))}")
    if total > max_sentences:
        keep = max_sentences / total
        samples = {k: v[: max(1, int(len(v) * keep))] for k, v in samples.items()}
    return [t for k in sorted(samples) for t in samples[k]]


def build_tokenizer(corpus: list[Path], out_dir: Path, pieces: int = 512, max_sentences: int = 300_000,
                    seed: int = 0, per_domain: int | None = None, split_digits: bool = False) -> Path:
    """Train on the corpus JSONL files and write ``tokenizer.model`` + HF files into ``out_dir``.

    ``per_domain`` caps the records sampled from each domain (see :func:`_sample_texts`);
    ``split_digits`` keeps every digit a token of its own (no learned numeric pieces such as ``0.50``).
    """
    import sentencepiece as spm

    if pieces < len(_REQUIRED_CHARS) + 32:
        raise ValueError(f"pieces must be at least {len(_REQUIRED_CHARS) + 32}: the {len(_REQUIRED_CHARS)} "
                         "printable characters are pieces of their own")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = _sample_texts(corpus, max_sentences, seed, per_domain)
    symbols = list(special_tokens())
    vocab_size = len(SPECIALS) + len(symbols) + 256 + pieces
    with tempfile.TemporaryDirectory() as tmp:
        train_file = Path(tmp) / "train.txt"
        train_file.write_text("\n".join(texts) + "\n", encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(train_file), model_prefix=str(out_dir / "tokenizer"), model_type="bpe",
            vocab_size=vocab_size, hard_vocab_limit=False,
            user_defined_symbols=symbols, byte_fallback=True, character_coverage=1.0,
            required_chars=_REQUIRED_CHARS,
            normalization_rule_name="identity", add_dummy_prefix=False, remove_extra_whitespaces=False,
            split_by_unicode_script=False, split_by_number=False, split_digits=split_digits,
            max_sentence_length=1 << 16, num_threads=2, minloglevel=2,
            unk_id=0, bos_id=1, eos_id=2, pad_id=3,
            unk_piece=SPECIALS["unk"], bos_piece=SPECIALS["bos"], eos_piece=SPECIALS["eos"],
            pad_piece=SPECIALS["pad"],
        )
    (out_dir / "tokenizer.vocab").unlink(missing_ok=True)
    _export_hf(out_dir, symbols)
    info = {"grammar_symbols": len(symbols), "learned_pieces": pieces, "training_records": len(texts),
            "per_domain": per_domain, "split_digits": split_digits, "seed": seed,
            "corpus": [Path(p).name for p in corpus]}
    (out_dir / "logos_tokenizer.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"build-tokenizer: vocabulary {_vocab(out_dir)} "
          f"({len(symbols)} grammar symbols, 256 bytes) from {len(texts)} records -> {out_dir}", file=sys.stderr)
    return out_dir


def _vocab(out_dir: Path) -> int:
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(out_dir / "tokenizer.model")).get_piece_size()


def _export_hf(out_dir: Path, symbols: list[str]) -> None:
    """Convert tokenizer.model to a fast tokenizer and register grammar symbols as special tokens."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out_dir))
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in symbols], special_tokens=True)
    tok.pad_token = SPECIALS["pad"]
    tok.save_pretrained(str(out_dir))


def load_tokenizer(path: Path):
    """The HF fast tokenizer of a tokenizer or checkpoint directory (no remote code)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
