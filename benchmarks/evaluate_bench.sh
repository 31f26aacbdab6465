#!/usr/bin/env bash
# logos evaluate on every task: the shipped tiny-moses model (molecule) and ground truth / simple baselines
# (the other tasks have no shipped model yet). Prints each command's wall time; reports land in $OUT/<task>/.
# Usage: DATA=DIR benchmarks/evaluate_bench.sh [OUT]   (DIR holds USPTO-50k's raw_test.csv.xz and CDVAE's
# perov_5_test.csv.xz, under uspto50k/ and cdvae/)
set -euo pipefail
OUT=${1:-bench_eval}
PY=${PY:-.venv/bin/python}
SHARED=${DATA:?set DATA to the folder holding uspto50k/ and cdvae/}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"
t() { local s=$(date +%s.%N); "$@"; echo "TIME $(echo "$(date +%s.%N) - $s" | bc) s: $*" | tee -a "$OUT/times.txt"; }
L="$PY -m logos.cli"

# molecule: 1,000 samples of the shipped model vs MOSES test (novelty vs MOSES train, as stored)
t $L generate --checkpoint checkpoints/tiny-moses --task molecule -n 1000 -o "$OUT/tiny_moses.smi" --seed 0 -q
t $L evaluate --task molecule --predictions "$OUT/tiny_moses.smi" --references moses-test --train moses-train \
  --train-as-given --fcd -o "$OUT/molecule"
# speed: 10,000 molecules (MOSES scaffold test sample), all metrics but FCD; run twice: cold then warm cache
$L fetch moses-test-scaffolds --limit 10000 -o "$OUT/scaffolds_10k.smi"
t $L evaluate --task molecule --predictions "$OUT/scaffolds_10k.smi" --train moses-train --train-as-given -o "$OUT/molecule_10k"
t $L evaluate --task molecule --predictions "$OUT/scaffolds_10k.smi" --train moses-train --train-as-given -o "$OUT/molecule_10k"

# retro: the full USPTO-50k test split, ground truth as answers (top-1 must be 100%), then the truth third
$PY - "$SHARED/uspto50k/raw_test.csv.xz" "$OUT" <<'PYEOF'
import json, sys
from logos.evaluate.reactions import read_reference
ref = read_reference(sys.argv[1])
with open(f"{sys.argv[2]}/retro_truth.jsonl", "w") as a, open(f"{sys.argv[2]}/retro_third.jsonl", "w") as b:
    for i, r in enumerate(ref):
        a.write(json.dumps({"id": r.id, "answers": [r.reactants]}) + "\n")
        b.write(json.dumps({"id": r.id, "answers": [ref[(i + 1) % len(ref)].reactants,
                                                    ref[(i + 2) % len(ref)].reactants, r.reactants]}) + "\n")
PYEOF
t $L evaluate --task retro --predictions "$OUT/retro_truth.jsonl" --references "$SHARED/uspto50k/raw_test.csv.xz" -o "$OUT/retro_truth"
t $L evaluate --task retro --predictions "$OUT/retro_third.jsonl" --references "$SHARED/uspto50k/raw_test.csv.xz" -o "$OUT/retro_third"

# crystal structure prediction: Perov-5 test, ground truth as the one candidate (first 500)
t $L evaluate --task csp --predictions "$SHARED/cdvae/perov_5_test.csv.xz" --references "$SHARED/cdvae/perov_5_test.csv.xz" \
  --limit 500 -o "$OUT/csp_truth"
# unconditional crystals: 500 Materials Project structures as "samples" vs the whole set (its training corpus here)
$PY - "$OUT" <<'PYEOF'
import json, sys
from logos.data.datasets import fetch
d = json.load(open(fetch("mp-dielectric")))["structure"]
keys = list(d)[:500]
json.dump({"structure": {k: d[k] for k in keys}}, open(f"{sys.argv[1]}/mp_500.json", "w"))
PYEOF
t $L evaluate --task crystal --predictions "$OUT/mp_500.json" --references mp-dielectric --train "$OUT/mp_500.json" -o "$OUT/crystal_truth"

# pockets and ligands: the PoseBusters complexes; ground-truth pockets, and the crystal ligands (Vina)
$PY - "$OUT" <<'PYEOF'
import csv, json, sys
from logos.data.datasets import fetch
from logos.evaluate.pockets import read_sites
from rdkit import Chem
folder = fetch("posebusters-complexes")
with open(f"{sys.argv[1]}/truth.pocket.csv", "w", newline="") as fh:
    w = csv.writer(fh); w.writerow(["id", "chain", "res_num", "icode", "res_name"])
    for s in read_sites(folder):
        w.writerows([[f"{s.name}#1", *k, ""] for k in sorted(s.ligands[0][1])])
with open(f"{sys.argv[1]}/ligands.jsonl", "w") as fh:
    for sdf in sorted(folder.glob("*_ligand.sdf")):
        m = next(iter(Chem.SDMolSupplier(str(sdf))))
        fh.write(json.dumps({"id": sdf.name.split("_")[0], "smiles": Chem.MolToSmiles(m)}) + "\n")
print(folder)
PYEOF
PB=$($PY -c "from logos.data.datasets import fetch; print(fetch('posebusters-complexes'))")
t $L evaluate --task pocket --predictions "$OUT/truth.pocket.csv" --references "$PB" -o "$OUT/pocket_truth"
t $L evaluate --task ligand --predictions "$OUT/ligands.jsonl" --references "$PB" --vina -o "$OUT/ligand_crystal"

# MOFs: six CoRE MOF CIFs of the test assets as samples, the same as training corpus (novelty 0 by construction)
t $L evaluate --task mof --predictions tests/assets/mof --train tests/assets/mof -o "$OUT/mof_truth"

# proteins: pyhmmer's sequences as reference; LuxC test sequences as samples, pyhmmer's as training corpus
t $L evaluate --task protein --predictions tests/assets/protein/LuxC.faa --references pyhmmer-proteins \
  --train pyhmmer-proteins -o "$OUT/protein_luxc"
