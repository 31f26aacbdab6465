"""Row constraints (logos.decoding.rows): exact, cheap, and every row can end.

Validity is recomputed with plain RDKit / pymatgen / gemmi, never with logos's own checks.
"""

from __future__ import annotations

import random
import re

import pytest
import torch
from rdkit import Chem, rdBase

from conftest import REPO
from train_fixtures import random_checkpoint
from logos.generate import GenerateOptions, Sampling, generate
from logos.decoding.chemistry import SmilesError, SmilesState
from logos.decoding.constraints import TokenTable
from logos.decoding.ending import plan_ending
from logos.decoding.rows import CopyRow, SmilesRow, SmilesVocab
from logos.tasks.prompts import PromptOptions

TOKENIZER = REPO / "tokenizers" / "default"
REAL = ["CC(=O)Oc1ccccc1C(=O)O", "Cc1ccc(NC(=O)C2CCN(c3ncccn3)CC2)cc1C", "O=C(NCc1ccco1)c1ccc2c(c1)OCO2",
        "COc1ccc(-c2nc3ccccc3c(=O)n2C)cc1OC", "CN1CCN(C(=O)c2cc3cc(Cl)ccc3[nH]2)CC1", "C[C@@H](N)C(=O)[O-].[Na+]"]


def _valid(smiles: str) -> bool:
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles)
    return mol is not None and mol.GetNumAtoms() > 0


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER))


@pytest.fixture(scope="module")
def vocab(tok):
    return SmilesVocab(TokenTable(tok, 2432))


def test_real_molecules_pass_token_by_token_and_close(tok, vocab):
    """Every token of real molecules is accepted (the shipped model's first piece ``Cc1cc`` included) and the span
    closes; the check is cheap enough to run on every draw."""
    import time

    checks, seconds = 0, 0.0
    for smi in REAL:
        row = SmilesRow(vocab, "<MoleculeS>")
        for t in tok(smi, add_special_tokens=False)["input_ids"] + [vocab.close_id]:
            start = time.perf_counter()
            ok = row.check(t, 96)
            seconds += time.perf_counter() - start
            checks += 1
            assert ok, (smi, tok.convert_ids_to_tokens(t), row.smiles)
            row.advance(t)
        assert row.state is None
    assert seconds / checks < 2e-3, f"{1e6 * seconds / checks:.0f} us per check"


@pytest.mark.parametrize("prefix", ["Cc1cc", "c1ccc(", "C1CC(C2", "c1cc[nH", "CC(=O", "c1ccc2c(c1)", "C#",
                                    "c1ccccc1-c1cc", "c1c2c3c4", "n1ccc", "[NH3+", "C(C(C(C(", "c1ccccc1C%12CC",
                                    # a seven-membered aromatic ring: ends with an exocyclic double bond (a tropone)
                                    "COc1ccc(OC)c(NC(=O)C)cc1",
                                    # an aromatic atom on no ring, before a branch: a new ring through it
                                    "c(-c2ccccc2", "C[C@H](Cs",
                                    # an aromatic atom with three connections whose ring is still to be written
                                    "COs", "CC(=O)s",
                                    # an aromatic atom past its branch: a ring through a second branch, c(=O)(c1)c1
                                    "c(=O)"])
def test_planned_ending_closes_validly(prefix):
    state = SmilesState()
    state.feed(prefix)
    plan = plan_ending(state)
    assert plan is not None and _valid(prefix + plan), (prefix, plan)


@pytest.mark.parametrize("smiles", ["CC(C)c1cc1c1cc1", "c1cc1c1cc1", "C[C@H]1(CSSc1c1cc1)", "c1ccccc1c1ccccc1",
                                    "c1ccccc1-c1ccccc1", "c1ccc2ccccc2c1", "O=c1cc1c1ccccc1", "c1ccc(-c2ccccn2)nc1",
                                    "c1ccc2c(c1)[nH]c1ccccc12"])
def test_a_span_closes_exactly_when_rdkit_reads_it(smiles):
    """An aromatic bond between two rings (``c1cc1c1cc1``) is single to RDKit, so no kekulé structure may use it:
    three-membered aromatic rings joined that way cannot close, biphenyl and fused rings can."""
    state = SmilesState()
    state.feed(smiles)
    assert state.can_close() == _valid(smiles), smiles


@pytest.mark.parametrize("broken", ["C()", "C((C)C)", "C(C)()"])
def test_empty_branches_are_refused(broken):
    state = SmilesState()
    with pytest.raises(SmilesError):
        state.feed(broken)


def test_copy_on_write_copies_are_independent():
    a = SmilesState()
    a.feed("c1ccccc1C(")
    b = a.copy()
    b.feed("=O)O")
    assert b.can_close() and not a.can_close()
    a.feed("C)N")
    assert a.can_close() and _valid("c1ccccc1C(C)N")
    assert [x.used for x in a.atoms] != [x.used for x in b.atoms]


def test_a_span_rdkit_refuses_fails_when_the_row_settles(tok, vocab):
    """RDKit reads each closed span once the row has ended, outside the steps: a span whose aromatic system the
    state machine cannot see is unkekulizable (a random model wrote it) closes, and the row then fails; a valid
    span passes."""
    bad = "[B-]23c1cccnc1CON1CN1CC(F)NC(=O)cs3CCINCOC(=O)CCC45n1c(C(C)C)c2c4c51"
    for smiles, failure in ((bad, "kekulize"), ("c1ccc2c(c1)[nH]c1ccccc12", None)):
        row = SmilesRow(vocab, "<MoleculeS>")
        for t in tok(smiles, add_special_tokens=False)["input_ids"]:
            row.advance(t)
        assert row.check(vocab.close_id, 10), smiles
        row.advance(vocab.close_id)
        assert row.settle() == failure and _valid(smiles) == (failure is None), smiles


def test_fork_is_independent(tok, vocab):
    row = SmilesRow(vocab, "<MoleculeS>")
    for t in tok("c1ccc", add_special_tokens=False)["input_ids"]:
        row.advance(t)
    other = row.fork()
    for t in tok("cc1", add_special_tokens=False)["input_ids"]:
        other.advance(t)
    assert other.check(vocab.close_id, 10) and not row.check(vocab.close_id, 10)


def test_matching_agrees_with_networkx():
    import networkx as nx

    from logos.decoding.aromatic import perfect_matching

    class A:
        def __init__(self):
            self.aromatic_bonds = set()

    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(2, 14)
        atoms = [A() for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                if rng.random() < 0.3:
                    atoms[i].aromatic_bonds.add(j)
                    atoms[j].aromatic_bonds.add(i)
        need = [i for i in range(n) if rng.random() < 0.8]
        g = nx.Graph()
        g.add_nodes_from(need)
        g.add_edges_from((i, j) for i in need for j in atoms[i].aromatic_bonds if j in need and i < j)
        expected = 2 * len(nx.max_weight_matching(g, maxcardinality=True)) == len(need)
        assert perfect_matching(atoms, need) == expected


def test_near_the_budget_every_accepted_token_keeps_an_ending(tok, vocab):
    """With a few tokens left, a token that opens more than the budget can close is refused, and the plan fits."""
    row = SmilesRow(vocab, "<MoleculeS>")
    for t in tok("c1ccc", add_special_tokens=False)["input_ids"]:
        row.advance(t)
    opener = [i for i, t in enumerate(vocab.text) if vocab.smiles[i] and t.count("(") > t.count(")")]
    assert opener and not any(row.check(i, 2) for i in opener)  # a branch to close, the ring, the closing tag
    plan = row.ending(6)
    assert plan is not None and len(plan) <= 6 and plan[-1] == vocab.close_id
    assert _valid("c1ccc" + "".join(vocab.text[t] for t in plan[:-1]))


def test_copy_row_budgets_pocket_marks(tok):
    table = TokenTable(tok, 2432)
    row = CopyRow(table, "<ProteinS>MKTA<ProteinE><Search>")
    ps, pe, s, e = (table.id[t] for t in ("<PocketS>", "<PocketE>", "<ProteinS>", "<ProteinE>"))
    assert row.need() == 4 + 2 + 1
    row.advance(s)
    assert row.check(ps, 8) and not row.check(ps, 6)   # mark, M, end mark, KTA, close, eos: 7 after this one
    row.advance(ps)
    assert row.need() == 4 + 1 + 1 + 1


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("random") / "ckpt")


def test_random_model_molecule_rows_end_and_are_valid(random_model, tmp_path):
    """Whatever the model, most rows end at the first try (a random model: about 19 in 20),
    the rest within a bounded number of resamples, and every written molecule is RDKit-valid."""
    out = tmp_path / "m.smi"
    options = GenerateOptions(task="molecule", n=32, batch_size=16, sampling=Sampling(max_new_tokens=48),
                              resamples=0)
    result = generate(random_model, out, options, progress=False)
    done = [s for s in result.samples if s.status == "done"]
    assert len(done) >= 0.8 * 32, [(s.status, s.text) for s in result.samples if s.status != "done"]
    for s in done:
        smi = re.fullmatch(r"<MoleculeS>(.+)<MoleculeE>", s.text).group(1)
        assert _valid(smi), smi
    assert result.stats.row_steps > 0


def test_random_model_binding_site_search_always_ends(random_model, tmp_path):
    inputs = tmp_path / "in.fasta"
    inputs.write_text(">p1\nMKTAYIAKQR\n")
    options = GenerateOptions(task="pocket", n=4, batch_size=4, resamples=0)
    result = generate(random_model, tmp_path / "p.fasta", options, inputs=inputs, progress=False)
    assert [s.status for s in result.samples] == ["done"] * 4
    for s in result.samples:
        assert re.sub(r"<[^>]+>", "", s.text.split("<Search>")[1]) == "MKTAYIAKQR"


def test_random_model_crystals_every_reader_accepts(random_model, tmp_path):
    """Crystals from cell compositions: each ends within the budget its composition implies; every CIF written reads in
    pymatgen and gemmi, has no two atoms closer than 0.5 A, and spglib finds the declared group."""
    import warnings

    import gemmi
    from pymatgen.core import Structure

    from logos.decoding.crystal_check import crystal_problem

    inputs = tmp_path / "in.txt"
    inputs.write_text("Cl4Na4 225\nO3SrTi 221\nC8 -\n")
    out = tmp_path / "c.cif"
    options = GenerateOptions(task="crystal", n=3, batch_size=9, resamples=4,
                              prompts=PromptOptions(cell_composition=True))
    result = generate(random_model, out, options, inputs=inputs, progress=False)
    assert result.written >= 1
    for path in sorted(out.with_suffix("").glob("*.cif")):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            s = Structure.from_file(str(path))
        gemmi.make_small_structure_from_block(gemmi.cif.read(str(path)).sole_block())
        if len(s) > 1:
            d = s.distance_matrix + 1e9 * torch.eye(len(s)).numpy()
            assert d.min() >= 0.5
    for s in result.samples:
        if s.written:
            assert crystal_problem(s.text) is None


def test_unconditional_crystal_rows_write_a_canonical_header_and_keep_to_it(tok):
    """Unconditional crystals write their own composition header (as every training crystal has one): elements in
    alphabetical order, each once, whole counts; the space-group tag ends it only when a crystal of that many atoms
    fits in the budget left, and from then on the sites must add up to it."""
    from logos.decoding.rows import CompositionRow

    table = TokenTable(tok, len(tok))
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    sg225 = tok.convert_tokens_to_ids("<sg225>")

    def row_after(text: str) -> CompositionRow:
        row = CompositionRow(table, "<CrystalS>")
        for t in ids(text):
            assert row.check(t, 800), (text, tok.convert_ids_to_tokens(t))
            row.advance(t)
        return row

    assert row_after("Cl4Na4").check(sg225, 800)
    assert not row_after("Cl4Na4").check(sg225, 64 + 32 * 8 - 1)  # 8 atoms need more than the budget left
    row = row_after("Cl4")
    assert not all(row.check(t, 800) for t in ids("Ca4"))  # Ca after Cl: not alphabetical
    assert not CompositionRow(table, "<CrystalS>").check(sg225, 800)  # no header at all
    row = row_after("Cl4Na")
    assert not row.check(sg225, 800)  # Na without its count
    row = row_after("Cl4Na4")
    row.advance(sg225)
    assert row.target == {"Cl": 4, "Na": 4}
    for t in ids("5.640 Na<wa> Cl<wb>"):
        assert row.check(t, 800)
        row.advance(t)
    assert row.check(row.close_id, 800)
    row = row_after("Cl4Na4")
    row.advance(sg225)
    for t in ids("5.640 Na<wa>"):
        row.advance(t)
    assert not row.check(row.close_id, 800)  # chlorines missing
    assert row.budget(256) > 256  # an unconditional row may declare up to MAX_ATOMS atoms


def test_a_fixed_wyckoff_position_holds_one_site():
    """Pm-3m (221): ``b`` (1/2, 1/2, 1/2) has no free coordinate, so a second site on it would coincide with the
    first; ``<we>`` (x, 0, 0) may repeat."""
    from logos.decoding.composition import feasible

    head = "<CrystalS>Ca1O6Ti1<sg221>3.905"
    assert feasible({"Ca": 1, "O": 6, "Ti": 1}, head + " Ca<wa> Ti<wb> O<we> 0.2500", final=True)
    assert not feasible({"Ca": 1, "Ti": 1, "O": 3}, head + " Ca<wb> Ti<wb>", final=False)
    head = "<CrystalS>O3Ti2<sg221>3.905"
    assert feasible({"Ti": 2, "O": 3}, head + " Ti<wa>", final=False)  # b is left for the second
    head = "<CrystalS>O3Ti3<sg221>3.905"
    assert not feasible({"Ti": 3, "O": 3}, head + " Ti<wa>", final=False)  # 2 more: only b (1) is left of size 1


def test_fixed_positions_are_not_shared_between_elements():
    """Pm-3m (221) has two positions of multiplicity 1 (a, b) and no other way to place a single atom: three
    elements of count 1 can never all be placed, two can."""
    from logos.decoding.composition import feasible

    assert feasible({"In": 1, "Rh": 1, "Cl": 3}, "<CrystalS>Cl3In1Rh1<sg221>4.0", final=False)
    assert not feasible({"In": 1, "Rh": 1, "Ta": 1}, "<CrystalS>In1Rh1Ta1<sg221>4.0", final=False)


def test_no_new_site_starts_once_every_atom_is_placed():
    """P4mm (99), ``b`` has one free coordinate: after ``Sb<wb> 0.5043`` every atom of Li2SbSi is placed, so a space
    (which the grammar allows: a site token begins with one) would start a site no atom is left for."""
    from logos.decoding.composition import feasible

    text = "<CrystalS>Li2Sb1Si1<sg99>4.070 4.070 Li<wa> 0.0000 Si<wa> 0.4989 Li<wb> 0.0049 Sb<wb>"
    target = {"Li": 2, "Sb": 1, "Si": 1}
    assert feasible(target, text + " 0.5043", final=False)
    assert feasible(target, text + " ", final=False)  # the space before the coordinate
    assert not feasible(target, text + " 0.5043 ", final=False)
    assert feasible(target, text + " 0.5043", final=True)


def test_a_crystal_closes_only_in_the_group_it_declares():
    """P4mm (99) declared: a cell whose atoms sit where a higher group puts them (a = c: cubic CsCl; z = 0.4990,
    within the evaluation's 0.1 A of the mirror at 1/2) is refused at closing; a genuine P4mm cell closes."""
    from logos.decoding.crystal_check import crystal_problem
    from logos.science.materials.validity import check_crystal

    head = "<CrystalS>Cl1Na1<sg99>"
    for body, ok in (("4.000 4.000 Na<wa> 0.0000 Cl<wb> 0.5000", False), ("4.000 4.500 Na<wa> 0.0000 Cl<wb> 0.4990", False),
                     ("4.000 4.500 Na<wa> 0.0000 Cl<wb> 0.4000", True)):
        text = head + body + "<CrystalE>"
        assert (crystal_problem(text) is None) == ok == check_crystal(text).space_group, body


def test_an_unconditional_header_must_be_charge_balanced(tok):
    """NaCl4 has no charge-neutral assignment of Na and Cl oxidation states: the space-group tag cannot end that
    header; NaCl can, and so can an alloy of metals (CDVAE's SMACT rules). Pm-3m (221) can place all three."""
    from logos.decoding.rows import CompositionRow

    table = TokenTable(tok, len(tok))
    sg225 = tok.convert_tokens_to_ids("<sg221>")
    for head, ok in (("Cl4Na1", False), ("Cl4Na4", True), ("Cu3Zn1", True)):
        row = CompositionRow(table, "<CrystalS>")
        for t in tok(head, add_special_tokens=False)["input_ids"]:
            row.advance(t)
        assert row.check(sg225, 800) is ok, head


def test_a_header_that_can_neither_grow_nor_end_is_refused(tok):
    """``F18H3Ni3`` holds 24 atoms (the most a header may declare) and is not charge-balanced: no count digit or
    element may follow and the space-group tag may not end it, so the piece that completes it is refused."""
    from logos.decoding.rows import CompositionRow, _header_stuck

    assert _header_stuck("F18H3Ni3", CompositionRow.MAX_ATOMS)
    assert not _header_stuck("F18H3Ni", CompositionRow.MAX_ATOMS)  # still being written
    assert not _header_stuck("F2Ni1", CompositionRow.MAX_ATOMS)  # balanced
    assert not _header_stuck("F1Ni1", CompositionRow.MAX_ATOMS)  # unbalanced, but more may follow


def test_a_header_element_every_count_of_which_is_stuck_is_refused():
    """After ``K8Kr4Te4U4Zn2`` (22 atoms) only elements after Zn may follow, with at most 2 atoms; ``Zr`` with 1 or 2
    atoms leaves nothing after it and is not charge-balanced either way, so starting ``Zr`` is a dead end."""
    from logos.decoding.rows import CompositionRow, _header_dead

    assert _header_dead("K8Kr4Te4U4Zn2Zr", CompositionRow.MAX_ATOMS)
    assert not _header_dead("Cl1Na", CompositionRow.MAX_ATOMS)  # Cl1Na1 is balanced


def test_a_crystal_row_is_read_back_once_it_has_ended_not_in_a_step(tok):
    """The closing tag of a crystal whose sites add up is accepted in the step (reading the crystal back takes tens of
    milliseconds); once the row has ended, :meth:`settle` reports a crystal some reader refuses (the engine resamples
    the row) and passes one every reader accepts."""
    from logos.decoding.rows import CompositionRow

    table = TokenTable(tok, len(tok))
    close = tok.convert_tokens_to_ids("<CrystalE>")
    head = "<CrystalS>Cl1Na1<sg99>"
    for body, ok in (("4.000 4.000 Na<wa> 0.0000 Cl<wb> 0.5000", False), ("4.000 4.500 Na<wa> 0.0000 Cl<wb> 0.4000", True)):
        row = CompositionRow(table, head)
        for t in tok(body, add_special_tokens=False)["input_ids"]:
            assert row.check(t, 400), body
            row.advance(t)
        assert row.check(close, 400)
        row.advance(close)
        problem = row.settle()
        assert (problem is None) == ok, (body, problem)
        assert ok or problem.startswith("crystal: ")
