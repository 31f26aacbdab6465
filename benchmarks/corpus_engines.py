"""Corpus build throughput per domain, local engine against Ray (1 and 2 CPUs), same sources, one run.

For each engine and CPU count, every source is encoded on its own (records/s per domain: the part
phase), then all parts are deduplicated and split (the split phase). The split files of every run are
compared with the first run's (they must be byte-identical). Prints a Markdown table and writes JSON.

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/corpus_engines.py --out OUT --json bench.json --reactions uspto_val.csv
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

from logos.data.corpus import SPLITS, CorpusConfig, LocalEngine, Source, plan_source

SOURCES = [  # one per domain, from pretrain/corpus.yaml, sampled to keep the run in minutes
    Source(name="moses", dataset="moses-train", limit=20000, domain="molecule"),
    # reactions: a USPTO-50k CSV (--reactions; unpacked: a .csv.xz is not detected as CSV)
    Source(name="reactions", files=["uspto_val.csv"], domain="reaction",
           args=["--column", "reactants>reagents>production"]),
    Source(name="protein-sequences", dataset="pyhmmer-proteins", domain="protein"),
    Source(name="drug-targets", dataset="dockstring-targets", pattern="*_target.pdb", domain="protein",
           args=["--contacts"]),
    Source(name="complexes", dataset="posebusters-complexes", pattern="*_protein.pdb", domain="pocket",
           args=["--ligand", "auto"]),
    Source(name="crystals", dataset="mp-dielectric", domain="crystal"),
    Source(name="mofs", dataset="core-mof", limit=300, domain="mof"),
]


def run(engine, cpus: int, out: Path) -> dict:
    config = CorpusConfig(sources=SOURCES, tokenizer="tokenizers/default", workers=cpus)
    shutil.rmtree(out, ignore_errors=True)
    (out / "parts").mkdir(parents=True)
    row = {"engine": engine.name, "cpus": cpus, "sources": {}}
    parts = []
    for source in SOURCES:
        plan = plan_source(source, config)
        start = time.perf_counter()
        engine.build_parts([plan], config, out, echo=lambda line: None)
        seconds = time.perf_counter() - start
        done = json.loads((out / "parts" / f"{source.name}.done").read_text())
        row["sources"][source.name] = {"records": done["records"], "rejected": done["rejected"], "seconds": seconds,
                                       "per_s": (done["records"] + done["rejected"]) / seconds}
        parts.append(engine.part_path(out, source))
    start = time.perf_counter()
    stats = engine.split(parts, config, out, echo=lambda line: None)
    row["split_seconds"] = time.perf_counter() - start
    row["records"] = sum(c["records"] for d in stats["domains"].values() for c in d.values())
    row["domains"] = stats["domains"]
    row["digests"] = {s: hashlib.sha256((out / f"{s}.jsonl").read_bytes()).hexdigest()[:16] for s in SPLITS}
    return row


def tokens_per_record(out: Path) -> dict:
    """Mean tokens (tokenizers/default) per record of each source's part, from a local-engine run."""
    from logos.data.corpus import stats_tokenizer, token_counts
    from logos.util.records import read_records

    tok = stats_tokenizer("tokenizers/default", "")
    means = {}
    for source in SOURCES:
        texts = [r["text"] for r in read_records(out / "parts" / f"{source.name}.jsonl")]
        means[source.name] = sum(token_counts(tok, texts)) / max(1, len(texts))
    return means


# Capacity plan (pretrain/README.md): target corpora and the measured source whose per-record cost stands in.
TARGETS = [("PDB entries (structure + contacts)", 220e3, "drug-targets"),
           ("UniRef50 sequences", 60e6, "protein-sequences"),
           ("PubChem compounds", 120e6, "moses"),
           ("COD + MP + OQMD crystals", 1e6, "crystals")]
CLUSTERS = [(1, 2), (4, 32), (16, 64)]  # nodes x cores


def plan(rows: list[dict], means: dict) -> str:
    ray2 = next(r for r in rows if r["engine"] == "ray" and r["cpus"] == 2)
    lines = ["| corpus | records | stand-in (measured) | CPU-ms / record | tokens / record | tokens | "
             + " | ".join(f"hours on {n}x{m}" for n, m in CLUSTERS) + " |",
             "|---|---:|---|---:|---:|---:|" + "---:|" * len(CLUSTERS)]
    for name, n, source in TARGETS:
        cost = 2.0 / ray2["sources"][source]["per_s"]  # CPU-seconds per record, Ray engine on 2 CPUs
        hours = [n * cost / (nodes * cores) / 3600 for nodes, cores in CLUSTERS]
        lines.append(f"| {name} | {n:,.0f} | {source} | {cost * 1e3:.2f} | {means[source]:,.0f} | "
                     f"{n * means[source] / 1e9:,.2f}B | " + " | ".join(f"{h:,.2f}" for h in hours) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpus", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plan-only", action="store_true", help="print the capacity plan from --json and --out")
    ap.add_argument("--reactions", default="uspto_val.csv", help="a USPTO-50k CSV (e.g. its validation split), unpacked")
    args = ap.parse_args()
    import ray

    SOURCES[1].files = [args.reactions]
    if args.plan_only:
        print(plan(json.loads(args.json.read_text()), tokens_per_record(args.out / "local1")))
        return 0

    from logos.data.corpus_ray import RayEngine

    rows = []
    for cpus in args.cpus:
        rows.append(run(LocalEngine(), cpus, args.out / f"local{cpus}"))
        print(json.dumps(rows[-1]), file=sys.stderr)
        start = time.perf_counter()
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        started = time.perf_counter() - start
        rows.append({**run(RayEngine(), cpus, args.out / f"ray{cpus}"), "ray_init_seconds": started})
        ray.shutdown()
        print(json.dumps(rows[-1]), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    names = [s.name for s in SOURCES]
    print("| engine | CPUs | " + " | ".join(f"{n} rec/s" for n in names) + " | split s | same files |")
    print("|---|---:|" + "---:|" * (len(names) + 2))
    for r in rows:
        print(f"| {r['engine']} | {r['cpus']} | " + " | ".join(f"{r['sources'][n]['per_s']:,.0f}" for n in names)
              + f" | {r['split_seconds']:.1f} | {r['digests'] == rows[0]['digests']} |")
    print()
    print(plan(rows, tokens_per_record(args.out / f"local{args.cpus[0]}")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
