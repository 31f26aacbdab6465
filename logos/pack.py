"""``logos pack``: tokenized JSONL -> memory-mapped token shards with a document index, and their reader.

Layout of a shard directory (all little-endian, all written by this module)::

    meta.json          tokenizer, vocabulary size, dtype, domains, split rule, counts
    train.bin          every training document as <s> ids </s>, concatenated (uint16 or uint32)
    train.docs.npy     int64 [n_docs, 2]: start offset of each document in train.bin, domain index
    val.bin, val.docs.npy   the same for the validation split

Choices:

- uint16 when the vocabulary fits (< 65536 ids), else uint32: half the bytes to read.
- The train/validation split is a pure function of each record's text (CRC32 of the text against
  ``val_fraction``), so it is deterministic, independent of file order and worker count, and the
  same molecule never lands on both sides, however many times the corpus is repacked.
- Training reads fixed-length rows of ``seq_len + 1`` tokens from the concatenated stream (packing:
  no padding, documents separated by ``</s><s>``). :class:`ShardReader` draws rows from a seeded
  permutation per epoch, so the data position of a run is one integer (rows consumed) and a
  resumed run sees exactly the batches it would have seen. ``.npy`` index files are loaded with
  ``allow_pickle=False``.
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from logos.records import ErrorLog, InputError, read_header, read_records

__all__ = ["PackResult", "pack", "ShardReader", "load_meta"]

SPLITS = ("train", "val")
ENCODE_BATCH = 4096  # records per tokenizer call (the fast tokenizer batches in Rust)


@dataclass
class PackResult:
    docs: dict
    tokens: dict
    errors: int
    seconds: float


def _is_val(text: str, val_fraction: float) -> bool:
    return zlib.crc32(text.encode("utf-8")) < val_fraction * 2**32


def pack(inputs: list[Path], tokenizer_dir: Path, out_dir: Path, val_fraction: float = 0.01,
         progress: bool | None = None) -> PackResult:
    """Tokenize every record of ``inputs`` with the tokenizer in ``tokenizer_dir`` into ``out_dir``."""
    from logos.extend import grammar_tokenizer

    start = time.perf_counter()
    if not 0.0 <= val_fraction < 1.0:
        raise InputError(f"val_fraction must be in [0, 1), got {val_fraction}")
    tok = grammar_tokenizer(Path(tokenizer_dir))  # a base LLM's tokenizer gains the grammar symbols
    vocab = len(tok)
    dtype = np.uint16 if vocab < 2**16 else np.uint32
    bos, eos = tok.bos_token_id, tok.eos_token_id
    if eos is None:
        raise InputError(f"tokenizer {tokenizer_dir} has no end-of-sequence token")
    bos = eos if bos is None else bos  # GPT-style tokenizers: one <|endoftext|> separates documents
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {s: open(out_dir / f"{s}.bin.tmp", "wb") for s in SPLITS}
    docs: dict[str, list[tuple[int, int]]] = {s: [] for s in SPLITS}
    offset = {s: 0 for s in SPLITS}
    domains: list[str] = []
    errors = ErrorLog(None)
    headers = []
    bar = tqdm(unit="rec", desc="pack", disable=None if progress is None else not progress,
               mininterval=0.5, file=sys.stderr, dynamic_ncols=True)

    def flush(batch: list[dict]) -> None:
        ids = tok([r["text"] for r in batch], add_special_tokens=False)["input_ids"]
        chunks = {s: [] for s in SPLITS}
        for rec, seq in zip(batch, ids):
            split = "val" if _is_val(rec["text"], val_fraction) else "train"
            domain = rec.get("domain") or "unknown"
            if domain not in domains:
                domains.append(domain)
            arr = np.empty(len(seq) + 2, dtype=dtype)
            arr[0], arr[1:-1], arr[-1] = bos, seq, eos
            docs[split].append((offset[split], domains.index(domain)))
            offset[split] += len(arr)
            chunks[split].append(arr)
        for s in SPLITS:
            if chunks[s]:
                files[s].write(np.concatenate(chunks[s]).tobytes())
        bar.update(len(batch))

    try:
        for path in inputs:
            path = Path(path)
            headers.append({"file": str(path), "header": read_header(path)})
            batch: list[dict] = []
            for rec in read_records(path, errors):
                batch.append(rec)
                if len(batch) >= ENCODE_BATCH:
                    flush(batch)
                    batch = []
            if batch:
                flush(batch)
    finally:
        bar.close()
        for fh in files.values():
            fh.close()
    if not any(docs.values()):
        raise InputError(f"no records in {', '.join(map(str, inputs))}")
    for s in SPLITS:
        (out_dir / f"{s}.bin.tmp").replace(out_dir / f"{s}.bin")
        np.save(out_dir / f"{s}.docs.npy", np.asarray(docs[s], dtype=np.int64).reshape(-1, 2))
    meta = {
        "format": "logos-shards-v1",
        "tokenizer": str(Path(tokenizer_dir).resolve()),
        "vocab_size": vocab, "dtype": np.dtype(dtype).name, "bos_id": bos, "eos_id": eos, "pad_id": tok.pad_token_id,
        "domains": domains,
        "split": {"rule": "crc32(text) < val_fraction * 2**32 -> val", "val_fraction": val_fraction},
        "docs": {s: len(docs[s]) for s in SPLITS}, "tokens": dict(offset),
        "inputs": headers,
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return PackResult({s: len(docs[s]) for s in SPLITS}, dict(offset), errors.count, time.perf_counter() - start)


def load_meta(shard_dir: Path) -> dict:
    path = Path(shard_dir) / "meta.json"
    if not path.exists():
        raise InputError(f"{shard_dir} is not a shard directory (no meta.json); run `logos pack` first")
    return json.loads(path.read_text())


class ShardReader:
    """Rows of ``seq_len + 1`` tokens from one split, in a seeded order per epoch; memory-mapped.

    ``batch(position, n)`` returns rows ``position .. position+n-1`` of the infinite row sequence
    (epoch ``e`` = a permutation seeded by ``(seed, e)``), as ``int64`` arrays ``tokens [n, L+1]``
    and ``domains [n, L]`` (the domain index of each target token). With ``rank``/``world`` each
    process reads its own interleaved slice of every global batch.
    """

    def __init__(self, shard_dir: Path, split: str, seq_len: int, seed: int = 0):
        self.meta = load_meta(shard_dir)
        self.seq_len = seq_len
        self.seed = seed
        self.domains: list[str] = self.meta["domains"]
        n = self.meta["tokens"][split]
        self.tokens = np.memmap(Path(shard_dir) / f"{split}.bin", dtype=self.meta["dtype"], mode="r", shape=(n,)) \
            if n else np.zeros(0, dtype=self.meta["dtype"])
        docs = np.load(Path(shard_dir) / f"{split}.docs.npy", allow_pickle=False)
        self.doc_starts, self.doc_domains = docs[:, 0], docs[:, 1]
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

    def batch(self, position: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.rows_at(self.row_ids(position, n))

    def rows_at(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Tokens ``[n, L+1]`` and the domain index of each target token ``[n, L]`` of the given rows."""
        L = self.seq_len
        idx = (np.asarray(rows, dtype=np.int64) * L)[:, None] + np.arange(L + 1)[None, :]  # [n, L+1]
        doc = np.searchsorted(self.doc_starts, idx[:, 1:], side="right") - 1             # [n, L]
        return self.tokens[idx].astype(np.int64), self.doc_domains[doc]


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
            _, dom = r.rows_at(rows)                                    # [n, L]
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

    def batch(self, position: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        return self.reader.rows_at(self.row_ids(position, n))

    def rows_at(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.reader.rows_at(rows)
