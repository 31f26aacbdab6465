"""logos evaluate: each metric against values computed by hand or published with the reference implementation."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

ASSETS = Path(__file__).parent / "assets"
EV = ASSETS / "evaluate"
USPTO = EV / "uspto50k_test_20.csv"
PEROV = EV / "perov5_test_6.csv"


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOGOS_CACHE", str(tmp_path / "cache"))


def _cli(*args) -> int:
    from logos.cli import main

    return main(["evaluate", *map(str, args)])


# ---------------------------------------------------------------- molecules
# MOSES's own test (molsets 0.3.1 tests/test_metrics.py): these samples and test set, and the values
# its get_all_metrics gives (IntDiv, Filters; logP/SA/QED/weight are Wasserstein distances to the test set).
MOSES_GEN = ["CNC", "Oc1ccccc1-c1cccc2cnccc12", "INVALID", "CCCP", "Cc1noc(C)c1CN(C)C(=O)Nc1cc(F)cc(F)c1",
             "Cc1nc(NCc2ccccc2)no1-c1ccccc1"]
MOSES_TEST = ["Oc1ccccc1-c1cccc2cnccc12", "COc1cccc(NC(=O)Cc2coc3ccc(OC)cc23)c1"]


def test_molecule_metrics_reproduce_moses_published_values(tmp_path):
    from logos.evaluate import molecules as M

    test = tmp_path / "test.smi"
    test.write_text("\n".join(MOSES_TEST) + "\n")
    m = M.evaluate(MOSES_GEN, reference=test, train={"CNC"}, options=M.MoleculeOptions(property_sample=0))
    assert m["validity"] == pytest.approx(2 / 3)
    assert m["intdiv1"] == pytest.approx(0.7189187309761661, abs=1e-6)
    assert m["filters"] == pytest.approx(0.75)
    assert m["w_logp"] == pytest.approx(1.63229, abs=1e-4)
    # MOSES's SA target (0.5238) predates RDKit's current Morgan fingerprints: MOSES's own sascorer.py, run
    # on today's RDKit, gives exactly our per-molecule SA scores, whose distance is 0.6280 (checked by hand).
    assert m["w_sa"] == pytest.approx(0.6280362203189407, abs=1e-6)
    assert m["w_qed"] == pytest.approx(0.20370891752648637, abs=1e-6)
    assert m["w_mw"] == pytest.approx(106.87, abs=0.01)
    assert m["novelty"] == pytest.approx(3 / 4)  # CNC is in the training set
    assert m["test_in_train"] == 0
    # SNN/Test, Frag/Test, Scaf/Test as MOSES publishes them (its SNN is a float32 product: 1e-8 apart)
    assert m["snn_test"] == pytest.approx(0.3152585653588176, abs=1e-8)
    assert m["frag_test"] == pytest.approx(0.3, abs=1e-12)
    assert m["scaf_test"] == pytest.approx(0.5, abs=1e-12)
    assert "snn_testsf" not in m  # no scaffold-split set given


def test_nearest_similarity_equals_rdkit_tanimoto_on_real_molecules():
    """The integer-product SNN against RDKit's own BulkTanimotoSimilarity, chunks smaller than the sets."""
    from rdkit import Chem, DataStructs
    from rdkit.Chem import rdFingerprintGenerator

    from logos.evaluate.molecules import fingerprint_bits, internal_diversity, nearest_similarity

    smiles = [line.split()[0] for line in (ASSETS / "moses_500.smi").read_text().splitlines()]
    mols = [Chem.MolFromSmiles(s) for s in smiles]
    query, pool = mols[:70], mols[70:]
    ours = nearest_similarity(fingerprint_bits(query), fingerprint_bits(pool), chunk=32, ref_chunk=64)
    gen = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=1024)
    fps = [gen.GetFingerprint(m) for m in pool]
    theirs = [max(DataStructs.BulkTanimotoSimilarity(gen.GetFingerprint(q), fps)) for q in query]
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)
    qfps = [gen.GetFingerprint(q) for q in query]
    total = sum(sum(DataStructs.BulkTanimotoSimilarity(qfps[i], qfps[i + 1:])) for i in range(len(qfps) - 1))
    n = len(query)
    assert internal_diversity(query)[0] == pytest.approx(1 - (2 * total + n) / n ** 2, abs=1e-12)


def test_snn_frag_scaf_of_a_set_with_itself_and_with_a_disjoint_set(tmp_path):
    from logos.evaluate import molecules as M

    smiles = [line.split()[0] for line in (ASSETS / "moses_500.smi").read_text().splitlines()][:150]
    own = tmp_path / "own.smi"
    own.write_text("\n".join(smiles) + "\n")
    opts = M.MoleculeOptions(property_sample=0, workers=2)
    m = M.evaluate(smiles, reference=own, options=opts, scaffolds=own)
    for key in ("snn_test", "frag_test", "scaf_test", "snn_testsf", "frag_testsf", "scaf_testsf"):
        assert m[key] == pytest.approx(1.0, abs=1e-12), key
    # ring systems without a BRICS bond (each is its own single fragment) and with different two-ring scaffolds
    ring_a = ["c1ccc2ccccc2c1", "C1CCC2CCCCC2C1", "c1ccc2[nH]ccc2c1"]
    ring_b = ["c1ccc2occc2c1", "C1CCC2(CC1)CCCC2", "c1cnc2ccccc2n1"]
    ref_b = tmp_path / "b.smi"
    ref_b.write_text("\n".join(ring_b) + "\n")
    d = M.evaluate(ring_a, reference=ref_b, options=M.MoleculeOptions(property_sample=0))
    assert d["frag_test"] == 0.0 and d["scaf_test"] == 0.0
    assert 0 < d["snn_test"] < 1
    # scaffolds of one ring do not count (MOSES's min_rings=2): a set of them has no scaffold table
    assert M.evaluate(["c1ccccc1C", "CC1CCCCC1"], reference=ref_b, options=M.MoleculeOptions(property_sample=0))[
        "scaf_test"] is None


def _sampled(tmp_path, name, smiles, logps):
    path = tmp_path / f"{name}.smi"
    path.write_text("".join(f"{s}\tgen#{i}\n" for i, s in enumerate(smiles, 1)))
    path.with_name(f"{name}.samples.jsonl").write_text("".join(
        json.dumps({"id": "gen", "rank": i, "text": f"<MoleculeS>{s}<MoleculeE>", "logprob": lp, "status": "ok"}) + "\n"
        for i, (s, lp) in enumerate(zip(smiles, logps), 1)))
    return path


def test_unique_at_k_is_biased_only_when_the_file_is_ranked_and_then_evaluate_warns(tmp_path, capsys):
    import random

    from logos.evaluate import molecules as M

    pool = [line.split()[0] for line in (ASSETS / "moses_500.smi").read_text().splitlines() if line.strip()]
    likely, others = pool[:10], pool[10:210]
    # what a likelihood sort puts first: the few likely molecules, sampled ten times each
    samples = [(s, -5.0 - i / 100) for i, s in enumerate(likely) for _ in range(10)]
    samples += [(s, -20.0 - i / 10) for i, s in enumerate(others)]
    ranked = _sampled(tmp_path, "ranked", *zip(*samples))
    random.Random(0).shuffle(samples)
    drawn = _sampled(tmp_path, "drawn", *zip(*samples))
    assert M.ranked_by_likelihood(ranked) and not M.ranked_by_likelihood(drawn)
    opts = M.MoleculeOptions(unique_at=(100,), property_sample=0)
    biased = M.evaluate(M.read_molecules(ranked), reference=None, train=None, options=opts)["unique@100"]
    fair = M.evaluate(M.read_molecules(drawn), reference=None, train=None, options=opts)["unique@100"]
    assert biased == pytest.approx(0.10) and fair > 0.6  # the first 100 of a random order hold ~77 distinct
    ref = ASSETS / "molecules" / "moses_test_200.smi"
    for path, warned in ((ranked, True), (drawn, False)):
        assert _cli("--task", "molecule", "--predictions", path, "--references", ref, "-o", tmp_path / path.stem) == 0
        err = capsys.readouterr().err
        assert ("sorted by likelihood" in err) is warned
        notes = (tmp_path / path.stem / "report.md").read_text()
        assert ("sorted by likelihood" in notes) is warned


def test_sa_score_matches_rdkit_contrib_published_scores():
    from rdkit import Chem

    from logos.evaluate.molecules import sa_score

    with open(EV / "sascore_zim_20.tsv") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    assert len(rows) == 20
    for r in rows:
        assert sa_score(Chem.MolFromSmiles(r["smiles"])) == pytest.approx(float(r["sa_score"]), abs=5e-4), r["Name"]


def test_qed_of_known_drugs():
    from rdkit import Chem

    from logos.evaluate.molecules import properties

    # QED paper (Bickerton et al. 2012), as RDKit computes it: aspirin 0.55, caffeine 0.54 (two decimals)
    props = properties([Chem.MolFromSmiles("CC(=O)Oc1ccccc1C(=O)O"), Chem.MolFromSmiles("Cn1cnc2c1c(=O)n(C)c(=O)n2C")])
    assert props["qed"] == pytest.approx([0.55, 0.54], abs=0.006)


def test_tanimoto_diversity_on_hand_checked_pairs():
    from rdkit import Chem

    from logos.evaluate.molecules import internal_diversity

    # methane and ammonia share no Morgan bit: distance 1 for the pair; MOSES IntDiv counts the two
    # self-pairs (similarity 1) too: 1 - (1 + 1 + 0 + 0) / 4 = 0.5
    intdiv, pairwise = internal_diversity([Chem.MolFromSmiles("C"), Chem.MolFromSmiles("N")])
    assert (intdiv, pairwise) == (pytest.approx(0.5), pytest.approx(1.0))
    # ethanol vs propanol, by hand from the on-bit sets
    a, b = Chem.MolFromSmiles("CCO"), Chem.MolFromSmiles("CCCO")
    from rdkit.Chem import rdFingerprintGenerator

    gen = rdFingerprintGenerator.GetMorganGenerator(radius=2, fpSize=1024)
    sa, sb = set(gen.GetFingerprint(a).GetOnBits()), set(gen.GetFingerprint(b).GetOnBits())
    sim = len(sa & sb) / len(sa | sb)
    assert 0 < sim < 1
    assert internal_diversity([a, b])[1] == pytest.approx(1 - sim)


def test_moses_filters():
    from rdkit import Chem

    from logos.evaluate.molecules import passes_filters

    assert passes_filters(Chem.MolFromSmiles("CC(=O)Nc1ccc(O)cc1"))
    assert not passes_filters(Chem.MolFromSmiles("CC(=O)[O-]"))  # charged
    assert not passes_filters(Chem.MolFromSmiles("CCI"))  # iodine not allowed
    assert not passes_filters(Chem.MolFromSmiles("C1CCCCCCC1"))  # 8-membered ring
    assert not passes_filters(Chem.MolFromSmiles("O=C1NC(=S)SC1=Cc1ccccc1"))  # PAINS ene_rhod


def test_qed_properties_equal_rdkits_own():
    """QED's structural alerts are matched behind the pattern-fingerprint screen: the same eight numbers as RDKit."""
    from rdkit import Chem
    from rdkit.Chem import QED

    from logos.evaluate.molecules import properties, qed_properties

    smiles = [line.split()[0] for line in (ASSETS / "moses_500.smi").read_text().splitlines()]
    smiles += [line.split()[0] for line in (ASSETS / "molecules" / "pubchem_charged_stereo_120.smi").read_text()
               .splitlines() if line.strip()]
    mols = [m for m in (Chem.MolFromSmiles(s) for s in smiles) if m is not None]
    assert len(mols) > 550 and any(QED.properties(m).ALERTS for m in mols)
    for m in mols:
        assert qed_properties(m) == QED.properties(m), Chem.MolToSmiles(m)
    props = properties(mols[:100])
    assert props["qed"].tolist() == [QED.qed(m) for m in mols[:100]]


def test_filter_screen_never_drops_a_match():
    from rdkit import Chem

    from logos.evaluate.molecules import passes_filters, read_molecules

    mols = [Chem.MolFromSmiles(s) for s in read_molecules(ASSETS / "molecules" / "pubchem_charged_stereo_120.smi")
            + read_molecules(ASSETS / "molecules" / "chembl_actives_50.smi") + ["O=C1NC(=S)SC1=Cc1ccccc1"]]
    mols = [m for m in mols if m is not None]
    fast = [passes_filters(m) for m in mols]
    assert fast == [passes_filters(m, screen=False) for m in mols]
    assert 0 < sum(fast) < len(fast)


def test_fcd_of_a_set_with_itself_is_zero():
    import fcd  # noqa: F401  - the [fcd] extra is part of the test environment: never a silent skip

    from logos.evaluate import molecules as M

    path = ASSETS / "molecules" / "moses_test_200.smi"
    reference = M.load_reference(path, M.MoleculeOptions(property_sample=50))
    opts = M.MoleculeOptions(fcd_sample=0)
    assert M.fcd_score(reference.smiles, reference, opts) == pytest.approx(0.0, abs=1e-3)
    assert M.fcd_score(["CCO", "CCN", "c1ccccc1", "CC(C)O", "CCCC"] * 4, reference, opts) > 5


def test_molecule_cli_report_has_versions_definitions_and_digests(tmp_path):
    pred = tmp_path / "gen.smi"
    pred.write_text("\n".join(MOSES_GEN) + "\n")
    ref = ASSETS / "molecules" / "moses_test_200.smi"
    assert _cli("--task", "molecule", "--predictions", pred, "--references", ref, "-o", tmp_path / "rep") == 0
    doc = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    assert doc["evaluator"]["schema_version"] == 1 and doc["evaluator"]["logos_version"]
    assert doc["inputs"]["predictions"]["sha256"] == hashlib.sha256(pred.read_bytes()).hexdigest()
    assert doc["metrics"]["validity"] == pytest.approx(2 / 3)
    assert "Tanimoto" in doc["definitions"]["intdiv1"]
    assert {"molecules.png", "properties.png"} <= set(doc["figures"])
    assert "| validity | 0.6667 |" in (tmp_path / "rep" / "report.md").read_text()


def test_reference_cache_is_reused_and_safe(tmp_path):
    from logos.evaluate import molecules as M

    ref = tmp_path / "ref.smi"
    ref.write_text("OCC\nCCO\nC1=CC=CC=C1\nnot_a_smiles\n")
    first = M.load_reference(ref, M.MoleculeOptions(property_sample=0))
    assert first.smiles == ["CCO", "c1ccccc1"]  # canonical, deduplicated, invalid dropped
    cached = list((tmp_path / "cache" / "evaluate").iterdir())
    assert any(p.suffix == ".txt" for p in cached) and any(p.suffix == ".npy" for p in cached)
    assert not any(p.suffix in (".pkl", ".pickle") for p in cached)
    ref.write_text("CCN\n")  # a changed source is a new digest, never a stale cache
    assert M.load_reference(ref, M.MoleculeOptions(property_sample=0)).smiles == ["CCN"]


# ---------------------------------------------------------------- reactions
def _truth(n=20):
    from logos.evaluate.reactions import read_reference

    return read_reference(USPTO, n)


def test_top_k_on_five_reactions_with_known_ranks(tmp_path):
    from logos.evaluate.reactions import evaluate, read_predictions

    truth = _truth(5)
    wrong = [r.reactants for r in _truth(20)[10:19]]
    # reaction i's true reactants at rank 1, 2, 3, 5; reaction 5 never; ranks as written (#R)
    lines = []
    for i, rank in enumerate((1, 2, 3, 5, None), 1):
        answers = wrong[:4]
        if rank:
            answers = answers[:rank - 1] + [truth[i - 1].reactants] + answers[rank - 1:]
        lines += [f"{a}>>{truth[i - 1].product}\t{i}#{r}" for r, a in enumerate(answers, 1)]
    path = tmp_path / "pred.rsmi"
    path.write_text("\n".join(reversed(lines)) + "\n")  # file order must not matter when ranks are given
    m, rows = evaluate(truth, read_predictions(path))
    assert (m["top-1"], m["top-3"], m["top-5"], m["top-10"]) == (0.2, 0.6, 0.8, 0.8)
    assert m["invalid@1"] == 0 and m["answered"] == 1.0
    assert sum(r["n"] for r in rows) == 5


def test_retro_known_answers_on_uspto50k_slice(tmp_path):
    truth = _truth()
    exact = tmp_path / "truth.jsonl"
    exact.write_text("".join(json.dumps({"id": r.id, "answers": [r.reactants]}) + "\n" for r in truth))
    assert _cli("--task", "retro", "--predictions", exact, "--references", USPTO, "-o", tmp_path / "a") == 0
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())["metrics"]
    assert m["n"] == 20 and m["top-1"] == 1.0
    third = tmp_path / "third.jsonl"  # two other reactions' reactants first, the truth third
    third.write_text("".join(json.dumps({"id": r.id, "answers": [truth[(i + 1) % 20].reactants,
                                                                 truth[(i + 2) % 20].reactants, r.reactants]}) + "\n"
                             for i, r in enumerate(truth)))
    assert _cli("--task", "retro", "--predictions", third, "--references", USPTO, "-o", tmp_path / "b") == 0
    m = json.loads((tmp_path / "b" / "metrics.json").read_text())["metrics"]
    assert (m["top-1"], m["top-3"]) == (0.0, 1.0)


def test_canonical_set_is_a_fixed_point():
    from logos.evaluate.reactions import canonical_set

    # a USPTO-50k test reaction: RDKit flips @@/@ of this trans-1,4-cyclohexane on a second pass
    once = canonical_set("Cc1ccnc(Cl)n1.O[C@@H]1CC[C@@H](N2CCNCC2)CC1")
    assert canonical_set(once) == once


def test_reaction_answers_matched_by_product_and_atom_maps_ignored(tmp_path):
    from logos.evaluate.reactions import evaluate, read_predictions

    raw = list(csv.reader(open(USPTO)))[1:4]
    path = tmp_path / "mapped.rsmi"  # the atom-mapped ground truth itself, ids unknown to the reference
    path.write_text("".join(f"{row[2]}\tpatent-{k}\n" for k, row in enumerate(raw)))
    m, _ = evaluate(_truth(3), read_predictions(path))
    assert m["top-1"] == 1.0
    path.write_text("C1CC>>CC\tx\n")  # unparseable answer
    m, _ = evaluate(_truth(3), read_predictions(path))
    assert m["top-1"] == 0.0 and m["invalid@1"] == 1.0


def test_repeated_patent_ids_never_score_one_products_answers_against_another(tmp_path):
    from logos.evaluate.reactions import evaluate, match, read_predictions, read_reference
    from logos.util.records import InputError

    rows = list(csv.reader(open(USPTO)))
    ref = tmp_path / "ref.csv"  # rows 1 and 2 share a patent id, as 819 test reactions of USPTO-50k do
    rows[2][0] = rows[1][0]
    ref.write_text("".join(",".join(r) + "\n" for r in rows[:6]))
    truth = read_reference(ref)
    assert truth[0].name == truth[1].name and truth[0].product != truth[1].product
    # the second reaction's answers, written under the shared patent id with their product: scored on row 2 only
    given = tmp_path / "given.rsmi"
    given.write_text(f"{truth[1].reactants}>>{truth[1].product}\t{truth[1].name}\n")
    assert set(match(truth, read_predictions(given))) == {"2"}
    m, _ = evaluate(truth, read_predictions(given))
    assert m["top-1"] == pytest.approx(1 / 5) and m["answered"] == pytest.approx(1 / 5)
    # the same answers without their input cannot say which reaction they answer: refused in one line
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"id": truth[1].name, "answers": [truth[1].reactants]}) + "\n")
    with pytest.raises(InputError, match=r"id 'US\w+' names 2 reference reactions \(rows 1, 2\)"):
        evaluate(truth, read_predictions(bare), source=str(bare))
    assert _cli("--task", "retro", "--predictions", bare, "--references", ref, "-o", tmp_path / "r") == 2
    # row numbers and ids that name one row still work without an input
    by_row = tmp_path / "rows.jsonl"
    by_row.write_text(json.dumps({"id": "2", "answers": [truth[1].reactants]}) + "\n"
                      + json.dumps({"id": truth[2].name, "answers": [truth[2].reactants]}) + "\n")
    m, _ = evaluate(truth, read_predictions(by_row))
    assert m["top-1"] == pytest.approx(2 / 5)


def test_retro_report_gives_wilson_intervals_for_top_k(tmp_path):
    truth = _truth()
    half = tmp_path / "half.jsonl"
    half.write_text("".join(json.dumps({"id": r.id, "answers": [r.reactants if i % 2 else r.product]}) + "\n"
                            for i, r in enumerate(truth)))
    assert _cli("--task", "retro", "--predictions", half, "--references", USPTO, "-o", tmp_path / "h") == 0
    doc = json.loads((tmp_path / "h" / "metrics.json").read_text())
    assert doc["metrics"]["top-1"] == 0.5
    (row,) = [r for r in doc["tables"]["95% intervals (Wilson)"] if r["metric"] == "top-1"]
    assert row["low"] == pytest.approx(0.2993, abs=1e-3) and row["high"] == pytest.approx(0.7007, abs=1e-3)


# ---------------------------------------------------------------- crystals
def _perov():
    from logos.evaluate.crystals import read_items

    return read_items(PEROV)


def _moved(item, scale=1.02, noise=0.01, seed=0, ident=None, rank=1):
    from logos.evaluate.crystals import Item

    rng = np.random.default_rng(seed)
    frac = (np.array(item.frac) + rng.normal(0, noise, np.shape(item.frac))) % 1.0
    return Item(ident or item.id, rank, (np.array(item.matrix) * scale).tolist(), item.species, frac.tolist())


def test_csp_tolerances_match_a_perturbed_copy_and_miss_another_prototype():
    from logos.evaluate.crystals import Item, evaluate_csp

    target = _perov()[0]
    m = evaluate_csp([_moved(target)], [target])
    assert m["match_rate@1"] == 1.0 and 0 < m["rmse@1"] < 0.1
    # same composition in a hexagonal cell (a layered arrangement): another prototype
    hexa = Item(target.id, 1, [[5.6, 0, 0], [-2.8, 4.85, 0], [0, 0, 7.0]], target.species,
                [[0, 0, 0], [1 / 3, 2 / 3, 0.5], [0.5, 0, 0.25], [0.5, 0.5, 0.75], [0, 0.5, 0.25]])
    assert evaluate_csp([hexa], [target])["match_rate@20"] == 0.0
    # best of n: the miss ranked first, the copy second -> n=1 misses, n=20 matches
    m = evaluate_csp([hexa, _moved(target, rank=2)], [target])
    assert (m["match_rate@1"], m["match_rate@20"]) == (0.0, 1.0)


def test_uniqueness_and_novelty_with_planted_duplicates():
    from logos.evaluate.crystals import evaluate

    items = _perov()
    assert len(items) == 6
    planted = items[:4] + [_moved(items[1], seed=1, ident="dup1"), _moved(items[2], seed=2, ident="dup2")]
    m = evaluate(planted, reference=items, train=[items[0], _moved(items[3], seed=3)])
    assert m["structural_validity"] == 1.0
    valid = round(m["validity"] * 6)
    assert valid == 6
    assert m["uniqueness"] == pytest.approx(4 / 6)  # two planted duplicates
    assert m["novelty"] == pytest.approx(2 / 4)  # items 0 and 3 are in the training corpus
    assert m["w_num_elements"] is not None


def test_crystal_validity_reuses_materials_checks(tmp_path):
    from logos.evaluate.crystals import Item, evaluate

    clash = Item("c", 1, [[4, 0, 0], [0, 4, 0], [0, 0, 4]], ["Na", "Cl"], [[0, 0, 0], [0.05, 0, 0]])
    bad_charge = Item("b", 1, [[4, 0, 0], [0, 4, 0], [0, 0, 4]], ["Na", "Na", "Cl"],
                      [[0, 0, 0], [0.5, 0.5, 0.5], [0.5, 0, 0]])
    m = evaluate([clash, bad_charge])
    assert m["structural_validity"] == 0.5 and m["compositional_validity"] == 0.5 and m["validity"] == 0.0


def test_crystal_cli_on_a_cif_folder(tmp_path):
    folder = tmp_path / "cifs"
    folder.mkdir()
    for name in ("mp_dielectric_142.cif", "mp_dielectric_356.cif", "NaCl.cif"):
        (folder / name).write_text((ASSETS / "crystal" / name).read_text())
    assert _cli("--task", "crystal", "--predictions", folder, "--references", PEROV, "-o", tmp_path / "r") == 0
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())["metrics"]
    assert m["n"] == 3 and m["structural_validity"] == 1.0


def test_crystal_grammar_text_checks_space_group_and_multiplicity(tmp_path):
    from logos.cli import main

    corpus = tmp_path / "c.jsonl"
    assert main(["tokenize", str(ASSETS / "crystal" / "NaCl.cif"), str(ASSETS / "crystal" / "mp_dielectric_142.cif"),
                 "-o", str(corpus), "-q"]) == 0
    lines = corpus.read_text().splitlines()
    rec = json.loads(lines[-1])
    start = rec["text"].index("<sg")
    stated = rec["text"][start:rec["text"].index(">", start) + 1]
    assert stated != "<sg1>"
    # grammar v2 expands every site with the stated group, so a text states a wrong group only when its
    # sites have more symmetry than it says: one atom in a cubic cell, stated as P1 (spglib finds Pm-3m)
    wrong = dict(rec, text="<CrystalS><sg1>5.640 5.640 5.640 90.00 90.00 90.00 Na<wa> 0.0000 0.0000 0.0000<CrystalE>")
    corpus.write_text("\n".join(lines + [json.dumps(wrong)]) + "\n")
    assert _cli("--task", "crystal", "--predictions", corpus, "--references", PEROV, "-o", tmp_path / "r") == 0
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())["metrics"]
    assert m["n"] == 3 and m["structural_validity"] == 1.0
    assert m["space_group_consistency"] == pytest.approx(2 / 3)  # the P1 text states a wrong group


# ---------------------------------------------------------------- pockets, proteins, MOFs
def test_pocket_precision_recall_and_dcc_on_a_hand_made_pocket():
    from logos.evaluate.pockets import Site, evaluate

    res = {("A", i, ""): np.array([[float(i), 0.0, 0.0]]) for i in range(1, 11)}
    ligand = np.array([[2.0, 1.0, 0.0], [4.0, 1.0, 0.0]])  # centre (3, 1, 0)
    site = Site("toy", res, [(ligand, {("A", 1, ""), ("A", 2, ""), ("A", 3, ""), ("A", 4, "")})])
    # predicted residues 2..5: 3 of 4 right -> P = R = 0.75; centre (3.5, 0, 0) is 1.12 A from the ligand centre
    pred = {"toy": {1: {("A", 2, ""), ("A", 3, ""), ("A", 4, ""), ("A", 5, "")}}}
    m = evaluate([site], pred)
    assert (m["precision"], m["recall"], m["f1"]) == (0.75, 0.75, 0.75)
    assert m["dcc"] == 1.0 and m["dca"] == 1.0
    # a far pocket first (centre x = 9): misses at top-1 (n = 1 ligand), found within top-(n+2)
    far = {"toy": {1: {("A", 9, "")}, 2: {("A", 3, "")}}}
    m = evaluate([site], far)
    assert (m["dcc"], m["dcc_top_n2"], m["precision"]) == (0.0, 1.0, 0.0)


@pytest.mark.parametrize("ident", ["1ia1", "1ia1_protein.pdb"])  # the second: logos generate on 1ia1_protein.pdb
def test_pocket_cli_on_a_real_complex(tmp_path, ident):
    from logos.evaluate.pockets import read_sites

    refs = tmp_path / "complexes"
    refs.mkdir()
    import gzip

    (refs / "1ia1_protein.pdb").write_bytes(gzip.decompress((ASSETS / "protein" / "1ia1_protein.pdb.gz").read_bytes()))
    (refs / "1ia1_ligand.sdf").write_text((ASSETS / "protein" / "1ia1_ligand.sdf").read_text())
    site = read_sites(refs)[0]
    truth = sorted(site.ligands[0][1])
    pred = tmp_path / "p.pocket.csv"
    with open(pred, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "chain", "res_num", "icode", "res_name"])
        w.writerows([[f"{ident}#1", c, n, i, "X"] for c, n, i in truth[: len(truth) // 2]])
    assert _cli("--task", "pocket", "--predictions", pred, "--references", refs, "-o", tmp_path / "r") == 0
    m = json.loads((tmp_path / "r" / "metrics.json").read_text())["metrics"]
    assert m["precision"] == 1.0 and m["recall"] == pytest.approx((len(truth) // 2) / len(truth))


def test_protein_identity_and_composition():
    from logos.evaluate.proteins import evaluate, identity

    assert identity("ACDEFGHIKL", "ACDEFGHIKL") == 1.0
    assert identity("ACDEFGHIKL", "ACDEFGHIKM") == pytest.approx(0.9)
    m = evaluate(["ACDEFGHIKL", "ACDEFGHIKL", "MKV"], reference=["ACDEFGHIKL"], train=["ACDEFGHIKM", "WWWWW"])
    assert m["uniqueness"] == pytest.approx(2 / 3)
    assert m["identity_max"] == pytest.approx(0.9)
    assert 0 < m["aa_js_divergence"] < 1


def test_mof_connection_points_and_vnu():
    from logos.evaluate.mofs import MofCorpus, connection_points, evaluate, mof_key

    assert connection_points("OC(=O)c1ccc(C(=O)O)cc1") == 2  # terephthalic acid
    assert connection_points("OC(=O)c1ccccc1") == 1  # benzoic acid: caps, cannot bridge
    assert connection_points("c1cc(-c2ccncc2)ccn1") == 2  # 4,4'-bipyridine

    def text(node, *linkers):
        return "<MaterialS><MetalS>" + node + "<MetalE>" + "".join(f"<MoleculeS>{s}<MoleculeE>" for s in linkers) \
            + "<MaterialE>"
    known = text("Zn4O", "O=C(O)c1ccc(C(=O)O)cc1")
    samples = [known, text("Zn4O", "OC(=O)c1ccc(cc1)C(O)=O"), text("Cu2", "O=C(O)c1cc(C(=O)O)cc(C(=O)O)c1"),
               text("Zn4O", "OC(=O)c1ccccc1"), text("Xx9", "O=C(O)c1ccc(C(=O)O)cc1")]
    corpus = MofCorpus({mof_key(known), mof_key(text("Cu2", "O=C(O)c1ccc(C(=O)O)cc1"))}, {"Zn4O", "Cu2"})
    m = evaluate(samples, corpus)
    assert m["valid"] == pytest.approx(3 / 5)  # benzoic acid cannot bridge; node Xx9 unseen
    assert m["unique"] == pytest.approx(2 / 3)  # the same MOF written twice
    assert m["novel"] == pytest.approx(1 / 2) and m["vnu"] == pytest.approx(1 / 5)


def test_mof_json_of_generate_reads_as_its_texts(tmp_path):
    from logos.cli import main
    from logos.evaluate.mofs import evaluate, read_texts
    from logos.util.records import InputError

    texts = ["<MaterialS><MetalS>Zn4O<MetalE><MoleculeS>O=C([O-])c1ccc(C(=O)[O-])cc1<MoleculeE><MaterialE>",
             "<MaterialS><MetalS>Cu2<MetalE><MoleculeS>c1cc(-c2ccncc2)ccn1<MoleculeE><MoleculeS>CC<MoleculeE>"
             "<MaterialE>"]
    jsonl = tmp_path / "mof.samples.jsonl"
    jsonl.write_text("".join(json.dumps({"id": "gen", "text": t}) + "\n" for t in texts))
    out = tmp_path / "mof.json"
    assert main(["detokenize", str(jsonl), "-o", str(out), "-q"]) == 0
    assert read_texts(out) == texts
    assert evaluate(read_texts(out)) == evaluate(read_texts(jsonl))
    (tmp_path / "other.json").write_text('{"lattice": {}}')
    with pytest.raises(InputError):
        read_texts(tmp_path / "other.json")


def test_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    assert _cli("--task", "retro", "--predictions", bad, "--references", USPTO, "-o", tmp_path / "r") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "bad.jsonl:1" in err[0]


def test_cdvae_coverage_of_a_set_by_itself_and_by_a_disjoint_set(tmp_path):
    """COV-R/COV-P: a set covers itself fully; structures of another family (HgS chains, layered GaSe, PF5 molecules)
    cover no perovskite; half the set plus the strangers covers half and is half precise."""
    from logos.evaluate.crystals import coverage, fingerprints, load_set, read_items, reference_fingerprints

    perov = load_set(PEROV)
    ref_fps = reference_fingerprints(PEROV, perov, workers=2)
    assert ref_fps[0].shape == (6, 61) and ref_fps[1].shape == (6, 132) and not np.isnan(ref_fps[0]).any()
    assert coverage(fingerprints(perov, workers=2), ref_fps) == {"cov_recall": 1.0, "cov_precision": 1.0}
    strangers = [read_items(ASSETS / "crystal" / f)[0] for f in ("mp_dielectric_3639.cif", "mp_dielectric_3559.cif",
                                                               "mp_dielectric_142.cif")]
    assert coverage(fingerprints(strangers), ref_fps) == {"cov_recall": 0.0, "cov_precision": 0.0}
    mixed = perov[:3] + strangers
    assert coverage(fingerprints(mixed, workers=2), ref_fps) == {"cov_recall": 0.5, "cov_precision": 0.5}
    # cached: the second read of the reference's fingerprints is the same array
    again = reference_fingerprints(PEROV, perov)
    np.testing.assert_array_equal(again[0], ref_fps[0])
