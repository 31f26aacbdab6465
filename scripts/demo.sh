#!/usr/bin/env bash
# make demo: tokenize and detokenize sample files of every supported domain, then (when present)
# the end-to-end model pipeline. Outputs go to demo_out/ (override with DEMO_OUT=...).
set -euo pipefail
cd "$(dirname "$0")/.."
LOGOS=${LOGOS:-.venv/bin/logos}
OUT=${DEMO_OUT:-demo_out}
A=tests/assets
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

if [[ -x scripts/demo_train.sh ]]; then
    echo "== model: pack, pretrain (tiny, CPU), generate"
    OUT="$OUT" bash scripts/demo_train.sh
fi

echo
echo "Outputs in $OUT/:"
ls -1 "$OUT" | sed 's/^/  /'
echo "First records:"
head -3 "$OUT/molecules.jsonl" | tail -2 | cut -c1-160
head -2 "$OUT/reactions.jsonl" | tail -1 | cut -c1-200
