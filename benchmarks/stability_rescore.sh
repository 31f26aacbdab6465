#!/usr/bin/env bash
# The shipped model under the stability metrics (`logos evaluate --stability`: CHGNet relaxation, energy above an
# ML-potential hull of known phases, S.U.N.): N unconditional crystals against the Materials Project reference set
# (mp-dielectric: its crystals in the chemical systems the samples touch are the known phases), and ITEMS Perov-5 test
# compositions predicted (SAMPLES each by benchmarks/csp_match.py; the most likely one relaxed, against the picked
# test structures). Wall times go to $OUT/times.txt; benchmarks/stability_summary.py prints the table.
#
#   DATA=DIR benchmarks/stability_rescore.sh [OUT]      (DIR holds cdvae/perov_5_test.csv.xz; make rescore-stability)
#
# N (200), ITEMS (100), SAMPLES (20), WORKERS (relaxation processes, 2), CKPT (checkpoints/logos-tiny), SEED (0),
# RELAX_STEPS (300), RELAX_SECONDS (60 per structure).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench_stability}
PY=${PY:-.venv/bin/python}
CKPT=${CKPT:-checkpoints/logos-tiny}
N=${N:-200} ITEMS=${ITEMS:-100} SAMPLES=${SAMPLES:-20} WORKERS=${WORKERS:-2} SEED=${SEED:-0}
RELAX=(--relax-steps "${RELAX_STEPS:-300}" --relax-seconds "${RELAX_SECONDS:-60}" --workers "$WORKERS")
DATA=${DATA:?set DATA to the folder holding cdvae/perov_5_test.csv.xz}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} PYTHONPATH=${PYTHONPATH:-.}
mkdir -p "$OUT/crystal" "$OUT/csp"
L="$PY -m logos.cli"  # exit status 1 (some samples or structures failed, each listed) does not stop the run
t() { local s; s=$(date +%s); echo "+ $*" >&2; "$@" || [[ $? == 1 ]]; echo "$(( $(date +%s) - s )) s: $*" >> "$OUT/times.txt"; }

t $L generate --checkpoint "$CKPT" --task crystal -n "$N" --seed "$SEED" -q -o "$OUT/crystal/samples.cif"
t $L evaluate --task crystal --predictions "$OUT/crystal/samples.samples.jsonl" --references mp-dielectric --stability \
  "${RELAX[@]}" -o "$OUT/crystal"
t $PY benchmarks/csp_match.py --checkpoint "$CKPT" --test "$DATA/cdvae/perov_5_test.csv.xz" --items "$ITEMS" \
  --samples "$SAMPLES" --seed "$SEED" --work "$OUT/csp" --out "$OUT/csp/result.json"
t $L evaluate --task csp --predictions "$OUT/csp/out.samples.jsonl" --references "$OUT/csp/reference.csv" --stability \
  "${RELAX[@]}" -o "$OUT/csp/stability"
$PY benchmarks/stability_summary.py "$OUT"
