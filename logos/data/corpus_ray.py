"""Ray Data engine of ``logos corpus build --engine ray``: the corpus pipeline on one machine or a Ray cluster, same records as the local engine.

The stages are the functions of :mod:`logos.data.corpus` (``read_chunks``, ``encode_chunk``,
``dedup_key``, ``split_for``, ``record_line``); this module only lays them out as Ray Data pipelines:

1. **parts**: ``from_items(groups of input files) -> flat_map(read) -> map(encode)``. A read task
   reads up to ``FILES_PER_TASK`` input files (a single big file is one sequential pass, a few
   microseconds per record) and streams chunks of about ``CHUNK_COST`` work items; each encode task
   (1 CPU) encodes one chunk and writes it to ``parts/NAME/GGGGGG-CCCCCC.jsonl``, named by the
   chunk's place in the global order (file group, chunk) and renamed into place atomically.
2. **split**: ``map_batches(dedup key per record) -> groupby(key).aggregate(count, min position)``
   finds, for each text seen more than once, the position of its first occurrence; ``map(split)``
   then keeps a record only at that position, assigns its split by the seeded group-key hash,
   counts its tokens and writes ``splits/SPLIT/OOOOOOOO.jsonl`` per part chunk. The driver
   concatenates those files in chunk order into ``SPLIT.jsonl`` (a byte copy, no parsing): the
   same records in the same order as the local engine's single pass. ``splits/`` stays, so
   ``logos pack --parts`` can pack each chunk on its own (:mod:`logos.data.pack`).

Choices:

- **Isolation, two layers.** Inside a task the chunk runs through :func:`logos.util.isolate.imap_isolated`
  (one forked process, the per-record time limit): a record that segfaults RDKit or gemmi is one
  rejection, as in ``logos tokenize``. Ray's retries alone would not do: the same record would kill
  every retry and then fail the whole dataset. A Ray worker that is lost (killed, out of memory,
  node gone) is re-run by Ray (Ray Data's default ``max_retries=-1`` for system failures); because every output file is named by its chunk
  and replaced atomically, a re-run overwrites its own file and nothing is written twice.
- **Order.** ``preserve_order`` is on and every file name carries its position, so the result does
  not depend on which worker finished first, the number of CPUs or nodes.
- **Deduplication** is a distributed aggregation (no set of every text on one machine); only the
  keys seen more than once travel back to the driver and out to the split tasks.
- **Cluster.** ``--ray-address`` connects to a running cluster (``ray start --head`` ...); every
  node needs ``logos[ray]`` (same version) and sees the input files and ``-o DIR`` at the same
  paths (a shared filesystem). Without an address Ray starts locally with no setup.
"""

from __future__ import annotations

import importlib
import json
import logging
import pickle  # only for rows this driver builds and Ray carries in memory; never read from a file
import shutil
import time
from pathlib import Path

from logos.data.corpus import (CHUNK_COST, SPLITS, CorpusConfig, Source, SourcePlan, add_stats, dedup_key, encode_chunk,
                          errors_path, merge_stats, read_chunks, record_line, split_for, stats_tokenizer,
                          token_counts, write_marker, directory_digest, tokenizer_dir)
from logos.util.files import atomic_open
from logos.util.records import ErrorLog, safe_name

__all__ = ["RayEngine", "EngineUnavailable", "map_tasks"]

FILES_PER_TASK = 16  # input files per read task
POSITION_BITS = 24   # a record's global position: chunk ordinal << 24 | index in the chunk


class EngineUnavailable(RuntimeError):
    """The engine cannot run here (Ray not installed); the message is one line for the user."""


def _atomic_write(path: Path, lines: list[str]) -> None:
    with atomic_open(path, "w", encoding="utf-8") as fh:
        fh.writelines(lines)


# ---------------------------------------------------------------- stage functions run in Ray tasks
def _read_group(row: dict):
    spec = pickle.loads(row["spec"])
    for c, chunk in enumerate(read_chunks(spec["files"], spec["domain"], spec["options"], spec["limits"],
                                          spec["chunk_cost"])):
        yield {"plan": spec["plan"], "key": f"{spec['group']:06d}-{c:06d}", "spec": row["spec"],
               "items": pickle.dumps(chunk)}


def _encode(row: dict) -> dict:
    start = time.perf_counter()
    spec = pickle.loads(row["spec"])
    lines, bad = encode_chunk(pickle.loads(row["items"]), spec["options"], spec["limits"])
    _atomic_write(Path(spec["part"]) / f"{row['key']}.jsonl", lines)
    return {"plan": row["plan"], "key": row["key"], "records": len(lines), "errors": json.dumps(bad),
            "seconds": time.perf_counter() - start}


def _hash_chunk(batch: dict) -> dict:
    import numpy as np

    keys, positions = [], []
    for ordinal, path in zip(batch["ordinal"], batch["path"]):
        with open(path, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                keys.append(dedup_key(json.loads(line)["text"]))
                positions.append((int(ordinal) << POSITION_BITS) | i)
    return {"key": np.array(keys, dtype=object), "pos": np.array(positions, dtype=np.int64)}


def _split_chunk(row: dict, firsts: dict, config: CorpusConfig, splits_dir: str, tokenizer_digest: str) -> dict:
    tokenizer = stats_tokenizer(config.tokenizer, tokenizer_digest)
    ordinal = int(row["ordinal"])
    kept: dict[str, list[dict]] = {s: [] for s in SPLITS}
    order: list[tuple[str, dict]] = []
    duplicates = 0
    with open(row["path"], encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            rec = json.loads(line)
            first = firsts.get(dedup_key(rec["text"]))
            if first is not None and first != (ordinal << POSITION_BITS) | i:
                duplicates += 1
                continue
            split = split_for(rec, config)
            kept[split].append(rec)
            order.append((split, rec))
    stats: dict = {}
    for (split, rec), n in zip(order, token_counts(tokenizer, [r["text"] for _, r in order])):
        add_stats(stats, rec.get("domain", "unknown"), split, 1, n)
    for split, recs in kept.items():
        if recs:
            _atomic_write(Path(splits_dir) / split / f"{ordinal:08d}.jsonl", [record_line(r) for r in recs])
    return {"ordinal": ordinal, "stats": json.dumps(stats), "duplicates": duplicates}


# ---------------------------------------------------------------- the engine (driver side)
class RayEngine:
    """``--engine ray``: Ray's local mode without ``address``, else the cluster at ``address``."""

    name = "ray"

    def __init__(self, address: str | None = None, cpus: int | None = None, chunk_cost: int = CHUNK_COST,
                 files_per_task: int = FILES_PER_TASK):
        try:
            importlib.import_module("ray.data")
        except ImportError:
            raise EngineUnavailable("--engine ray needs Ray: install logos[ray] (pip install 'logos[ray]')") from None
        self.address, self.cpus = address, cpus
        self.chunk_cost, self.files_per_task = chunk_cost, files_per_task

    def _data_context(self, one_block_per_row: bool):
        import ray
        from ray.data import DataContext
        from ray.data.context import ShuffleStrategy

        if not ray.is_initialized():
            ray.init(address=self.address, num_cpus=None if self.address else self.cpus, include_dashboard=False,
                     logging_level=logging.ERROR, log_to_driver=False)
        logging.getLogger("ray.data").setLevel(logging.ERROR)  # no per-dataset INFO lines among the corpus lines
        ctx = DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
        # One chunk per block, so every chunk is its own encode task (Ray would otherwise pack the
        # chunks that one read task streams into 128 MiB blocks, one task each).
        ctx.target_max_block_size = 1 if one_block_per_row else 128 * 1024 * 1024
        # Sort-based shuffle for the deduplication: plain tasks, no aggregator actors to start (the
        # hash shuffle's actors cost ~10 s of start-up on a small machine).
        ctx.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
        return ctx

    def part_path(self, out_dir: Path, source: Source) -> Path:
        return Path(out_dir) / "parts" / safe_name(source.name)

    def build_parts(self, plans: list[SourcePlan], config: CorpusConfig, out_dir: Path, echo) -> None:
        import ray.data

        limits = config.record_limits()
        rows = []
        for k, plan in enumerate(plans):
            part = self.part_path(out_dir, plan.source)
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir(parents=True)
            step = self.files_per_task
            for g in range(0, len(plan.inputs), step):
                rows.append({"spec": pickle.dumps({
                    "plan": k, "group": g // step, "files": plan.inputs[g:g + step], "domain": plan.domain,
                    "options": plan.options, "limits": limits, "chunk_cost": self.chunk_cost, "part": str(part)})})
        logs = [ErrorLog(errors_path(out_dir, plan.source), echo=echo) for plan in plans]
        records, seconds = [0] * len(plans), [0.0] * len(plans)
        start = time.perf_counter()
        try:
            if rows:
                self._data_context(one_block_per_row=True)
                ds = ray.data.from_items(rows, override_num_blocks=len(rows))
                ds = ds.flat_map(_read_group, num_cpus=0.5)
                ds = ds.map(_encode, num_cpus=1)
                for row in ds.iter_rows():
                    k = int(row["plan"])
                    records[k] += int(row["records"])
                    seconds[k] += float(row["seconds"])
                    for where, reason in json.loads(row["errors"]):
                        logs[k].add(where, reason)
        finally:
            for log in logs:
                log.close()
        wall = time.perf_counter() - start
        echo(f"corpus: ray: {len(plans)} source(s) encoded in {wall:.0f} s "
             f"({sum(seconds):.0f} task-seconds; per-source times below are task-seconds)")
        for k, plan in enumerate(plans):
            write_marker(plan, out_dir, self.name, records[k], logs[k].count, seconds[k], echo)

    def split(self, parts: list[Path], config: CorpusConfig, out_dir: Path, echo) -> dict:
        import ray.data
        from ray.data.aggregate import Count, Min
        from ray.data.expressions import col

        chunks = [p for part in parts for p in sorted(part.glob("*.jsonl"))]
        rows = [{"ordinal": i, "path": str(p)} for i, p in enumerate(chunks)]
        splits_dir = out_dir / "splits"
        shutil.rmtree(splits_dir, ignore_errors=True)
        for s in SPLITS:
            (splits_dir / s).mkdir(parents=True)
        stats: dict = {}
        duplicates = 0
        if rows:
            self._data_context(one_block_per_row=False)
            keys = ray.data.from_items(rows, override_num_blocks=len(rows)).map_batches(
                _hash_chunk, batch_size=1, num_cpus=1)
            partitions = max(1, min(len(rows), int(ray.cluster_resources().get("CPU", 1))))
            repeated = keys.groupby("key", num_partitions=partitions).aggregate(Count(), Min("pos")) \
                .filter(expr=col("count()") > 1)
            firsts = {r["key"]: int(r["min(pos)"]) for r in repeated.iter_rows()}
            tokenizer_digest = directory_digest(tokenizer_dir(config.tokenizer))
            written = ray.data.from_items(rows, override_num_blocks=len(rows)).map(
                _split_chunk, fn_kwargs={"firsts": firsts, "config": config, "splits_dir": str(splits_dir),
                                         "tokenizer_digest": tokenizer_digest},
                num_cpus=1)
            for row in written.iter_rows():  # in chunk order
                merge_stats(stats, json.loads(row["stats"]))
                duplicates += int(row["duplicates"])
        for s in SPLITS:
            with atomic_open(out_dir / f"{s}.jsonl", "wb") as out:
                for i in range(len(rows)):
                    chunk = splits_dir / s / f"{i:08d}.jsonl"
                    if chunk.exists():
                        with open(chunk, "rb") as fh:
                            shutil.copyfileobj(fh, out)
        return {"domains": stats, "duplicates_dropped": duplicates}


def _run_task(row: dict, fn) -> dict:
    return {"result": pickle.dumps(fn(pickle.loads(row["task"])))}


def map_tasks(fn, tasks: list, address: str | None = None, cpus: int | None = None) -> list:
    """``[fn(t) for t in tasks]`` as Ray tasks (1 CPU each), results in order (``logos pack --parts``)."""
    import ray.data

    RayEngine(address, cpus)._data_context(one_block_per_row=True)
    ds = ray.data.from_items([{"task": pickle.dumps(t)} for t in tasks], override_num_blocks=len(tasks))
    return [pickle.loads(r["result"]) for r in ds.map(_run_task, fn_kwargs={"fn": fn}, num_cpus=1).iter_rows()]
