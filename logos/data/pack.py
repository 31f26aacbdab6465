"""``logos pack``: tokenized JSONL -> memory-mapped token shards with a document index (read by :mod:`logos.data.shards`).

Choices:

- uint16 when the vocabulary fits (< 65536 ids), else uint32: half the bytes to read.
- **Splits never leak.** With ``val_inputs`` (``--val corpus/validation.jsonl``) the corpus splits are
  taken as given: the inputs are training data, the validation files are validation data. Without
  them, ``val_fraction`` of the *groups* of :mod:`logos.data.splits` are held out by a seeded hash of
  the group key (scaffold, reaction, source structure, or a record's own ``group``), so the
  ``--augment`` variants of a molecule and the forward and retro forms of a reaction land on one
  side, independent of file order, worker count and repacking.
- **In parts** (:func:`pack_parts`, ``logos pack --parts``): every file of a split written in parts
  (``logos corpus build --engine ray`` leaves ``splits/train/*.jsonl``) becomes its own shard
  directory, packed by a Ray task each; an index ``meta.json`` lists them and the shard reader takes
  them as one stream, so no machine ever reads the whole corpus.
- A record with ``prompt`` and ``completion`` (finetuning pairs) is tokenized as the two parts and
  its loss-from offset set to the completion's first token; a record with ``text`` counts whole.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from logos.util.records import ErrorLog, InputError, read_header, read_records
from logos.data.splits import group_key, split_of

__all__ = ["PackResult", "pack", "pack_parts"]

SPLITS = ("train", "val")
ENCODE_BATCH = 4096  # records per tokenizer call (the fast tokenizer batches in Rust)
FORMAT = "logos-shards-v2"


@dataclass
class PackResult:
    docs: dict
    tokens: dict
    errors: int
    seconds: float


class _ShardWriter:
    """The two splits' token streams and document indexes as they are written."""

    def __init__(self, out_dir: Path, dtype):
        self.out_dir, self.dtype = out_dir, dtype
        self.files = {s: open(out_dir / f"{s}.bin.tmp", "wb") for s in SPLITS}
        self.docs: dict[str, list[tuple[int, int, int]]] = {s: [] for s in SPLITS}
        self.offset = {s: 0 for s in SPLITS}
        self.domains: list[str] = []

    def add(self, split: str, domain: str, ids: list[int], loss_from: int, bos: int, eos: int) -> np.ndarray:
        if domain not in self.domains:
            self.domains.append(domain)
        arr = np.empty(len(ids) + 2, dtype=self.dtype)
        arr[0], arr[1:-1], arr[-1] = bos, ids, eos
        self.docs[split].append((self.offset[split], self.domains.index(domain), loss_from))
        self.offset[split] += len(arr)
        return arr

    def close(self, keep: bool) -> None:
        for fh in self.files.values():
            fh.close()
        for s in SPLITS:
            if keep:
                (self.out_dir / f"{s}.bin.tmp").replace(self.out_dir / f"{s}.bin")
                np.save(self.out_dir / f"{s}.docs.npy", np.asarray(self.docs[s], dtype=np.int64).reshape(-1, 3))
            else:
                (self.out_dir / f"{s}.bin.tmp").unlink(missing_ok=True)


def pack(inputs: list[Path], tokenizer_dir: Path, out_dir: Path, val_fraction: float = 0.01,
         val_inputs: list[Path] | None = None, seed: int = 0, progress: bool | None = None) -> PackResult:
    """Tokenize every record of ``inputs`` (and ``val_inputs``) with the tokenizer in ``tokenizer_dir``."""
    from logos.language.extend import grammar_tokenizer

    start = time.perf_counter()
    if not 0.0 <= val_fraction < 1.0:
        raise InputError(f"val_fraction must be in [0, 1), got {val_fraction}")
    tok = grammar_tokenizer(Path(tokenizer_dir))  # a base LLM's tokenizer gains the grammar symbols
    vocab = len(tok)
    bos, eos = tok.bos_token_id, tok.eos_token_id
    if eos is None:
        raise InputError(f"tokenizer {tokenizer_dir} has no end-of-sequence token")
    bos = eos if bos is None else bos  # GPT-style tokenizers (Qwen): one <|endoftext|> separates documents
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    writer = _ShardWriter(out_dir, np.uint16 if vocab < 2**16 else np.uint32)
    errors = ErrorLog(None)
    headers = []
    bar = tqdm(unit="rec", desc="pack", disable=None if progress is None else not progress,
               mininterval=0.5, file=sys.stderr, dynamic_ncols=True)

    def flush(batch: list[dict], fixed_split: str | None) -> None:
        prompts = [r.get("prompt") if isinstance(r.get("completion"), str) else None for r in batch]
        texts = [r["completion"] if p is not None else r["text"] for r, p in zip(batch, prompts)]
        ids = tok(texts, add_special_tokens=False)["input_ids"]
        paired = [i for i, p in enumerate(prompts) if p is not None]
        prompt_ids = tok([prompts[i] for i in paired], add_special_tokens=False)["input_ids"] if paired else []
        prefix = dict(zip(paired, prompt_ids))
        chunks = {s: [] for s in SPLITS}
        for i, rec in enumerate(batch):
            split = fixed_split or ("val" if split_of(group_key(rec), seed, val_fraction) == "validation" else "train")
            head = prefix.get(i, [])
            chunks[split].append(writer.add(split, rec.get("domain") or "unknown", head + ids[i],
                                            1 + len(head) if i in prefix else 0, bos, eos))
        for s in SPLITS:
            if chunks[s]:
                writer.files[s].write(np.concatenate(chunks[s]).tobytes())
        bar.update(len(batch))

    sources = [(Path(p), None if val_inputs is None else "train") for p in inputs]
    sources += [(Path(p), "val") for p in (val_inputs or [])]
    ok = False
    try:
        for path, fixed in sources:
            headers.append({"file": str(path), "split": fixed or "by group", "header": read_header(path)})
            batch: list[dict] = []
            for rec in read_records(path, errors):
                batch.append(rec)
                if len(batch) >= ENCODE_BATCH:
                    flush(batch, fixed)
                    batch = []
            if batch:
                flush(batch, fixed)
        ok = any(writer.docs.values())
    finally:
        bar.close()
        writer.close(keep=ok)
    if not ok:
        raise InputError(f"no records in {', '.join(str(p) for p, _ in sources)}")
    rule = ({"rule": "given: inputs are train, --val files are validation", "val": [str(p) for p in val_inputs]}
            if val_inputs is not None else
            {"rule": "seeded hash of the group key (logos.data.splits) < val_fraction -> val",
             "val_fraction": val_fraction, "seed": seed})
    meta = {
        "format": FORMAT,
        "tokenizer": str(Path(tokenizer_dir).resolve()),
        "vocab_size": vocab, "dtype": np.dtype(writer.dtype).name, "bos_id": bos, "eos_id": eos,
        "pad_id": tok.pad_token_id, "domains": writer.domains, "split": rule,
        "docs": {s: len(writer.docs[s]) for s in SPLITS}, "tokens": dict(writer.offset),
        "loss_masked_docs": {s: sum(1 for d in writer.docs[s] if d[2]) for s in SPLITS},
        "inputs": headers,
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return PackResult({s: len(writer.docs[s]) for s in SPLITS}, dict(writer.offset), errors.count,
                      time.perf_counter() - start)


def _pack_one(task: dict) -> dict:
    """One part: a shard directory of its own (train or validation records only)."""
    fixed = task["split"] == "train"
    result = pack([Path(task["input"])] if fixed else [], Path(task["tokenizer"]), Path(task["out"]),
                  val_inputs=[] if fixed else [Path(task["input"])], progress=False)
    return {"name": task["name"], "errors": result.errors}


def pack_parts(train: list[Path], val: list[Path], tokenizer_dir: Path, out_dir: Path, engine: str = "local",
               ray_address: str | None = None, cpus: int | None = None) -> PackResult:
    """Token shards in parts: each input file (``corpus/splits/train/*.jsonl`` of ``logos corpus build
    --engine ray``) packed on its own into ``out_dir/parts/NNNNNN/`` -- a Ray task each with
    ``engine="ray"`` -- then an index ``meta.json`` that :class:`logos.data.shards.ShardReader` reads as
    one corpus: the same rows as ``pack(train, val_inputs=val)`` of the concatenated files. Nothing
    here reads all the tokens on one machine; the index is built from the parts' ``meta.json``."""
    import shutil

    start = time.perf_counter()
    out_dir = Path(out_dir)
    shutil.rmtree(out_dir / "parts", ignore_errors=True)
    (out_dir / "parts").mkdir(parents=True)
    (out_dir / "meta.json").unlink(missing_ok=True)
    inputs = [(Path(p), "train") for p in train] + [(Path(p), "val") for p in val]
    inputs = [(p, s) for p, s in inputs if not p.exists() or p.stat().st_size > 0]  # a split chunk may be empty
    if not inputs:
        raise InputError("no input files to pack")
    tasks = [{"name": f"{i:06d}", "input": str(p), "split": s, "tokenizer": str(Path(tokenizer_dir).resolve()),
              "out": str(out_dir / "parts" / f"{i:06d}")} for i, (p, s) in enumerate(inputs)]
    if engine == "ray":
        from logos.data.corpus_ray import map_tasks

        done = map_tasks(_pack_one, tasks, address=ray_address, cpus=cpus)
    elif engine == "local":
        done = [_pack_one(t) for t in tasks]
    else:
        raise InputError(f"unknown engine {engine!r} (local or ray)")
    metas = [json.loads((out_dir / "parts" / t["name"] / "meta.json").read_text()) for t in tasks]
    first = metas[0]
    domains: list[str] = []
    for m in metas:
        if (m["vocab_size"], m["dtype"], m["bos_id"], m["eos_id"]) != \
                (first["vocab_size"], first["dtype"], first["bos_id"], first["eos_id"]):
            raise InputError(f"part {m} was packed with another tokenizer")
        domains += [d for d in m["domains"] if d not in domains]
    total = {key: {s: sum(m[key][s] for m in metas) for s in SPLITS} for key in ("docs", "tokens", "loss_masked_docs")}
    meta = {
        "format": FORMAT, "tokenizer": first["tokenizer"], "vocab_size": first["vocab_size"], "dtype": first["dtype"],
        "bos_id": first["bos_id"], "eos_id": first["eos_id"], "pad_id": first["pad_id"], "domains": domains,
        "split": {"rule": "given: inputs are train, --val files are validation", "val": [str(p) for p in val]},
        **total, "parts": [f"parts/{t['name']}" for t in tasks],
        "inputs": [{"file": t["input"], "split": t["split"], "part": f"parts/{t['name']}"} for t in tasks],
    }
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return PackResult(total["docs"], total["tokens"], sum(d["errors"] for d in done), time.perf_counter() - start)
