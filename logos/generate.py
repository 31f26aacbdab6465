"""``logos generate``: batched sampling from an exported checkpoint, detokenized into files, with a report.

Tasks:

- ``molecule``: prompt ``<s><MoleculeS>``; each sample stops at ``<MoleculeE>``.
- ``reaction``: retrosynthesis; for each product in ``--input`` the prompt is
  ``<s><MoleculeS>product<MoleculeE><ReverseReact>`` and the sample stops at ``</s>``.

Sampling runs through transformers ``generate`` (KV cache, temperature / top-k / top-p, one seed
per run). Two logits processors shape it:

- :class:`GrammarMask` (default; ``--unconstrained`` turns it off): one llguidance matcher per row,
  driven by ``grammar/logos.lark`` with the start rule set to the task (``molecule`` or
  ``reaction``), so every sample parses as SMILES syntax (balanced branches, valid atoms/bonds).
  Chemistry (valence, ring-closure pairing, aromaticity) is not in the grammar: RDKit still
  rejects some samples, and they are counted, never written.
- :class:`TaskMask`: bans the padded vocabulary rows, ``<s>``/``<pad>``/``<unk>``, byte-fallback
  tokens (every printable ASCII character has its own piece, so SMILES never needs them) and every
  grammar symbol the task cannot use; after a length budget only the closing token remains (a weak
  model rarely closes a span by itself). With the grammar on, the budget ends ``GRAMMAR_SLACK``
  tokens early and yields to the grammar when closing is not yet legal.

Generated texts go through the domain writers (``.smi``/``.sdf`` for molecules, ``.rsmi`` for
reactions; chosen by the output suffix). The report gives validity (RDKit parses the text),
uniqueness (distinct canonical SMILES among the valid ones) and, with ``--reference``, novelty
(valid unique molecules absent from the reference set).
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from logos.records import ErrorLog, InputError, RecordError, errors_path_for

__all__ = ["GenerateResult", "generate", "load_checkpoint", "TaskMask", "molecule_metrics"]

GRAMMAR_SLACK = 8  # constrained: the budget closes this many tokens early, so open branches can still close
BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@dataclass
class GenerateResult:
    samples: int
    valid: int
    unique: int
    novel: int | None
    seconds: float
    tokens: int
    texts: list[str] = field(default_factory=list, repr=False)

    @property
    def validity(self) -> float:
        return self.valid / self.samples if self.samples else 0.0

    @property
    def uniqueness(self) -> float:
        return self.unique / self.valid if self.valid else 0.0

    @property
    def novelty(self) -> float | None:
        return None if self.novel is None else (self.novel / self.unique if self.unique else 0.0)

    def summary(self) -> str:
        parts = [f"{self.samples} samples", f"valid {self.valid} ({self.validity:.1%})",
                 f"unique {self.unique} ({self.uniqueness:.1%} of valid)"]
        if self.novel is not None:
            parts.append(f"novel {self.novel} ({self.novelty:.1%} of unique)")
        parts.append(f"{self.samples / max(self.seconds, 1e-9):.1f} samples/s, "
                     f"{self.tokens / max(self.seconds, 1e-9):,.0f} tokens/s")
        return "; ".join(parts)


def load_checkpoint(path: Path, device: str = "cpu"):
    """(model, tokenizer) from an exported checkpoint directory: plain transformers, safetensors only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise InputError(f"{path} is not a checkpoint directory (no config.json)")
    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, use_safetensors=True)
    return model.to(device).eval(), tok


class GrammarMask:
    """A ``LogitsProcessor``: one llguidance matcher per row over ``grammar/logos.lark`` (start rule per task).

    Each call first feeds every row's newest token to its matcher, then masks the logits to the tokens
    the grammar allows next (intersected with the task mask when that leaves anything). Rows whose
    matcher has stopped (the span is closed) or failed may only write ``close``. Masks are applied with
    ``masked_fill`` (llguidance's torch helper is ``torch.compile``d: 17 s on its first CPU call and a
    recompile per shape).
    """

    def __init__(self, tokenizer, vocab_rows: int, start_rule: str, prompts: list[list[int]], close_id: int,
                 prompt_len: int, task_mask: "TaskMask"):
        try:
            import llguidance
        except ImportError:
            raise InputError("grammar-constrained sampling needs llguidance (pip install 'logos[decode]'); "
                             "or pass --unconstrained") from None

        from logos.grammar import grammar_text

        text = re.sub(r"(?m)^start:.*$", f"start: {start_rule}", grammar_text())
        lltok = _lltokenizer(tokenizer, vocab_rows)
        self.matchers = []
        for ids in prompts:  # prompt tokens after <s>
            m = llguidance.LLMatcher(lltok, text, log_level=0)
            m.consume_tokens(ids)
            if m.is_error():
                raise InputError(f"prompt does not parse under the {start_rule!r} grammar: {m.get_error()}")
            self.matchers.append(m)
        self.vocab_rows = vocab_rows
        self.close_id = close_id
        self.prompt_len = prompt_len
        self.task_mask = task_mask
        self.words = (vocab_rows + 31) // 32
        self._bits = torch.arange(32, dtype=torch.int32)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        from llguidance.numpy import fill_next_token_bitmask
        import numpy as np

        B = input_ids.shape[0]
        fresh = input_ids.shape[1] > self.prompt_len
        bitmask = np.zeros((B, self.words), dtype=np.int32)
        for i, m in enumerate(self.matchers):
            if fresh and not m.is_stopped() and not m.is_error():
                m.consume_token(int(input_ids[i, -1]))
            if m.is_stopped() or m.is_error():
                bitmask[i, self.close_id // 32] = np.int32(np.uint32(1 << (self.close_id % 32)).view(np.int32))
            else:
                fill_next_token_bitmask(m, bitmask, i)
                if m.is_accepting():
                    bitmask[i, self.close_id // 32] |= np.int32(np.uint32(1 << (self.close_id % 32)).view(np.int32))
        words = torch.from_numpy(bitmask)                                              # [B, W] int32
        allowed = ((words[:, :, None] >> self._bits) & 1).flatten(1)[:, : scores.shape[1]].bool()  # [B, V]
        masked = self.task_mask(input_ids, scores)
        both = allowed & torch.isfinite(masked)
        ok = both.any(dim=1, keepdim=True)
        keep = torch.where(ok, both, allowed)
        return scores.masked_fill(~keep, float("-inf"))


_LLTOK: dict = {}


def _lltokenizer(tokenizer, vocab_rows: int):
    import llguidance.hf

    key = (id(tokenizer), vocab_rows)
    if key not in _LLTOK:
        _LLTOK.clear()
        _LLTOK[key] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_rows)
    return _LLTOK[key]


class TaskMask:
    """A ``LogitsProcessor``: bans tokens the task never writes; past the length budget only ``close`` remains."""

    def __init__(self, tokenizer, vocab_rows: int, allowed_symbols: set[str], close_id: int, prompt_len: int,
                 budget: int):
        from logos.grammar import special_tokens

        tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        banned = torch.zeros(vocab_rows, dtype=torch.bool)
        banned[len(tokenizer):] = True
        # grammar symbols and the tokenizer's own specials (<s>, <|endoftext|>, ...) unless the task writes them
        symbols = set(special_tokens()) | set(tokenizer.all_special_tokens)
        for i, t in enumerate(tokens):
            if (t in symbols and t not in allowed_symbols and i != close_id) or BYTE_TOKEN.fullmatch(t or ""):
                banned[i] = True
        self.banned = banned
        self.close_id = close_id
        self.prompt_len = prompt_len
        self.budget = budget

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.masked_fill(self.banned.to(scores.device), float("-inf"))
        if input_ids.shape[1] - self.prompt_len >= self.budget - 1:
            keep = torch.full_like(scores, float("-inf"))
            keep[:, self.close_id] = 0.0
            scores = scores + keep
        return scores


def _read_smiles(path: Path) -> list[str]:
    from logos.records import open_text

    out = []
    with open_text(path) as fh:
        for line in fh:
            fields = line.split()
            if fields and fields[0].lower() not in ("smiles", "smi"):
                out.append(fields[0])
    return out


def canonical_set(smiles: list[str]) -> set[str]:
    from logos.chem import canonical_smiles, parse_smiles

    out = set()
    for s in smiles:
        try:
            out.add(canonical_smiles(parse_smiles(s)))
        except RecordError:
            continue
    return out


def molecule_metrics(texts: list[str], reference: set[str] | None = None) -> tuple[list[str | None], int, int | None]:
    """Canonical SMILES (None when invalid) of each molecule text, number unique, number novel."""
    from logos.chem import canonical_smiles, molecules_in_text, parse_smiles

    canon: list[str | None] = []
    for text in texts:
        try:
            mols = molecules_in_text(text)
            canon.append(canonical_smiles(parse_smiles(mols[0])) if len(mols) == 1 else None)
        except RecordError:
            canon.append(None)
    unique = {c for c in canon if c is not None}
    novel = None if reference is None else len(unique - reference)
    return canon, len(unique), novel


def _document_start(checkpoint: Path, tok) -> int:
    """The token that starts every training document: the shards' recorded one, else BOS, else EOS (Qwen)."""
    from logos.export import load_run_info

    recorded = (load_run_info(checkpoint).get("shards") or {}).get("bos_id")
    if recorded is not None:
        return int(recorded)
    return tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id


def _prompts(task: str, inputs: list[str] | None, n: int) -> list[tuple[str, str]]:
    """(id, prompt text without <s>) pairs."""
    from logos.domains import molecule, reaction

    if task == "molecule":
        return [(f"gen-{i + 1}", molecule.OPEN) for i in range(n)]
    prompts = []
    for k, smi in enumerate(inputs or []):
        try:
            canon = molecule.canonical_smiles(molecule.parse_smiles(smi))
        except RecordError as e:
            print(f"input {k + 1}: {e}", file=sys.stderr)
            continue
        for j in range(n):
            prompts.append((f"product-{k + 1}" + (f"-{j + 1}" if n > 1 else ""), molecule.span(canon) + reaction.RETRO))
    return prompts


def generate(checkpoint: Path, out: Path, task: str = "molecule", n: int = 100, batch_size: int = 50,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, max_new_tokens: int = 96, seed: int = 0,
             inputs: Path | None = None, reference: Path | None = None, progress: bool | None = None,
             constrained: bool = True, writer_options=None) -> GenerateResult:
    """Sample ``n`` molecules (or ``n`` reactant sets per product) and write them to ``out`` by suffix."""
    from logos.domains import molecule, reaction, writer_for
    from logos.grammar import special_tokens

    start = time.perf_counter()
    out = Path(out)
    writer_cls = writer_for(out)
    if task == "reaction" and inputs is None:
        raise InputError("--task reaction needs --input products.smi")
    model, tok = load_checkpoint(checkpoint)
    prompts = _prompts(task, _read_smiles(inputs) if inputs else None, n)
    if not prompts:
        raise InputError("nothing to generate (no valid input products)")
    if task == "molecule":
        allowed, close = {molecule.CLOSE}, tok.convert_tokens_to_ids(molecule.CLOSE)
    else:
        allowed, close = {molecule.OPEN, molecule.CLOSE, reaction.REAGENT}, tok.eos_token_id
    start_id, pad_id = _document_start(checkpoint, tok), tok.pad_token_id
    pad_id = pad_id if pad_id is not None else tok.eos_token_id  # Llama-3: no pad token (left padding is masked)
    extra_specials = [t for t in tok.all_special_tokens if t not in set(special_tokens())]
    vocab_rows = model.get_output_embeddings().weight.shape[0]
    torch.manual_seed(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = writer_cls(out, writer_options)
    errors = ErrorLog(errors_path_for(out), echo=lambda line: None)
    texts: list[str] = []
    written: list[str] = []  # texts the writer accepted (RDKit parsed every molecule)
    n_tokens = 0
    bar = tqdm(total=len(prompts), unit="sample", desc=f"generate {task}", file=sys.stderr, dynamic_ncols=True,
               disable=None if progress is None else not progress, mininterval=0.5)
    try:
        for b in range(0, len(prompts), batch_size):
            chunk = prompts[b:b + batch_size]
            ids = [[start_id] + tok(p, add_special_tokens=False)["input_ids"] for _, p in chunk]
            width = max(map(len, ids))
            input_ids = torch.tensor([[pad_id] * (width - len(x)) + x for x in ids])  # left padding
            attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            mask = TaskMask(tok, vocab_rows, allowed, close, width,
                            max(2, max_new_tokens - GRAMMAR_SLACK) if constrained else max_new_tokens)
            if constrained:
                mask = GrammarMask(tok, vocab_rows, task, [x[1:] for x in ids], close, width, mask)
            with torch.no_grad():
                gen = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True,
                                     temperature=temperature, top_k=top_k, top_p=top_p,
                                     max_new_tokens=max_new_tokens, eos_token_id=[close],
                                     pad_token_id=pad_id, logits_processor=[mask], use_cache=True)
            for (ident, prompt), row in zip(chunk, gen[:, width:].tolist()):
                if close in row:
                    row = row[: row.index(close) + 1]
                n_tokens += len(row)
                body = tok.decode(row, skip_special_tokens=False)  # never skip: tags are content
                text = prompt + body
                for special in extra_specials:  # </s>, <|endoftext|>, padding: not grammar text
                    text = text.replace(special, "")
                texts.append(text)
                try:
                    writer.write({"text": text, "id": ident, "source": f"generate:{ident}"})
                    written.append(text)
                except RecordError as e:
                    errors.add(ident, f"{e} | {text}")
            bar.update(len(chunk))
            bar.set_postfix(samples_s=f"{bar.n / (time.perf_counter() - start):.1f}", refresh=False)
    finally:
        bar.close()
        writer.close()
        errors.close()
    seconds = time.perf_counter() - start
    if task == "molecule":
        ref = canonical_set(_read_smiles(reference)) if reference else None
        canon, unique, novel = molecule_metrics(texts, ref)
        valid = sum(c is not None for c in canon)
    else:
        valid = len(written)
        unique = len(set(written))
        novel = None
    return GenerateResult(len(texts), valid, unique, novel, seconds, n_tokens, texts)
