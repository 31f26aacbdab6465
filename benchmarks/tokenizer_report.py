"""Tokens per record per domain of several tokenizers on one corpus split (a Markdown table on stdout).

    python benchmarks/tokenizer_report.py corpus/validation.jsonl tokenizers/default runs/tok-learned runs/tok-digits

Each column is one tokenizer directory; rows are the domains of the records (their ``domain`` field),
plus every record together. Also checks that every grammar symbol has the same id in every tokenizer
and encodes as one token, and that every text decodes back to itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from logos.language.grammar import special_tokens  # noqa: E402
from logos.util.records import read_records  # noqa: E402
from logos.language.tokenizer import load_tokenizer  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", type=Path, help="a JSONL corpus split (records with text and domain)")
    ap.add_argument("tokenizers", nargs="+", type=Path)
    ap.add_argument("--json", type=Path, help="also write the numbers as JSON")
    args = ap.parse_args(argv)
    records = [r for r in read_records(args.corpus)]
    symbols = special_tokens()
    tokens: dict[str, dict[str, int]] = {}
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        counts[r.get("domain", "?")] += 1
    ids = None
    for path in args.tokenizers:
        tok = load_tokenizer(path)
        sym_ids = [tok.convert_tokens_to_ids(s) for s in symbols]
        if ids is None:
            ids = sym_ids
        if sym_ids != ids or any(len(tok.encode(s, add_special_tokens=False)) != 1 for s in symbols[:50]):
            raise SystemExit(f"{path}: grammar symbols do not keep their ids as single tokens")
        per = defaultdict(int)
        for r in records:
            enc = tok.encode(r["text"], add_special_tokens=False)
            if tok.decode(enc) != r["text"]:
                raise SystemExit(f"{path}: {r.get('source')}: the text does not decode back to itself")
            per[r.get("domain", "?")] += len(enc)
        tokens[str(path)] = dict(per)
    names = [p.name if p.name not in ("", ".") else str(p) for p in args.tokenizers]
    print(f"Tokens per record on {args.corpus.name} ({len(records):,} records); grammar symbols keep their ids.\n")
    print("| domain | records | " + " | ".join(names) + " |")
    print("|---|---:|" + "---:|" * len(names))
    for domain in sorted(counts):
        cells = [f"{tokens[str(p)].get(domain, 0) / counts[domain]:.1f}" for p in args.tokenizers]
        print(f"| {domain} | {counts[domain]:,} | " + " | ".join(cells) + " |")
    total = len(records)
    cells = [f"{sum(tokens[str(p)].values()) / total:.1f}" for p in args.tokenizers]
    print(f"| all | {total:,} | " + " | ".join(cells) + " |")
    if args.json:
        args.json.write_text(json.dumps({"records": counts, "tokens": tokens}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
