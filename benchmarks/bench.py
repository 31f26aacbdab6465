"""``make bench``: rerun the throughput benchmarks in one go and rewrite their tables in BENCHMARKS.md.

Each part runs its own script (so it can also be run alone, with the command shown above its table)
at sizes that keep the whole run near 10 minutes on 2 CPU cores: molecules (``logos tokenize``
against a bare RDKit loop, 1 and 2 workers), protein structures (against a bare gemmi read),
crystals (against gemmi + spglib), the DeepSpeed step against a plain torch loop with the shard
reader, and constrained against unconstrained generation. Every script alternates its sides in
rounds and prints medians with the spread of the per-round ratios, so a ratio is measured in one
run, under the same load. The output of each part replaces what lies between its markers
``<!-- make bench: NAME -->`` and ``<!-- /make bench: NAME -->`` in BENCHMARKS.md (a part without
markers is appended under "Throughput (make bench)"). Not here: the 20-minute training run, the
corpus build, round-trip and evaluation benchmarks.

    .venv/bin/python benchmarks/bench.py [--parts molecules,proteins,crystals,training,generation] [--dry-run]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "BENCHMARKS.md"
PY = sys.executable

PARTS = {  # name: (title, command)
    "molecules": ("Molecules: `logos tokenize` (isolated workers) against a bare RDKit loop",
                  [PY, "benchmarks/tokenize_bench.py", "--n", "100000", "--workers", "1", "2", "--repeats", "2"]),
    "proteins": ("Protein structures: encoders and the CLI against a bare gemmi read",
                 [PY, "benchmarks/protein_bench.py", "--repeats", "3"]),
    "crystals": ("Crystals: encoders against a bare gemmi read + spglib",
                 [PY, "benchmarks/crystal_bench.py", "--parts", "speed", "--speed-files", "200", "--repeats", "3"]),
    "training": ("Training: DeepSpeed ZeRO-2 step against plain torch, and the shard reader (tiny preset, 1 process)",
                 [PY, "benchmarks/train_bench.py", "--zero", "2", "--rounds", "5", "--steps", "8"]),
    "generation": ("Generation: constrained against unconstrained sampling (shipped tiny model, batch 16)",
                   [PY, "benchmarks/generate_bench.py", "--model", "tiny", "--rounds", "3"]),
}


_NOISE = re.compile(r"\[\d{4}-\d\d-\d\d |DeepSpeed deepspeed\.ops")  # library log lines on stdout


def _markdown(stdout: str) -> str:
    """Script output as markdown: table rows kept, other lines as list items (no accidental headings)."""
    out = []
    for line in stdout.splitlines():
        line = line.rstrip()
        if not line or _NOISE.match(line):
            continue
        if line.startswith("|"):
            if out and not out[-1].startswith("|"):
                out.append("")
            out.append(line)
        else:
            if out and out[-1].startswith("|"):
                out.append("")
            out.append("- " + line.lstrip("# "))
    return "\n".join(out)


def _section(name: str, title: str, cmd: list[str], body: str, seconds: float, load: str) -> str:
    shown = " ".join(["python", *cmd[1:]])  # the report's convention: venv active, PYTHONPATH=. OMP_NUM_THREADS=1
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return (f"<!-- make bench: {name} -->\n### {title}\n\nWritten by `make bench` at commit {commit or 'unknown'} on {stamp} "
            f"({seconds:.0f} s).\n\n```\n{shown}\n```\n\n{body}\n<!-- /make bench: {name} -->")


def rewrite(text: str, name: str, section: str) -> str:
    pattern = re.compile(rf"<!-- make bench: {re.escape(name)} -->.*?<!-- /make bench: {re.escape(name)} -->", re.S)
    if pattern.search(text):
        return pattern.sub(lambda m: section, text)
    if "## Throughput (make bench)" not in text:
        text = text.rstrip("\n") + "\n\n## Throughput (make bench)\n\nRatios below >1 mean logos takes longer. " \
                                   "Rerun with `make bench` on an otherwise idle machine.\n"
    return text.rstrip("\n") + "\n\n" + section + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--dry-run", action="store_true", help="print the sections, leave BENCHMARKS.md alone")
    args = ap.parse_args()
    names = [n.strip() for n in args.parts.split(",") if n.strip()]
    unknown = [n for n in names if n not in PARTS]
    if unknown:
        print(f"bench: unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}", file=sys.stderr)
        return 2
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "TQDM_DISABLE": "1"}
    start, failed = time.perf_counter(), []
    for k, name in enumerate(names, 1):
        title, cmd = PARTS[name]
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"bench [{k}/{len(names)}] {name}: {' '.join(cmd[1:])} (load {load}; "
              f"{time.perf_counter() - start:.0f} s so far)", file=sys.stderr, flush=True)
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - t
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            print(f"bench: {name} failed (exit {proc.returncode}): {tail}", file=sys.stderr)
            failed.append(name)
            continue
        print(proc.stdout, flush=True)
        section = _section(name, title, cmd, _markdown(proc.stdout), seconds, load)
        if not args.dry_run:
            BENCH.write_text(rewrite(BENCH.read_text(encoding="utf-8"), name, section), encoding="utf-8")
    print(f"bench: {len(names) - len(failed)}/{len(names)} parts in {time.perf_counter() - start:.0f} s"
          f"{'' if args.dry_run else f'; tables rewritten in {BENCH.name}'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
