#!/usr/bin/env bash
# Rebuilds tokenizers/default from the multi-domain corpus of the shipped model
# (pretrain/corpus-logos-tiny.yaml: its header says where the benchmark files go): 512 learned pieces,
# drawn from at most 20,000 training records of each domain (seed 0) so that no domain dominates.
# Every grammar symbol keeps its id as one token; only the learned pieces change.
set -euo pipefail
cd "$(dirname "$0")/.."
LOGOS=${LOGOS:-.venv/bin/logos}
CORPUS=${CORPUS:-corpus}
[[ -f "$CORPUS/train.jsonl" ]] || $LOGOS corpus build --config pretrain/corpus-logos-tiny.yaml -o "$CORPUS"
$LOGOS build-tokenizer "$CORPUS/train.jsonl" -o tokenizers/default --pieces 512 --per-domain 20000 --seed 0
