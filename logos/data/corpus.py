"""``logos corpus build``: pinned sources -> tokenized, deduplicated, split train/validation/test JSONL + stats.

A corpus config (YAML, an instance of :class:`CorpusConfig`) lists sources: a bundled dataset of
:mod:`logos.data.datasets` (fetched by pinned version) or the user's own files (globs), each with the
``logos tokenize`` flags to apply. The build runs in two resumable phases:

1. **parts**: each source is tokenized to ``DIR/parts/NAME.jsonl``; a ``NAME.done`` marker holds the
   hash of the source's config, so a rerun skips finished sources and redoes changed ones.
2. **split**: all parts are streamed once, exact duplicate texts dropped (first wins), and each
   record assigned to train/validation/test by a seeded hash of its *group key*
   (:mod:`logos.data.splits`), so related records never straddle splits: molecules by Bemis-Murcko
   scaffold, reactions by their reactant and product sets (the forward and retro forms of one
   reaction stay together), everything else by the structure it came from. Output files are
   written atomically; ``stats.md`` / ``stats.json`` hold records and tokens per domain and split.

A part is redone when anything it depends on changes: the source's config, its input files (size
and mtime), the **source code** of the domain's encoder (its module and every ``logos`` module it
imports, read with ``ast``), the grammar file and the versions of the parsing libraries. The split
is redone when a part or the tokenizer's **contents** change (not its path).

**Engines.** The pipeline is one set of stage functions (read, encode, deduplicate, split, write;
below) run by an engine: :class:`LocalEngine` (default: ``logos tokenize``'s isolated process pool
per source, one streaming pass for the split) or the Ray Data engine of :mod:`logos.data.corpus_ray`
(``--engine ray``: Ray's local mode, or a cluster with ``--ray-address``); :mod:`logos.data.corpus_build`
chooses the engine and runs the phases. Both write the same
records in the same order to each split file: deduplication keeps the first occurrence in one
global order (sources in config order, files sorted, records in file order) and the split is a pure
function of the record. A part records which engine wrote it; the other engine redoes it.

Train on the splits as built: ``logos pack corpus/train.jsonl --val corpus/validation.jsonl``, or,
for a corpus built with ``--engine ray``, ``logos pack corpus/ --parts --engine ray`` (shards in parts).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import glob
import hashlib
import importlib.util
import json
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Iterator

import yaml

from logos.util.config import check_types
from logos.util.records import InputError, errors_path_for, read_records, safe_name
from logos.data.splits import group_key, split_of

__all__ = ["Source", "CorpusConfig", "load_config", "encoder_digest", "directory_digest", "tokenizer_dir", "config_digest", "ENGINES",
           "LocalEngine", "stats_table"]

SPLITS = ("train", "validation", "test")


@dataclass
class Source:
    """One corpus source."""

    name: str
    """Short unique name; the part file is ``parts/NAME.jsonl``."""
    dataset: str | None = None
    """A bundled dataset (``logos fetch`` name), fetched by pinned version."""
    files: list[str] = field(default_factory=list)
    """Or: paths or globs of your own files (any format ``logos tokenize`` reads)."""
    pattern: str = "*"
    """For a dataset that is a folder of files: which of its files to read (glob)."""
    limit: int | None = None
    """Keep a seeded random sample of this many input records (bundled datasets only)."""
    domain: str | None = None
    """Force the domain (default: detected per file, as ``logos tokenize`` does)."""
    args: list[str] = field(default_factory=list)
    """Extra ``logos tokenize`` flags, e.g. ``["--retro"]`` or ``["--pocket-cutoff", "6"]``."""
    options: dict = field(default_factory=dict)
    """Encoder options by name, typed (``{retro: true, pocket_cutoff: 6.0}``); applied after ``args``."""

    def __post_init__(self):
        if bool(self.dataset) == bool(self.files):
            raise ValueError(f"source {self.name!r}: give exactly one of 'dataset' or 'files'")
        if not self.name.replace("-", "").replace("_", "").isalnum():
            raise ValueError(f"source name {self.name!r}: use letters, digits, '-' and '_'")


@dataclass
class CorpusConfig:
    """A corpus: its sources, split fractions and seed."""

    sources: list[Source]
    seed: int = 0
    """Seed of dataset samples and of the split hash."""
    validation: float = 0.01
    """Fraction of groups in the validation split."""
    test: float = 0.01
    """Fraction of groups in the test split."""
    tokenizer: str = "tokenizers/default"
    """Tokenizer used to count tokens in the stats table."""
    workers: int = 2
    """Encoder processes per source (local engine; the Ray engine uses one isolated process per Ray CPU)."""
    limits: dict = field(default_factory=dict)
    """Per-record limits of ``logos tokenize`` (``timeout``, ``max_atoms``, ``max_mb``;
    :class:`logos.data.limits.Limits`)."""

    def __post_init__(self):
        self.sources = [s if isinstance(s, Source) else Source(**s) for s in self.sources]
        self.record_limits()  # unknown or negative limits fail here
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate source names in {names}")
        if not (0 <= self.validation < 1 and 0 <= self.test < 1 and self.validation + self.test < 1):
            raise ValueError("validation and test must be fractions that sum below 1")

    def record_limits(self):
        from logos.data.limits import Limits

        known = {f.name for f in dataclasses.fields(Limits)}
        if set(self.limits) - known:
            raise ValueError(f"unknown limits {sorted(set(self.limits) - known)} (known: {sorted(known)})")
        return Limits(**self.limits)


def load_config(path: Path) -> CorpusConfig:
    """Parse and check a corpus config: keys, dataset names and each source's tokenize flags."""
    from logos.data.datasets import DATASETS

    raw = yaml.safe_load(Path(path).read_text())
    if not isinstance(raw, dict):
        raise ValueError("not a mapping of corpus settings")
    known = {f.name for f in dataclasses.fields(CorpusConfig)}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)} (known: {sorted(known)})")
    check_types(CorpusConfig, raw, "corpus")  # ValueError naming the key (corpus.sources.0.limit: ...)
    config = CorpusConfig(**raw)
    for source in config.sources:
        if source.dataset and source.dataset not in DATASETS:
            raise ValueError(f"source {source.name!r}: unknown dataset {source.dataset!r} (known: {', '.join(DATASETS)})")
        _tokenize_options(source)  # bad flags fail here, before any work
    return config


def config_digest(obj) -> str:
    """A stable hash of a JSON-able object (a config, the parts' markers)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _tokenize_options(source: Source) -> tuple[dict, str | None]:
    """The typed per-domain options that ``logos tokenize`` would use with the source's flags and options."""
    from logos.domains import DOMAINS, encoder_options
    from logos.domains.base import parse_flags

    try:
        values = {**parse_flags(DOMAINS.values(), list(source.args)), **source.options}
        flag_domain = values.pop("domain", None)
        options = encoder_options(values)
    except InputError as e:
        raise ValueError(f"source {source.name!r}: bad tokenize flags or options: {e}") from None
    domain = source.domain or flag_domain
    if domain is not None and domain not in DOMAINS:
        raise ValueError(f"source {source.name!r}: unknown domain {domain!r} (known: {', '.join(DOMAINS)})")
    return options, domain


# Parsing libraries whose versions change what the encoders write (canonical SMILES, symmetry, ...).
_LIBRARIES = ("rdkit", "gemmi", "spglib", "biopython", "biotite", "mini3di", "numpy")


@functools.lru_cache(maxsize=None)
def _module_sources(module: str) -> tuple[tuple[str, str], ...]:
    """(module, sha256 of its source) for ``module`` and every ``logos`` module it imports, transitively."""
    seen: dict[str, str] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        source = Path(spec.origin).read_bytes()
        seen[name] = hashlib.sha256(source).hexdigest()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names if a.name.split(".")[0] == "logos"]
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "logos":
                # ``from logos.domains import textfiles``: the submodule, not the package's registry
                subs = [f"{node.module}.{a.name}" for a in node.names]
                subs = [m for m in subs if importlib.util.find_spec(m) is not None] \
                    if importlib.util.find_spec(node.module).submodule_search_locations else []
                todo += subs if len(subs) == len(node.names) else [node.module, *subs]
    return tuple(sorted(seen.items()))


def encoder_digest(domain: str | None) -> str:
    """What a part's records depend on besides its inputs: encoder source, grammar, library versions.

    ``domain`` None (detected per file) covers every domain's encoder.
    """
    from logos.domains import DOMAINS
    from logos.language.grammar import grammar_text

    names = [domain] if domain else sorted(DOMAINS)
    modules = sorted({m for d in names for m in _module_sources(type(DOMAINS[d]).__module__)})
    # and the driver around every encoder (size limits, JSON lines), its own source only: it imports every domain
    driver = Path(importlib.util.find_spec("logos.data.encode").origin).read_bytes()
    modules.append(("logos.data.encode", hashlib.sha256(driver).hexdigest()))
    versions = {}
    for lib in _LIBRARIES:
        try:
            versions[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            versions[lib] = None
    return config_digest({"modules": modules, "grammar": hashlib.sha256(grammar_text().encode()).hexdigest(),
                    "libraries": versions})


def directory_digest(path: Path) -> str:
    """Digest of the contents of every file in a directory (a tokenizer is its files, not its path)."""
    path = Path(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _inputs(source: Source, seed: int) -> list[Path]:
    """The input files of a source; a fetched dataset folder gives its files matching ``pattern``."""
    from logos.data import datasets as data

    if source.dataset:
        fetched = data.fetch(source.dataset, limit=source.limit, seed=seed)
        return sorted(p for p in fetched.glob(source.pattern) if p.is_file()) if fetched.is_dir() else [fetched]
    return sorted({Path(p) for pattern in source.files for p in (glob.glob(pattern, recursive=True) or [pattern])})


# ---------------------------------------------------------------- the pipeline, shared by both engines
#
# read -> encode (isolated workers) -> deduplicate (exact text, first wins) -> split (seeded hash of the
# group key) -> write JSONL. The local engine (below) runs it in this process and a process pool; the Ray
# engine (:mod:`logos.data.corpus_ray`) runs the same stage functions as a Ray Data pipeline. Records keep one
# global order: sources in config order, input files in sorted order, records in file order; "first"
# in deduplication and the order of every split file follow it, on any engine.

ENGINES = ("local", "ray")
CHUNK_COST = 4096   # Ray engine: work items per encode task (a heavy item -- a file, a CIF block -- costs HEAVY_COST)
HEAVY_COST = 64


@dataclass
class SourcePlan:
    """What one source's part depends on and where it goes (computed before any work)."""

    source: Source
    inputs: list[Path]
    options: dict
    domain: str | None
    digest: str


def plan_source(source: Source, config: CorpusConfig) -> SourcePlan:
    inputs = _inputs(source, config.seed)
    options, domain = _tokenize_options(source)
    # Inputs (size, mtime), the source's config and the encoder's code are in the digest: any change redoes the part.
    stamps = [(str(p), p.stat().st_size, p.stat().st_mtime_ns) if p.exists() else (str(p), None, None)
              for p in inputs]
    digest = config_digest({"source": dataclasses.asdict(source), "seed": config.seed, "inputs": stamps,
                      "limits": dataclasses.asdict(config.record_limits()), "encoder": encoder_digest(domain)})
    return SourcePlan(source, inputs, options, domain, digest)


def marker_path(out_dir: Path, source: Source) -> Path:
    return Path(out_dir) / "parts" / f"{safe_name(source.name)}.done"


def errors_path(out_dir: Path, source: Source) -> Path:
    return Path(out_dir) / "parts" / f"{safe_name(source.name)}.errors.jsonl"


def part_is_done(plan: SourcePlan, out_dir: Path, engine: str, part: Path) -> bool:
    """The part exists and was written by this engine for exactly this plan."""
    marker = marker_path(out_dir, plan.source)
    if not (part.exists() and marker.exists()):
        return False
    done = json.loads(marker.read_text())
    return done.get("digest") == plan.digest and done.get("engine", "local") == engine


def write_marker(plan: SourcePlan, out_dir: Path, engine: str, records: int, rejected: int, seconds: float,
                 echo) -> None:
    marker_path(out_dir, plan.source).write_text(json.dumps(
        {"digest": plan.digest, "engine": engine, "records": records, "rejected": rejected,
         "seconds": round(seconds, 1)}) + "\n")
    errors = errors_path(out_dir, plan.source)
    echo(f"corpus: {plan.source.name}: {records:,} records, {rejected:,} rejected, {seconds:.0f} s"
         + (f" (rejections in {errors})" if rejected else ""))


def read_chunks(inputs: list[Path], domain: str | None, options: dict, limits,
                chunk_cost: int = CHUNK_COST) -> Iterator[list]:
    """Stage *read*: the work items of ``inputs`` in order, in chunks of about CHUNK_COST (a Ray task each)."""
    from logos.data.encode import is_heavy, work_items

    chunk: list = []
    cost = 0
    for pair in work_items(inputs, domain, options, limits):
        chunk.append(pair)
        cost += HEAVY_COST if is_heavy(pair) else 1
        if cost >= chunk_cost:
            yield chunk
            chunk, cost = [], 0
    if chunk:
        yield chunk


def encode_chunk(pairs: list, options: dict, limits) -> tuple[list[str], list[tuple[str, str]]]:
    """Stage *encode*: (JSON lines in input order, (source, reason) of rejected records) for a chunk of work items.

    The encoders run in one isolated worker process (:func:`logos.util.isolate.imap_isolated`): a record
    that crashes the parsing library or runs past ``limits.timeout`` is one rejection, never the task.
    """
    from logos.data.encode import encode_items

    lines: list[str] = []
    bad: list[tuple[str, str]] = []
    encoded = encode_items(pairs, options, limits, workers=1)
    try:
        for _, good, rejected in encoded:
            lines += good
            bad += rejected
    finally:
        encoded.close()
    return lines, bad


def dedup_key(text: str) -> str:
    """Stage *deduplicate*: exact duplicates share this key (a 96-bit hash of the text); the first in order wins."""
    return hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def split_for(rec: dict, config: CorpusConfig) -> str:
    """Stage *split*: a seeded hash of the record's group key (:mod:`logos.data.splits`)."""
    return split_of(group_key(rec), config.seed, config.validation, config.test)


def record_line(rec: dict) -> str:
    """Stage *write*: one line of a split file."""
    return json.dumps(rec, ensure_ascii=False) + "\n"


def tokenizer_dir(name: str) -> Path:
    return Path(name)


@functools.lru_cache(maxsize=4)
def stats_tokenizer(path: str, contents: str):
    """The tokenizer that counts tokens in the stats, cached per path and contents (``directory_digest``)."""
    from logos.language.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_dir(path))


def token_counts(tokenizer, texts: list[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]] if texts else []


def add_stats(stats: dict, domain: str, split: str, records: int, tokens: int) -> None:
    """Accumulate records and tokens per domain and split (insertion order = order of first appearance)."""
    cell = stats.setdefault(domain, {}).setdefault(split, {"records": 0, "tokens": 0})
    cell["records"] += records
    cell["tokens"] += tokens


def merge_stats(into: dict, other: dict) -> None:
    for domain, row in other.items():
        for split, cell in row.items():
            add_stats(into, domain, split, cell["records"], cell["tokens"])


# ---------------------------------------------------------------- the local engine
class LocalEngine:
    """One machine: ``logos tokenize``'s process pool per source, then one streaming pass for the split."""

    name = "local"

    def part_path(self, out_dir: Path, source: Source) -> Path:
        return Path(out_dir) / "parts" / f"{safe_name(source.name)}.jsonl"

    def part_records(self, part: Path) -> Iterator[dict]:
        yield from read_records(part)

    def build_parts(self, plans: list[SourcePlan], config: CorpusConfig, out_dir: Path, echo) -> None:
        from logos.data.encode import tokenize_files

        for plan in plans:
            part = self.part_path(out_dir, plan.source)
            tmp = part.with_name(part.stem + ".part.jsonl")
            result = tokenize_files(plan.inputs, tmp, plan.options, domain=plan.domain, workers=config.workers,
                                    limits=config.record_limits())
            tmp.replace(part)
            errors = errors_path(out_dir, plan.source)
            errors.unlink(missing_ok=True)
            if errors_path_for(tmp).exists():
                errors_path_for(tmp).replace(errors)
            write_marker(plan, out_dir, self.name, result.records, result.errors, result.seconds, echo)

    def split(self, parts: list[Path], config: CorpusConfig, out_dir: Path, echo) -> dict:
        tokenizer = stats_tokenizer(config.tokenizer, directory_digest(tokenizer_dir(config.tokenizer)))
        seen: set[str] = set()
        stats: dict[str, dict[str, dict[str, int]]] = {}
        duplicates = 0
        tmp_paths = {s: out_dir / f"{s}.jsonl.part" for s in SPLITS}
        handles = {s: open(p, "w", encoding="utf-8") for s, p in tmp_paths.items()}
        batch: list[tuple[str, dict]] = []

        def flush():
            for (split, rec), n_tokens in zip(batch, token_counts(tokenizer, [r["text"] for _, r in batch])):
                handles[split].write(record_line(rec))
                add_stats(stats, rec.get("domain", "unknown"), split, 1, n_tokens)
            batch.clear()

        try:
            for part in parts:
                for rec in self.part_records(part):
                    key = dedup_key(rec["text"])
                    if key in seen:
                        duplicates += 1
                        continue
                    seen.add(key)
                    batch.append((split_for(rec, config), rec))
                    if len(batch) >= 2048:
                        flush()
            flush()
        finally:
            for fh in handles.values():
                fh.close()
        for split, tmp in tmp_paths.items():
            tmp.replace(out_dir / f"{split}.jsonl")
        return {"domains": stats, "duplicates_dropped": duplicates}


def stats_table(stats: dict) -> str:
    lines = ["| domain | " + " | ".join(f"{s} records | {s} tokens" for s in SPLITS) + " |",
             "|---|" + "---:|" * (2 * len(SPLITS))]
    totals = {s: [0, 0] for s in SPLITS}
    for domain, row in sorted(stats["domains"].items()):
        cells = []
        for s in SPLITS:
            c = row.get(s, {"records": 0, "tokens": 0})
            totals[s][0] += c["records"]
            totals[s][1] += c["tokens"]
            cells.append(f"{c['records']:,} | {c['tokens']:,}")
        lines.append(f"| {domain} | " + " | ".join(cells) + " |")
    lines.append("| **total** | " + " | ".join(f"{r:,} | {t:,}" for r, t in totals.values()) + " |")
    lines.append(f"\nExact duplicates dropped: {stats['duplicates_dropped']:,}")
    return "\n".join(lines)
