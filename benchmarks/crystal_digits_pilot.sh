#!/usr/bin/env bash
# Crystals at equal compute: a tokenizer whose digits are single tokens against one with learned numeric
# pieces. The same tiny model is trained on the crystals of a corpus with each tokenizer, both runs side by
# side for the same minutes (one thread each), then samples crystals under the grammar constraint and
# scores them with `logos evaluate --task crystal`.
#
#   benchmarks/crystal_digits_pilot.sh CORPUS_DIR LEARNED_TOKENIZER DIGITS_TOKENIZER OUT_DIR
#
# CORPUS_DIR is a `logos corpus build` output (train.jsonl, validation.jsonl). MINUTES (default 8) sets the
# training time of each arm, SAMPLES (default 100) the crystals sampled per arm.
set -euo pipefail
cd "$(dirname "$0")/.."
LOGOS=${LOGOS:-.venv/bin/logos}
PY=${PY:-.venv/bin/python}
corpus=$1 learned=$2 digits=$3 out=$4
minutes=${MINUTES:-8} samples=${SAMPLES:-100}
mkdir -p "$out"
for split in train validation; do
  $PY - "$corpus/$split.jsonl" "$out/crystals.$split.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1]) as src, open(sys.argv[2], "w") as dst:
    for line in src:
        rec = json.loads(line)
        if rec.get("domain") == "crystal":
            dst.write(line)
EOF
done
echo "pilot: $(wc -l < "$out/crystals.train.jsonl") training and $(wc -l < "$out/crystals.validation.jsonl") validation crystals"
train() {  # arm tokenizer
  $LOGOS pack "$out/crystals.train.jsonl" --val "$out/crystals.validation.jsonl" --tokenizer "$2" -o "$out/$1/shards" -q
  OMP_NUM_THREADS=1 $LOGOS pretrain --config pretrain/tiny.yaml -q --set train.data="$out/$1/shards" \
    --set train.tokenizer="$2" --set train.out_dir="$out/$1/run" --set train.max_minutes="$minutes" \
    --set train.seq_len=256 --set train.log_every=25 --set train.eval_every=200 --set train.save_every=200 \
    > "$out/$1/train.log" 2>&1
}
mkdir -p "$out/learned" "$out/digits"
train learned "$learned" & a=$!
train digits "$digits" & b=$!
wait $a $b
for arm in learned digits; do
  OMP_NUM_THREADS=1 $LOGOS generate --checkpoint "$out/$arm/run/hf" --task crystal -n "$samples" --seed 0 \
    -o "$out/$arm/crystals.cif" -q > "$out/$arm/generate.log" 2>&1 || true
  OMP_NUM_THREADS=1 $LOGOS evaluate --task crystal --predictions "$out/$arm/crystals.samples.jsonl" \
    -o "$out/$arm/eval" > "$out/$arm/evaluate.log" 2>&1 || true
done
$PY - "$out" "$samples" <<'EOF'
import csv, json, sys
from pathlib import Path
out, n = Path(sys.argv[1]), int(sys.argv[2])
print("| arm | steps | tokens seen | val loss | written | metrics |")
print("|---|---:|---:|---:|---:|---|")
for arm in ("learned", "digits"):
    rows = list(csv.DictReader(open(out / arm / "run" / "metrics.csv")))
    val = [r["val_loss"] for r in rows if r.get("val_loss")]
    written = sum(1 for _ in open(out / arm / "crystals.samples.jsonl")) if (out / arm / "crystals.samples.jsonl").exists() else 0
    m = out / arm / "eval" / "metrics.json"
    metrics = json.loads(m.read_text())["metrics"] if m.exists() else {}
    keep = {k: (v.get("value") if isinstance(v, dict) else v) for k, v in metrics.items()
            if any(w in k for w in ("valid", "space_group", "unique"))}
    print(f"| {arm} | {rows[-1]['step']} | {int(rows[-1]['tokens']):,} | {val[-1] if val else '-'} | {written}/{n} | {json.dumps(keep)} |")
EOF
