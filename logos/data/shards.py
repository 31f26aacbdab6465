"""Token shards: the memory-mapped reader of ``logos pack`` output, the domain mixture, and the training batch.

Layout of a shard directory (little-endian, written by :mod:`logos.data.pack`)::

    meta.json          tokenizer, vocabulary size, dtype, domains, split rule, counts
    train.bin          every training document as <s> ids </s>, concatenated (uint16 or uint32)
    train.docs.npy     int64 [n_docs, 3]: start offset in train.bin, domain index, loss-from offset
    val.bin, val.docs.npy   the same for the validation split

or, written in parts (``logos pack --parts``, one task per part, no pass over the whole corpus on one
machine): ``meta.json`` with a ``parts`` list naming sub-directories of the layout above; the
reader takes them, in that order, as one stream (same rows as one shard of the concatenated inputs).

The *loss-from offset* of a document is the offset (from its ``<s>``) of its first token that
counts in the loss: 0 for pretraining text (every token, as before), ``1 + len(prompt)`` for a
prompt/completion pair, so the loss covers exactly the completion and its ``</s>``. Finetuning is
therefore a data change, not a second trainer. (Shards of format v1 have two index columns and no
masked tokens.)

Training reads fixed-length rows of ``seq_len + 1`` tokens from the concatenated stream (packing:
no padding, documents separated by ``</s><s>``). :class:`ShardReader` draws rows from a seeded
permutation per epoch, so the data position of a run is one integer (rows consumed) and a resumed
run sees exactly the batches it would have seen. ``.npy`` index files are loaded with
``allow_pickle=False``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from logos.util.records import InputError

__all__ = ["Batch", "ShardReader", "MixtureReader", "load_meta"]


@dataclass
class Batch:
    """Rows of packed tokens: inputs are ``tokens[:, :-1]``, targets ``tokens[:, 1:]``."""

    tokens: np.ndarray     # int64 [n, L+1]
    domains: np.ndarray    # int64 [n, L]  domain index of each target token
    loss_mask: np.ndarray  # bool  [n, L]  True where the target token counts in the loss

    def __len__(self) -> int:
        return len(self.tokens)


def load_meta(shard_dir: Path) -> dict:
    path = Path(shard_dir) / "meta.json"
    if not path.exists():
        raise InputError(f"{shard_dir} is not a shard directory (no meta.json); run `logos pack` first")
    return json.loads(path.read_text())


class _Concat:
    """Several memory-mapped token files read as one stream (``stream[idx]`` for an integer index array)."""

    def __init__(self, arrays: list[np.ndarray], dtype):
        self.arrays, self.dtype = arrays, np.dtype(dtype)
        self.starts = np.cumsum([0] + [len(a) for a in arrays])  # [parts + 1]

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx)
        part = np.searchsorted(self.starts, idx, side="right") - 1
        out = np.empty(idx.shape, dtype=self.dtype)
        for k in np.unique(part):
            where = part == k
            out[where] = self.arrays[k][idx[where] - self.starts[k]]
        return out


def _parts_stream(shard_dir: Path, meta: dict, split: str) -> tuple[_Concat, np.ndarray]:
    """The token stream and document index of ``split`` over every part, in part order.

    Each part is a shard directory of its own (:func:`logos.data.pack.pack_parts`); its domain indexes
    are mapped to the index's domain list and its document offsets moved by the tokens before it,
    so the parts read exactly like one shard written from the concatenated inputs.
    """
    arrays, docs, offset = [], [], 0
    for name in meta["parts"]:
        part = load_meta(shard_dir / name)
        n = part["tokens"][split]
        if not n:
            continue
        arrays.append(np.memmap(shard_dir / name / f"{split}.bin", dtype=meta["dtype"], mode="r", shape=(n,)))
        d = np.load(shard_dir / name / f"{split}.docs.npy", allow_pickle=False).copy()
        remap = np.array([meta["domains"].index(x) for x in part["domains"]], dtype=np.int64)
        d[:, 0] += offset
        d[:, 1] = remap[d[:, 1]]
        docs.append(d)
        offset += n
    return _Concat(arrays, meta["dtype"]), (np.concatenate(docs) if docs else np.zeros((0, 3), dtype=np.int64))


class ShardReader:
    """Rows of ``seq_len + 1`` tokens from one split, in a seeded order per epoch; memory-mapped.

    ``batch(position, n)`` returns rows ``position .. position+n-1`` of the infinite row sequence
    (epoch ``e`` = a permutation seeded by ``(seed, e)``) as a :class:`Batch`.
    """

    def __init__(self, shard_dir: Path, split: str, seq_len: int, seed: int = 0):
        self.meta = load_meta(shard_dir)
        self.seq_len = seq_len
        self.seed = seed
        self.domains: list[str] = self.meta["domains"]
        n = self.meta["tokens"][split]
        if "parts" in self.meta:  # written in parts (logos pack --parts): one stream over all of them
            self.tokens, docs = _parts_stream(Path(shard_dir), self.meta, split)
        else:
            self.tokens = np.memmap(Path(shard_dir) / f"{split}.bin", dtype=self.meta["dtype"], mode="r",
                                    shape=(n,)) if n else np.zeros(0, dtype=self.meta["dtype"])
            docs = np.load(Path(shard_dir) / f"{split}.docs.npy", allow_pickle=False)
        self.doc_starts, self.doc_domains = docs[:, 0], docs[:, 1]
        self.doc_loss_from = docs[:, 2] if docs.shape[1] > 2 else np.zeros(len(docs), dtype=np.int64)
        self.rows = max(0, (n - 1) // seq_len)  # row i covers tokens[i*L : i*L + L + 1]
        if self.rows == 0:
            raise InputError(f"split {split!r} of {shard_dir} holds {n} tokens: fewer than one row of {seq_len + 1}")
        self._perm_epoch = -1
        self._perm = np.arange(self.rows)

    def _order(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.rows)
            self._perm_epoch = epoch
        return self._perm

    def row_ids(self, position: int, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        for k in range(n):
            epoch, i = divmod(position + k, self.rows)
            out[k] = self._order(epoch)[i]
        return out

    def batch(self, position: int, n: int) -> Batch:
        return self.rows_at(self.row_ids(position, n))

    def rows_at(self, rows) -> Batch:
        """The given rows: tokens, the domain of each target token and the loss mask."""
        L = self.seq_len
        idx = (np.asarray(rows, dtype=np.int64) * L)[:, None] + np.arange(L + 1)[None, :]  # [n, L+1]
        doc = np.searchsorted(self.doc_starts, idx[:, 1:], side="right") - 1             # [n, L]
        mask = idx[:, 1:] - self.doc_starts[doc] >= self.doc_loss_from[doc]               # [n, L]
        return Batch(self.tokens[idx].astype(np.int64), self.doc_domains[doc], mask)


class MixtureReader:
    """Training rows drawn from each domain in exactly the recipe's proportions (``train.mixture``).

    A row belongs to the domain of most of its target tokens. Positions are laid out in blocks of
    ``BLOCK``: each domain gets round(BLOCK * weight) positions per block (largest remainder, so the
    block is full), spread evenly by smooth weighted round-robin; so any prefix of the row stream
    holds each domain's share to within one row per domain and block. Position ``p`` maps in O(1) to
    the k-th row of its domain, and a domain's rows are read in a seeded order per pass over them
    (rare domains repeat, common ones are subsampled). Same interface as :class:`ShardReader`.
    """

    BLOCK = 1000

    def __init__(self, reader: ShardReader, weights: dict[str, float]):
        self.reader, self.seq_len, self.seed = reader, reader.seq_len, reader.seed
        unknown = sorted(set(weights) - set(reader.domains))
        if unknown:
            raise InputError(f"train.mixture names domains {unknown} that the shards do not hold "
                             f"(they hold {reader.domains})")
        row_domain = self._row_domains()
        self.names = [d for d in reader.domains if weights.get(d, 0) > 0]
        self.rows_of = [np.flatnonzero(row_domain == reader.domains.index(d)) for d in self.names]
        empty = [d for d, rows in zip(self.names, self.rows_of) if not len(rows)]
        if empty:
            raise InputError(f"train.mixture gives weight to {empty}, but no training row is mostly of that domain")
        w = np.array([weights[d] for d in self.names], dtype=np.float64)
        w /= w.sum()
        counts = np.floor(w * self.BLOCK).astype(np.int64)
        for i in np.argsort(-(w * self.BLOCK - counts), kind="stable")[: self.BLOCK - counts.sum()]:
            counts[i] += 1
        self.counts = counts
        self.schedule = self._round_robin(counts)                       # [BLOCK] domain slot per position
        onehot = self.schedule[:, None] == np.arange(len(counts))[None, :]
        self.before = np.cumsum(onehot, axis=0) - onehot               # [BLOCK, D] occurrences before i
        self._perms: dict[tuple[int, int], np.ndarray] = {}
        self.rows = reader.rows

    def _row_domains(self) -> np.ndarray:
        r = self.reader
        out = np.empty(r.rows, dtype=np.int64)
        for start in range(0, r.rows, 8192):
            rows = np.arange(start, min(r.rows, start + 8192))
            dom = r.rows_at(rows).domains                               # [n, L]
            out[start:start + len(rows)] = np.apply_along_axis(
                lambda x: np.bincount(x, minlength=len(r.domains)).argmax(), 1, dom)
        return out

    @staticmethod
    def _round_robin(counts: np.ndarray) -> np.ndarray:
        current = np.zeros(len(counts), dtype=np.int64)
        total = int(counts.sum())
        out = np.empty(total, dtype=np.int64)
        for i in range(total):
            current += counts
            j = int(np.argmax(current))
            current[j] -= total
            out[i] = j
        return out

    def _perm(self, d: int, epoch: int) -> np.ndarray:
        key = (d, epoch)
        if key not in self._perms:
            if len(self._perms) > 64:
                self._perms.clear()
            self._perms[key] = np.random.default_rng([self.seed, 7919, d, epoch]).permutation(len(self.rows_of[d]))
        return self._perms[key]

    def domain_of(self, position: int) -> str:
        return self.names[self.schedule[position % self.BLOCK]]

    def row_ids(self, position: int, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.int64)
        for k in range(n):
            block, i = divmod(position + k, self.BLOCK)
            d = int(self.schedule[i])
            occurrence = block * int(self.counts[d]) + int(self.before[i, d])
            epoch, j = divmod(occurrence, len(self.rows_of[d]))
            out[k] = self.rows_of[d][self._perm(d, epoch)[j]]
        return out

    def batch(self, position: int, n: int) -> Batch:
        return self.reader.rows_at(self.row_ids(position, n))

    def rows_at(self, rows) -> Batch:
        return self.reader.rows_at(rows)
