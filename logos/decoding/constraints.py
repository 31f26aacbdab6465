"""Decoding constraints: the grammar (llguidance, one matcher per row) and the token table the row constraints read.

Two layers, combined at every step by the sampler:

- :class:`GrammarRows` masks the logits to what the formal grammar allows next (``grammar/logos.lark``
  plus the task's own rules: a start rule, the amino-acid alphabet, a copied sequence). One matcher
  is compiled per task and *deep-copied* per row, so a large grammar (all 230 space groups) is
  compiled once. Masks are built as llguidance bitmasks in numpy, unpacked on the logits' device and
  applied with ``masked_fill`` (llguidance's torch helper is ``torch.compile``d: 17 s on its first
  CPU call).
- the row constraints of :mod:`logos.decoding.rows` (chemistry of molecule spans, a crystal's
  composition, a copied sequence) accept or refuse one candidate token at a time.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import torch

from logos.util.records import InputError

__all__ = ["TokenTable", "GrammarRows", "task_grammar", "worker"]

BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class TokenTable:
    """Per-token facts of a tokenizer: its text, which ids are specials, byte pieces or padding rows."""

    def __init__(self, tokenizer, vocab_rows: int):
        from logos.language.grammar import special_tokens

        self.size, self.rows = len(tokenizer), vocab_rows
        pieces = tokenizer.convert_ids_to_tokens(list(range(self.size)))
        self.text = [tokenizer.convert_tokens_to_string([p]) if p is not None else "" for p in pieces]
        self.symbols = set(special_tokens())
        self.specials = set(tokenizer.all_special_tokens) | self.symbols
        self.id = {p: i for i, p in enumerate(pieces) if p in self.specials}
        self.bytes = [i for i, p in enumerate(pieces) if p and BYTE_TOKEN.fullmatch(p)]
        self.pieces = pieces

    def banned(self, allowed_symbols: set[str], keep: set[int]) -> torch.Tensor:
        """bool [rows]: padding rows, byte pieces, and every special/grammar symbol the task never writes."""
        out = torch.zeros(self.rows, dtype=torch.bool)
        out[self.size:] = True
        out[self.bytes] = True
        for piece, i in self.id.items():
            if piece not in allowed_symbols and i not in keep:
                out[i] = True
        return out


_LLTOK: dict = {}
_COMPILED: dict = {}


def _lltokenizer(tokenizer, vocab_rows: int):
    """llguidance's view of ``tokenizer`` (cached for the tokenizer object itself, not its ``id``: a freed
    tokenizer's id is reused by the next one, which must not inherit its token table)."""
    import llguidance.hf

    cached = _LLTOK.get("entry")
    if cached is None or cached[0] is not tokenizer or cached[1] != vocab_rows:
        _COMPILED.clear()  # compiled grammars belong to the old token table
        _LLTOK["entry"] = (tokenizer, vocab_rows, llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_rows))
    return _LLTOK["entry"][2]


def task_grammar(start: str, extra_rules: str = "") -> str:
    """The shipped grammar with ``start`` as its start rule and the task's extra rules appended."""
    from logos.language.grammar import grammar_text

    return re.sub(r"(?m)^start:.*$", f"start: {start}", grammar_text()) + "\n" + extra_rules + "\n"


@functools.lru_cache(maxsize=1)
def worker():
    """The one thread that computes prefetched grammar masks."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(1, thread_name_prefix="logos-grammar")


class GrammarRows:
    """One llguidance matcher per row; :meth:`mask` gives the bool mask of tokens each row may write next."""

    def __init__(self, tokenizer, vocab_rows: int, grammars: list[str], prompts: list[list[int]], stop_id: int,
                 device: torch.device):
        try:
            import llguidance
        except ImportError:
            raise InputError("grammar-constrained sampling needs llguidance (pip install 'logos[decode]'); "
                             "or pass --unconstrained") from None
        lltok = _lltokenizer(tokenizer, vocab_rows)
        self.matchers = []
        for grammar, ids in zip(grammars, prompts):
            key = (id(lltok), grammar)
            if key not in _COMPILED:  # one compile per grammar text; rows get deep copies
                if len(_COMPILED) > 32:
                    _COMPILED.clear()
                base = llguidance.LLMatcher(lltok, grammar, log_level=0)
                if base.is_error():
                    raise InputError(f"task grammar does not compile: {base.get_error()}")
                _COMPILED[key] = base
            m = _COMPILED[key].deep_copy()
            m.consume_tokens(ids)
            if m.is_error():
                raise InputError(f"prompt does not parse under the task grammar: {m.get_error()}")
            self.matchers.append(m)
        self.stop_id, self.rows, self.device = stop_id, vocab_rows, device
        self.words = (vocab_rows + 31) // 32
        self._pending = None  # (active rows, future) of a prefetched mask
        self._consumed = [[] for _ in self.matchers]  # per row: whether each token advance gave it was consumed
        self._bits = torch.arange(32, dtype=torch.int32, device=device)

    def prefetch(self, active: list[bool]) -> None:
        """Start computing :meth:`mask` for ``active`` in a worker thread (llguidance releases the GIL), so it
        overlaps the model's forward pass, which it does not depend on; the next :meth:`mask` call with the same
        ``active`` takes the result. No matcher may advance in between."""
        self._pending = (list(active), worker().submit(self._mask, list(active)))

    def mask(self, active: list[bool]) -> torch.Tensor:
        """bool [B, V]: allowed tokens per row; a finished (or failed) row may only write the stop token."""
        pending, self._pending = self._pending, None
        if pending is not None:
            result = pending[1].result()
            if pending[0] == list(active):
                return result
        return self._mask(active)

    def _mask(self, active: list[bool]) -> torch.Tensor:
        from llguidance.numpy import fill_next_token_bitmask

        bitmask = np.zeros((len(self.matchers), self.words), dtype=np.int32)
        stop_word, stop_bit = divmod(self.stop_id, 32)
        for i, m in enumerate(self.matchers):
            if not active[i] or m.is_stopped() or m.is_error():
                bitmask[i, stop_word] = np.uint32(1 << stop_bit).view(np.int32)
                continue
            fill_next_token_bitmask(m, bitmask, i)
            if m.is_accepting():
                bitmask[i, stop_word] |= np.uint32(1 << stop_bit).view(np.int32)
        words = torch.from_numpy(bitmask).to(self.device)                                # [B, W]
        return ((words[:, :, None] >> self._bits) & 1).flatten(1)[:, : self.rows].bool()  # [B, V]

    def rollback(self, row: int) -> None:
        """Take back the last token :meth:`advance` gave ``row``."""
        m = self.matchers[row]
        if self._consumed[row].pop():  # (a token the matcher did not consume has nothing to roll back)
            m.rollback(1)
        if m.is_error():
            raise RuntimeError(f"grammar rollback failed: {m.get_error()}")

    def advance(self, row: int, token: int) -> None:
        m = self.matchers[row]
        consumed = token != self.stop_id and not m.is_stopped() and not m.is_error()
        if consumed:
            m.consume_token(token)
        self._consumed[row].append(consumed)

