#!/usr/bin/env bash
# make demo-train: fetch a MOSES sample, tokenize, pack, pretrain the tiny preset for a
# few CPU minutes through DeepSpeed, generate 100 molecules (grammar-constrained) to SDF and print
# validity, uniqueness and novelty. Knobs: TRAIN_MINUTES (default 3), MOLECULES (training sample,
# default 50000), SAMPLES (default 100), OUT (default demo_out), THREADS (torch threads, default 1:
# one thread per process never oversubscribes a shared CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
LOGOS=${LOGOS:-.venv/bin/logos}
OUT=${OUT:-demo_out}
TRAIN_MINUTES=${TRAIN_MINUTES:-3}
MOLECULES=${MOLECULES:-50000}
SAMPLES=${SAMPLES:-100}
export OMP_NUM_THREADS=${THREADS:-1}
mkdir -p "$OUT"

step() { echo "+ logos $*"; $LOGOS "$@"; }

step fetch moses-train --limit "$MOLECULES" --seed 0 -o "$OUT/moses_train.smi"
step tokenize "$OUT/moses_train.smi" -o "$OUT/moses_train.jsonl" -q
step pack "$OUT/moses_train.jsonl" --tokenizer tokenizers/default -o "$OUT/shards" -q
step pretrain --config pretrain/tiny.yaml --dry-run | tail -3
rm -rf "$OUT/run"
step pretrain --config pretrain/tiny.yaml -q \
    --set train.data="$OUT/shards" --set train.out_dir="$OUT/run" \
    --set train.max_minutes="$TRAIN_MINUTES" --set train.save_every=100000 --set train.log_every=100 \
    2>&1 | grep -v '^\['  # DeepSpeed's own [INFO]/[WARNING] lines
step generate --checkpoint "$OUT/run/hf" --task molecule -n "$SAMPLES" -o "$OUT/generated.sdf" \
    --reference "$OUT/moses_train.smi" --temperature 0.7 -q
echo "loss curve: $OUT/run/loss.png; metrics: $OUT/run/metrics.csv; checkpoint: $OUT/run/hf"
if [[ -f checkpoints/logos-tiny/model.safetensors ]]; then
    echo "== the shipped checkpoint (same preset, every domain, 150 CPU minutes): 100 molecules"
    step generate --checkpoint checkpoints/logos-tiny --task molecule -n "$SAMPLES" -o "$OUT/generated_shipped.sdf" \
        --reference "$OUT/moses_train.smi" --temperature 0.7 -q
fi
