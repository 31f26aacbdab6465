"""What makes the row constraints cheap must not change what they accept.

- the aromatic checks look only at systems with an atom changed since they last passed (``touched``) and skip
  finished systems already matched (``settled``): the same verdicts as checking every system every time;
- ring closures keep the set of atoms on cycles up to date: the same set as Tarjan's algorithm from scratch;
- :meth:`SmilesRow.possible` (a small state signature and the vocabulary classified once) is a superset of the
  tokens a row accepts, on real molecules and on what a random model writes;
- the unfinished-aromatic-system check (:meth:`SmilesState.aromatic_systems_problem`) refuses only tokens after
  which no ending exists, and its matching agrees with networkx;
- a row's work in one step is bounded, after which it accepts only its planned ending.
"""

from __future__ import annotations

import random

import pytest
from rdkit import Chem, rdBase

import logos.decoding.chemistry as chemistry
from conftest import REPO
from logos.decoding.aromatic import covering_matching, cycle_atoms
from logos.decoding.chemistry import SmilesError, SmilesState
from logos.decoding.constraints import TokenTable
from logos.decoding.ending import plan_ending
from logos.decoding.rows import WORK_NO_YIELD, SmilesRow, SmilesVocab

TOKENIZER = REPO / "tokenizers" / "default"
REAL = ["CC(=O)Oc1ccccc1C(=O)O", "Cc1ccc(NC(=O)C2CCN(c3ncccn3)CC2)cc1C", "O=C(NCc1ccco1)c1ccc2c(c1)OCO2",
        "COc1ccc(-c2nc3ccccc3c(=O)n2C)cc1OC", "CN1CCN(C(=O)c2cc3cc(Cl)ccc3[nH]2)CC1", "C[C@@H](N)C(=O)[O-].[Na+]",
        "Cc1ccc2c(cnn2C2CCCCO2)c1-c1ccc2ncccc2c1", "c1ccc2c(c1)[nH]c1ccccc12", "O=c1[nH]c(=O)c2ccccc2[nH]1"]
# what a random model writes (prefixes accepted token by token): odd atoms, dots, dative bonds, open systems
WILD = ["CC(=O)O~CC(=O)Cn1n2co", "c1ccns([O][Pd]2CCCN2CCNCC(=O)O~CC(=O)C1CCOC12)n1", "Cc1c2ccccc2nc1-",
        "c1ccc2ncccc2c1:Cc1nC[C@H]c1cccc(Cc1cccc", "[B-](F)(F)F.CC[O-]", "CCOC(=O)c1nc2sco(-[O][Pd]1[N"]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER))


@pytest.fixture(scope="module")
def vocab(tok):
    return SmilesVocab(TokenTable(tok, 2432))


def _prefix_states(tok, vocab, texts):
    """(span text, state) after each token of each text, as far as the state machine accepts it."""
    for text in texts:
        state, written = SmilesState(), ""
        yield written, state.copy()
        for t in tok(text, add_special_tokens=False)["input_ids"]:
            try:
                state.feed(vocab.text[t])
            except SmilesError:
                break
            written += vocab.text[t]
            yield written, state.copy()


def _candidates(vocab, n=160, seed=0):
    smiles = [i for i, ok in enumerate(vocab.smiles) if ok]
    return random.Random(seed).sample(smiles, min(n, len(smiles)))


def _verdict(state: SmilesState, text: str, forget: bool) -> bool:
    trial = state.copy()
    if forget:  # no memory of earlier checks: every aromatic system looked at afresh
        trial.touched, trial.settled = set(range(len(trial.atoms))), frozenset()
    try:
        trial.feed(text)
    except SmilesError:
        return False
    return trial.can_close() if trial.pending == "" else True


def test_touched_and_settled_systems_give_the_verdicts_of_a_full_check(tok, vocab):
    differ = []
    for written, state in _prefix_states(tok, vocab, REAL + WILD):
        for c in _candidates(vocab):
            text = vocab.text[c]
            if _verdict(state, text, False) != _verdict(state, text, True):
                differ.append((written, text))
    assert not differ, differ[:5]


def test_cycles_follow_ring_closures_exactly(tok, vocab):
    for written, state in _prefix_states(tok, vocab, REAL + WILD + ["C1CC2CC1CC2", "C1.C1", "c1ccc2cc3ccccc3cc2c1"]):
        assert state._in_cycles() == frozenset(cycle_atoms(state.atoms)), written


def test_possible_tokens_include_every_accepted_one(tok, vocab):
    """On real and random-model rows: every token the row's check accepts is possible, and most refusals are
    already ruled out by the signature."""
    missed, refused, ruled_out = [], 0, 0
    every = [i for i, ok in enumerate(vocab.smiles) if ok]
    for text in REAL + WILD:
        row = SmilesRow(vocab, "<MoleculeS>")
        for t in tok(text, add_special_tokens=False)["input_ids"] + [vocab.close_id]:
            mask = row.possible()
            if mask is not None:
                for c in every + [vocab.close_id]:
                    ok = row.check(c, 200)
                    if ok and not mask[c]:
                        missed.append((row.smiles, vocab.text[c]))
                    refused += not ok
                    ruled_out += not ok and not mask[c]
            if not row.check(t, 200):
                break
            row.advance(t)
    assert not missed, missed[:5]
    assert ruled_out > 0.4 * refused


def test_a_cached_signature_mask_equals_a_fresh_one(vocab):
    signature = (False, False, False, True, False, 1)
    cached = vocab.possible(signature)
    vocab._possible.clear()
    assert (vocab.possible(signature) == cached).all()


def test_open_system_check_refuses_only_dead_ends(tok, vocab, monkeypatch):
    """Tokens refused only because an unfinished aromatic system can no longer pair: without that check, a wide
    search finds no ending that RDKit accepts."""
    new = []
    for written, state in _prefix_states(tok, vocab, REAL + WILD):
        for c in _candidates(vocab, 80):
            text = vocab.text[c]
            trial = state.copy()
            try:
                trial.feed(text)
            except SmilesError as e:
                if "being written" in str(e):
                    new.append(written + text)
    assert new, "no token refused by the open-system check in these rows"
    monkeypatch.setattr(chemistry, "OPEN_CHECK", False)
    for text in random.Random(0).sample(new, min(8, len(new))):
        state = SmilesState()
        state.feed(text)
        ending = plan_ending(state, limit=24, max_nodes=1500, quick=100)
        if ending is not None:
            with rdBase.BlockLogs():
                assert Chem.MolFromSmiles(text + ending) is None, (text, ending)


def test_covering_matching_agrees_with_networkx():
    import networkx as nx

    class A:
        def __init__(self):
            self.aromatic_bonds = set()

    rng = random.Random(1)
    for _ in range(500):
        n = rng.randint(2, 14)
        atoms = [A() for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                if rng.random() < 0.3:
                    atoms[i].aromatic_bonds.add(j)
                    atoms[j].aromatic_bonds.add(i)
        must = [i for i in range(n) if rng.random() < 0.6]
        optional = [i for i in range(n) if i not in must and rng.random() < 0.5]
        every = set(must) | set(optional)
        g = nx.Graph()
        g.add_nodes_from(every)
        g.add_edges_from((i, j, {"weight": (i in must) + (j in must)}) for i in every
                         for j in atoms[i].aromatic_bonds if j in every and i < j)
        covered = {k for edge in nx.max_weight_matching(g) for k in edge}
        assert covering_matching(atoms, must, optional) == (set(must) <= covered)


def test_reused_endings_close_validly(tok, vocab):
    """A row near its budget accepts tokens whose planned ending (reused or searched) fits; following the plan
    it keeps closes a molecule RDKit accepts."""
    for text in REAL[:6]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        row = SmilesRow(vocab, "<MoleculeS>")
        budget = len(ids) + 12
        for k, t in enumerate(ids[:-2]):
            assert row.check(t, budget - k), (text, k)
            row.advance(t)
        remaining = budget - len(ids) + 2
        plan = row.ending(remaining)
        assert plan is not None and len(plan) <= remaining
        for t in plan:
            assert row.check(t, remaining)
            if t != vocab.close_id:
                row.advance(t)
            remaining -= 1
        with rdBase.BlockLogs():
            assert Chem.MolFromSmiles(row.smiles) is not None, row.smiles


def test_a_row_works_a_bounded_amount_per_step_then_follows_its_plan(vocab, monkeypatch):
    """Hundreds of candidates checked in one step (a model far from chemistry) cost a bounded number of state updates;
    then the row accepts only its planned ending's next token, and the next step has its work again."""
    row = SmilesRow(vocab, "<MoleculeS>Cc1ccc(NC(=O)C2CC")
    row._refusals = 1  # a row that has had a draw refused plans an ending for every token it accepts
    plan = row.ending(40)
    assert plan is not None
    copies = []
    copy = SmilesState.copy
    monkeypatch.setattr(SmilesState, "copy", lambda self: copies.append(1) or copy(self))
    candidates = [t for t in _candidates(vocab, n=4000, seed=1) if t not in (plan[0], vocab.close_id)]
    accepted = [t for t in candidates if row.check(t, 40)]
    assert 0 < len(copies) <= min(WORK_NO_YIELD, len(candidates) // 2), (len(copies), len(candidates))
    late = candidates[-len(candidates) // 4:]
    assert not any(t in accepted for t in late)  # the work is spent: nothing but the plan ...
    assert row.check(plan[0], 40)  # ... whose next token is still accepted
    row.advance(plan[0])
    fresh = [t for t in candidates if row.check(t, 39)]
    assert fresh, "the next step has its work again"


def test_a_yielding_row_spreads_its_ending_search_over_steps(vocab):
    """A row whose engine lets it yield its step refuses every token once the step's work is spent, its planned
    ending's next token included; its ending search goes on in the next step where it stopped, and ends as one
    search given all its work at once."""
    text = "<MoleculeS>c1ccc2c(c1)c1ccccc1c1ccc("
    vocab.plans.clear()
    expected = SmilesRow(vocab, text).ending(40)  # (an engine that cannot yield: one step)
    vocab.plans.clear()
    row = SmilesRow(vocab, text)
    row.can_yield = True
    row.renew()  # (as the engine does: a step's work for a row that may yield)
    steps = 0
    while (plan := row.ending(40)) is None:
        assert row.spent() and not row.check(expected[0], 40)
        row.renew()
        steps += 1
        assert steps < 20
    assert steps >= 2 and plan == expected and expected is not None
    row.renew()
    assert row.check(plan[0], 40)  # with the next step's work, its ending is accepted


@pytest.mark.parametrize("text", ["<MoleculeS>Ic1ccc2ncccc2c1", "<MoleculeS>[NaH]c2ccccc2"])
def test_a_bond_whose_atom_can_no_longer_end_is_refused(vocab, text):
    """A bond waits for its atom, so the state machine cannot yet see that an aromatic ring atom's exocyclic double
    bond leaves its ring without a kekulé structure: the row asks its planner, and refuses the bond; a bond that an
    ending still follows is accepted."""
    row = SmilesRow(vocab, text)
    assert not row.check(vocab.piece["="], 40)
    assert row.check(vocab.piece["C"], 40)
    assert SmilesRow(vocab, "<MoleculeS>CC(").check(vocab.piece["="], 40)


@pytest.mark.parametrize("text, bond", [("<MoleculeS>Cc1ccc(", "-"), ("<MoleculeS>CC(", "="), ("<MoleculeS>CC", "#")])
def test_a_plain_bond_is_checked_with_a_carbon_written_not_an_ending_search(vocab, text, bond):
    """A biaryl's ``-`` or a carbonyl's ``=`` costs one state update (the bond to a carbon), no ending search."""
    row = SmilesRow(vocab, text)
    searched = len(vocab.plans)
    assert row.check(vocab.piece[bond], 40)
    assert len(vocab.plans) == searched and row.work_left() >= WORK_NO_YIELD - 8


@pytest.mark.parametrize("text, piece", [("<MoleculeS>Cc1cc", "[nH]"), ("<MoleculeS>CC", "[C@@H]"),
                                         ("<MoleculeS>OC", "[C@H](C")])
def test_a_plain_bracket_atom_is_checked_as_its_atom_not_by_a_search_or_rdkit(vocab, text, piece, monkeypatch):
    """An uncharged C, N or O with its hydrogens and chirality stated is checked by the state machine, as the same atom
    without brackets: no ending search, no RDKit check of a planned molecule. A charged one is still looked at."""
    import logos.decoding.rows as rows

    monkeypatch.setattr(rows, "_sanitizes", lambda *a, **k: pytest.fail("RDKit was asked"))
    row = SmilesRow(vocab, text)
    searched = len(vocab.plans)
    assert row.check(vocab.piece[piece], 40)
    assert len(vocab.plans) == searched
    assert all(vocab.risky[vocab.piece[p]] for p in ("[O-]", "[K+]", "[B-]", "[Pd]", "[n", "[C@@"))


def test_a_plain_bracket_atom_after_an_unusual_one_is_still_looked_at(vocab):
    """In a span with a charge, metal or dative bond, where the state machine's view can depart from RDKit's, ``[nH]``
    goes through an ending search as before."""
    vocab.plans.clear()
    row = SmilesRow(vocab, "<MoleculeS>[O-]c1cc")
    assert row.check(vocab.piece["[nH]"], 40)
    assert len(vocab.plans) > 0


def test_rdkit_check_beyond_a_steps_work_waits_for_the_rows_next_step_and_runs_alone(vocab, monkeypatch):
    """A yielding row whose draw needs RDKit's check of a planned molecule larger than the work its step has left
    yields without it; it takes nothing of what other rows left (``renew(work)`` is False) and, in its next step,
    the same draw costs RDKit's check alone (no state update, no ending search), whose verdict is RDKit's."""
    import logos.decoding.rows as rows

    asked = []
    monkeypatch.setattr(rows, "_sanitizes", lambda smiles, rings=True: asked.append(smiles) or
                        Chem.MolFromSmiles(smiles) is not None)
    row = SmilesRow(vocab, "<MoleculeS>" + "C" * 36)
    row.can_yield = True
    row.renew()
    token = vocab.piece["[O-]"]  # a charge: the state machine alone may miss a dead end after it
    assert not row.check(token, 40) and row.spent() and not asked
    assert row.renew(8) is False and row.spent()
    row.renew()
    searched, trials = len(vocab.plans), len(vocab.trials)
    ok = row.check(token, 40)
    assert len(asked) == 1 and asked[0].startswith("C" * 36 + "[O-]")
    assert ok == (Chem.MolFromSmiles(asked[0]) is not None) and ok
    assert (len(vocab.plans), len(vocab.trials)) == (searched, trials)
    assert row.work_left() == row.step_work - (4 + 37)  # RDKit's charge alone
    row.advance(token)
    assert row.smiles == "C" * 36 + "[O-]"


def test_a_draw_rdkit_refuses_alone_ends_the_rows_step_and_is_not_checked_again(vocab, monkeypatch):
    """RDKit's refusal of a draw that waited for its step ends the row's step (it takes nothing of what other rows
    left); checked again in the next step, the draw is refused at no cost and other draws get the step's work."""
    import logos.decoding.rows as rows

    asked, real = [], rows._sanitizes
    monkeypatch.setattr(rows, "_sanitizes", lambda smiles, rings=True: asked.append(smiles) or real(smiles, rings))
    row = SmilesRow(vocab, "<MoleculeS>" + "C" * 30 + "c1ccccc1")
    row.can_yield = True
    row.renew()
    token = vocab.piece[">"]  # a dative bond: the state machine alone may miss a dead end after it
    assert not row.check(token, 40) and row.spent() and not asked
    row.renew()
    assert not row.check(token, 40) and len(asked) == 1
    with rdBase.BlockLogs():
        assert Chem.MolFromSmiles(asked[0]) is None
    assert row.spent() and row.renew(8) is False
    row.renew()
    left = row.work_left()
    assert not row.check(token, 40) and len(asked) == 1 and row.work_left() == left
    assert row.check(vocab.piece["C"], 40) and row.work_left() < left


def test_a_yielding_row_frees_the_searches_it_let_go_of_only_when_tidied(vocab):
    """Paused ending searches of candidates a row did not write are kept for the engine to free between steps
    (:meth:`RowConstraint.tidy`), not freed inside the step that writes a token."""
    row = SmilesRow(vocab, "<MoleculeS>c1ccc2c(c1)c1ccccc1c1ccc(")
    row.can_yield, row.step_work = True, 8  # (as the engine sets them, with 8 work units a step)
    row.renew()
    vocab.plans.clear()
    for token in _candidates(vocab, n=12, seed=2):
        row.check(token, 12)  # near the budget: every candidate needs an ending search, cut short by the work
        if row.spent():
            row.renew()
    assert row._searches
    plan = row.ending(40)
    while plan is None:
        row.renew()
        plan = row.ending(40)
    row.renew()
    assert not row.check(plan[0], 40) and row.spent()  # (a wandering row: RDKit's check of the planned molecule,
    row.renew()  # more than the step's work left, waits for the row's next step, where it runs alone)
    assert row.check(plan[0], 40)
    row.advance(plan[0])
    assert not row._searches and row._litter
    row.tidy()
    assert not row._litter


def test_a_full_shared_cache_is_freed_when_tidied_not_inside_a_check(tok, monkeypatch):
    """The states after pieces the rows of a vocabulary share are replaced when the cache is full; the full cache
    (tens of milliseconds to free at its real size) is freed by a row's tidy() between steps, and verdicts stay."""
    import logos.decoding.rows as rows

    vocab = SmilesVocab(TokenTable(tok, 2432))
    monkeypatch.setattr(rows, "TRIALS", 4)
    row = SmilesRow(vocab, "<MoleculeS>CC(")
    pieces = ["C", "O", "N", "c", "=O", "CC", ")"]
    verdicts = [row.check(vocab.piece[p], 40) for p in pieces]
    assert verdicts == [True, True, True, True, True, True, False]  # "()" is no SMILES
    assert len(vocab.trials) <= 4 and len(vocab.retired) == 1 and len(vocab.retired[0]) == 4
    row.tidy()
    assert vocab.retired == []


def test_planned_molecules_read_by_rdkit_without_symmetrized_rings_get_full_verdicts():
    """The sampling loop's RDKit check of a planned molecule leaves out the symmetrized rings: same verdicts."""
    from logos.decoding.rows import _sanitizes

    molecules = REAL + ["c1cccc1", "C1=CC=CC=C1c1ccccn1", "c1ccc2c(c1)[nH]c1ccccc12", "CC(C)(C)(C)C", "c1ccnc1",
                        "n1cccc1", "O=c1cccc1", "C1CC2CCC1CC2", "c1ccc2cc3ccccc3cc2c1", "[NH4+].[Cl-]", "c1cc[o+]cc1"]
    for smiles in molecules:
        assert _sanitizes(smiles, rings=False) == _sanitizes(smiles), smiles
    assert not _sanitizes("c1cccc1", rings=False) and _sanitizes(REAL[0], rings=False)


def test_a_row_takes_back_its_last_tokens_to_where_it_was(vocab):
    """``undo`` restores the row before its last tokens (up to ``UNDO_DEPTH``), a closed span included: each check
    then gives the verdict a row that never wrote them gives, and the row goes on from there."""
    from logos.decoding.rows import UNDO_DEPTH

    molecule = "CC(C)Cc1ccc(C(C)C(=O)Nc2ccc(OC)cc2)cc1"
    ids = vocab.spell(molecule) + [vocab.close_id]
    assert len(ids) > UNDO_DEPTH + 1
    row = SmilesRow(vocab, "<MoleculeS>")
    for t in ids:
        assert row.check(t, 40)
        row.advance(t)
    assert row.closed == [molecule] and row.state is None
    candidates = _candidates(vocab, n=200, seed=5)
    for back in range(1, UNDO_DEPTH + 1):
        assert row.undo()
        fresh = SmilesRow(vocab, "<MoleculeS>")
        for t in ids[: len(ids) - back]:
            fresh.advance(t)
        assert row.smiles == fresh.smiles and row.closed == fresh.closed == []
        fresh._refusals = row._refusals  # (what the checks below refused: a row with refusals checks harder)
        for t in candidates:  # (each with a step's work: what a check refuses for want of it is not a verdict)
            row.renew()
            fresh.renew()
            assert row.check(t, 40) == fresh.check(t, 40), (row.smiles, vocab.text[t])
    assert not row.undo()  # no further back than UNDO_DEPTH
    row.advance(ids[len(ids) - UNDO_DEPTH])
    assert row.smiles == "".join(vocab.text[t] for t in ids[: len(ids) - UNDO_DEPTH + 1])
