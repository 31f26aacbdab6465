#!/usr/bin/env bash
# The shipped model's results table: every task through `logos generate` defaults (constrained, the task's
# temperature: 0.7 for retro, 1.0 for the rest), scored by `logos evaluate` (or the benchmark scripts beside this
# one, which call it), then summarized by benchmarks/logos_tiny_table.py into $OUT/results.md and results.json.
#
#   DATA=DIR CORPUS=DIR benchmarks/logos_tiny_eval.sh [OUT]
#
# DATA holds USPTO-50k's raw_test.csv.xz and CDVAE's perov_5_test.csv.xz (under uspto50k/ and cdvae/);
# CORPUS is the `logos corpus build` output of pretrain/corpus-logos-tiny.yaml (novelty against its crystal
# and MOF training records). TASKS (default: all) picks a subset, e.g. TASKS="molecule crystal" to run two
# halves side by side; SEED (default 0) reruns on other seeds; CKPT (default checkpoints/logos-tiny).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench_logos_tiny}
PY=${PY:-.venv/bin/python}
CKPT=${CKPT:-checkpoints/logos-tiny}
SEED=${SEED:-0}
TASKS=${TASKS:-molecule crystal csp mof protein pocket retro}
DATA=${DATA:?set DATA to the folder holding uspto50k/ and cdvae/}
CORPUS=${CORPUS:?set CORPUS to the corpus built from pretrain/corpus-logos-tiny.yaml}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=${PYTHONPATH:-.}
mkdir -p "$OUT"
L="$PY -m logos.cli"  # exit status 1 (some samples or records failed, each listed) does not stop the run
t() { local s; s=$(date +%s); echo "+ $*" >&2; "$@" || [[ $? == 1 ]]; echo "$(( $(date +%s) - s )) s: $*" >> "$OUT/times.txt"; }
domain() {  # the training records of one domain of the corpus
  [[ -s "$OUT/train_$1.jsonl" ]] || grep "\"domain\": \"$1\"" "$CORPUS/train.jsonl" > "$OUT/train_$1.jsonl"
}

for task in $TASKS; do
  case $task in
    molecule)
      t $L generate --checkpoint "$CKPT" --task molecule -n 1000 --seed "$SEED" -q -o "$OUT/molecule/samples.smi"
      t $L evaluate --task molecule --predictions "$OUT/molecule/samples.smi" --references moses-test \
        --train moses-train --train-as-given --fcd -o "$OUT/molecule" ;;
    crystal)
      domain crystal
      t $L generate --checkpoint "$CKPT" --task crystal -n 200 --seed "$SEED" -q -o "$OUT/crystal/samples.cif"
      t $L evaluate --task crystal --predictions "$OUT/crystal/samples.samples.jsonl" --train "$OUT/train_crystal.jsonl" \
        -o "$OUT/crystal" ;;
    csp)
      t $PY benchmarks/csp_match.py --checkpoint "$CKPT" --test "$DATA/cdvae/perov_5_test.csv.xz" --items 100 \
        --samples 20 --seed "$SEED" --work "$OUT/csp" --out "$OUT/csp/result.json" ;;
    mof)
      domain mof
      t $L generate --checkpoint "$CKPT" --task mof -n 200 --seed "$SEED" -q -o "$OUT/mof/samples.json"
      t $L evaluate --task mof --predictions "$OUT/mof/samples.samples.jsonl" --train "$OUT/train_mof.jsonl" -o "$OUT/mof" ;;
    protein)
      t $L generate --checkpoint "$CKPT" --task protein -n 200 --seed "$SEED" -q -o "$OUT/protein/samples.fasta"
      t $L evaluate --task protein --predictions "$OUT/protein/samples.fasta" --references pyhmmer-proteins \
        -o "$OUT/protein" ;;
    pocket)  # PoseBusters' complexes as its wheel ships them; one search each, the files merged for the evaluation
      complexes=$($L fetch posebusters-complexes 2>&1 | sed -n "s/.* -> //p" | tail -1)
      mkdir -p "$OUT/pocket/each"
      for f in "$complexes"/*_protein.pdb; do
        t $L generate --checkpoint "$CKPT" --task pocket -n 1 --seed "$SEED" -q --input "$f" \
          -o "$OUT/pocket/each/$(basename "$f" .pdb).pocket.csv"
      done
      awk 'FNR > 1 || NR == 1' "$OUT"/pocket/each/*.pocket.csv > "$OUT/pocket/samples.pocket.csv"
      t $L evaluate --task pocket --predictions "$OUT/pocket/samples.pocket.csv" --references "$complexes" \
        -o "$OUT/pocket" ;;
    retro)
      mkdir -p "$OUT/retro"
      t $PY benchmarks/retro_topk.py --checkpoint "$CKPT" --test "$DATA/uspto50k/raw_test.csv.xz" --items 200 \
        --samples 10 --seed "$SEED" --out "$OUT/retro/result.json" ;;
    *) echo "unknown task $task" >&2; exit 2 ;;
  esac
done
$PY benchmarks/logos_tiny_table.py "$OUT"
