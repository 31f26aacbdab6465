"""Building a corpus: choose an engine (local, or Ray from :mod:`logos.data.corpus_ray`) and run its two phases.

The phases, the resumption rules and the stage functions are described in :mod:`logos.data.corpus`;
this module only picks the engine and drives plan -> parts -> split, so that neither engine module
imports the other.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from logos.data.corpus import (ENGINES, SPLITS, CorpusConfig, LocalEngine, config_digest, directory_digest, marker_path,
                               part_is_done, plan_source, stats_table, tokenizer_dir)

__all__ = ["get_engine", "build_corpus"]


def get_engine(name: str, ray_address: str | None = None, cpus: int | None = None):
    """The engine object for ``--engine NAME``; ``ray`` raises :class:`EngineUnavailable` when Ray is not installed."""
    if name == "local":
        return LocalEngine()
    if name == "ray":
        from logos.data.corpus_ray import RayEngine  # needs logos[ray]: imported only when asked for

        return RayEngine(address=ray_address, cpus=cpus)
    raise ValueError(f"unknown engine {name!r} (known: {', '.join(ENGINES)})")


def build_corpus(config: CorpusConfig, out_dir: Path, echo=None, engine="local") -> dict:
    """Build (or finish) the corpus in ``out_dir`` with ``engine`` (a name or an engine object).

    Every engine writes the same records in the same order to each split file.
    """
    echo = echo or (lambda line: print(line, file=sys.stderr))
    engine = get_engine(engine) if isinstance(engine, str) else engine
    start = time.perf_counter()
    out_dir = Path(out_dir)
    (out_dir / "parts").mkdir(parents=True, exist_ok=True)
    plans = [plan_source(source, config) for source in config.sources]
    parts = [engine.part_path(out_dir, plan.source) for plan in plans]
    todo = []
    for plan, part in zip(plans, parts):
        if part_is_done(plan, out_dir, engine.name, part):
            echo(f"corpus: {plan.source.name}: done earlier, skipped")
        else:
            marker_path(out_dir, plan.source).unlink(missing_ok=True)
            todo.append(plan)
    if todo:
        engine.build_parts(todo, config, out_dir, echo)
    markers = [marker_path(out_dir, plan.source) for plan in plans]
    split_digest = config_digest({"parts": [(m.name, m.read_text()) for m in markers], "engine": engine.name,
                            "seed": config.seed, "validation": config.validation, "test": config.test,
                            "tokenizer": directory_digest(tokenizer_dir(config.tokenizer))})
    marker = out_dir / "split.done"
    if marker.exists() and json.loads(marker.read_text()).get("digest") == split_digest and \
            all((out_dir / f"{s}.jsonl").exists() for s in SPLITS):
        echo("corpus: split done earlier, skipped")
        stats = json.loads((out_dir / "stats.json").read_text())
    else:
        marker.unlink(missing_ok=True)
        stats = engine.split(parts, config, out_dir, echo)
        stats["engine"] = engine.name
        stats["seconds"] = round(time.perf_counter() - start, 1)
        (out_dir / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
        (out_dir / "stats.md").write_text(stats_table(stats) + "\n")
        marker.write_text(json.dumps({"digest": split_digest}) + "\n")
    rejected = sum(json.loads(m.read_text()).get("rejected", 0) for m in markers)
    stats["rejected"] = rejected
    echo(stats_table(stats))
    echo(f"corpus: {out_dir} ({time.perf_counter() - start:.0f} s, engine {engine.name})"
         + (f"; {rejected:,} input records rejected (see {out_dir / 'parts'}/*.errors.jsonl)" if rejected else ""))
    return stats
