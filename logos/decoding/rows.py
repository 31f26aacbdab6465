"""Row constraints: one object per sampled row, advanced by the token ids it accepts, shared by every engine.

A context-free grammar cannot see ring closures, valences, a composition or a copied sequence; a
*row constraint* can. Each is a small object holding one row's state (what its text implies so far),
with the interface both sampling engines call - the built-in loop (:mod:`logos.decoding.sampler`)
and a vLLM logits processor (one object per request):

``check(token, remaining) -> bool``
    Whether the row may write ``token`` now with ``remaining`` tokens of budget left (this token
    included). Exact: the chemistry (valence, rings, aromatic atoms, kekulé structure of finished
    aromatic systems; the closing tag only when the state can close), the composition, the
    budget. Cheap (tens of microseconds): the state is copied on write.
``banned(candidates, remaining) -> list[int]``
    The candidates ``check`` refuses (a logits processor bans them; the built-in loop draws,
    checks and redraws, which samples exactly the model's distribution restricted to accepted
    tokens).
``must_close(remaining) -> bool`` and ``ending(remaining) -> tuple[int, ...] | None``
    Whether the row must now follow its planned ending, and that ending as token ids (closing tag
    included). Near the budget every accepted token keeps a planned ending within it, so a row that
    follows it always ends.
``closes(token) -> bool``
    Whether ``token`` would close the row's open span (the model asking to end it). Engines make a row whose
    draw of it is refused follow its planned ending: a model that wanted to stop where the span cannot end
    would otherwise keep writing from the unlikely rest of its distribution until the budget forces an end.
``possible() -> numpy bool array | None``
    A superset of the tokens ``check`` accepts now (False only where it surely refuses), from the state's small
    signature and a classification of the vocabulary made once; None when it cannot tell. Engines drop the other
    tokens before redrawing (the restricted distribution is unchanged, with fewer draws and checks).
``advance(token)``, ``fork()``, ``failure``, ``budget(default)``
    Accept a token; an independent copy (beam search, speculative steps); why the row cannot end
    validly (None while it can: the engine resamples the row); the length budget the row needs.
``spent()``, ``work_left()``, ``renew(work) -> bool``, ``can_yield``, ``step_work``
    Whether the row's work for this step is spent (a refusal since may be for want of work, not validity); the
    units it has left (None: the row does not count its work); fresh work for a row that has written nothing yet
    this step: ``step_work`` for a new step, or ``work`` units more in the same step (what other rows left; False:
    the row cannot use them now). An engine that lets a row *yield* its step (write nothing, keep its distribution
    for the next step: the built-in loop, ``Sampling.row_work`` units a step) sets ``can_yield`` and ``step_work``:
    the row then refuses every token once its work is spent, and its ending searches go on where they stopped, in
    the same step if the engine gives it more or in the next (the engine checks the same token again: rejection
    sampling needs each draw decided). RDKit's check of a planned molecule larger than the work left waits for
    the row's next step, where that draw's check is RDKit's alone, whatever its size (its state and planned ending
    are kept; meanwhile the row takes nothing of what other rows left); a refusal there ends the row's step, and
    RDKit's verdict stands when the engine checks the draw again. Otherwise (vLLM, which writes a token for
    every request in every step, and the built-in loop with ``row_work=0``) a spent row accepts only its planned
    ending's next token, and an ending search may spend ``ENDING_WORK`` in one step.
``undo() -> bool``
    Take back the last token advanced (one of the last ``UNDO_DEPTH``): the row is as it was before it (False: it
    cannot). An engine whose row has reached a dead end - no token accepted, no planned ending - takes back its
    last tokens and draws again without them (the built-in loop); a state the checks let through that no ending
    completes is refused late instead of failing the row.
``tidy()``
    Free what the row has let go of (paused ending searches of candidates it did not write: thousands of states,
    a millisecond to free) and the full caches its vocabulary replaced (:meth:`SmilesVocab.retire`: tens of
    milliseconds). An engine calls it between steps, off any step's path (the built-in loop in its worker thread
    during the forward pass); a row that is never tidied frees them itself every few tokens.
``settle() -> str | None``
    Once the row has ended, outside the decoding steps: the checks of what it wrote that no step made
    (RDKit's parse of each molecule span it closed), and why they fail (None: they pass; the engine
    resamples the row). A step never waits for them: their cost, up to a millisecond for a large
    molecule, would otherwise hold every row of the batch.

Each task of :mod:`logos.tasks` names its row constraint: :class:`SmilesRow` for tasks that write molecule
spans, :class:`CompositionRow` for crystals from a composition, :class:`CopyRow` for binding-site search
(the output spells the input; pocket marks are budgeted so the copy always ends).
"""

from __future__ import annotations

import functools
import re

import numpy as np

from logos.science.chemistry import CLOSE as MOL_CLOSE, OPEN as MOL_OPEN
from logos.decoding.chemistry import SmilesError, SmilesState
from logos.decoding.ending import PAUSED, apply_move, cost, plan_ending, plan_search, run_search

__all__ = ["RowConstraint", "SmilesRow", "CompositionRow", "CopyRow", "SmilesVocab"]

WINDOW = 8       # within this many tokens of what an ending needs at least, every token must keep a planned ending
MARGIN = 2       # follow the planned ending when the budget left is its length plus this
WORK_PER_STEP = 32   # work units (ending.cost: ~10-25 us each) per step of a row that yields, unless its engine says
WORK_NO_YIELD = 512  # the same for a row that does not yield: then it accepts only its planned ending's next token
ENDING_WORK = 400    # the most work one ending search takes (in one step, or over the steps a row yields)
QUICK_WORK = 64      # ... and, for a row that yields, one for a candidate far from the budget (a token whose ending
# is that hard to find is refused: the model has other tokens there; deciding it over a dozen steps cost more than
# the rare valid token was worth)
MAX_SEARCHES = 8     # ending searches a row that yields keeps paused (the newest candidates')
TRIALS = 20_000  # states after a piece kept for the rows of a vocabulary (the shared prefixes of a batch and its run)
UNDO_DEPTH = 8       # tokens a row can take back (:meth:`SmilesRow.undo`: the states before them, kept, not copied)
RDKIT_CHECK_AFTER = 6  # refusals after which RDKit also checks each planned molecule ...
RDKIT_ATOMS = 40  # ... of up to this many atoms (larger ones cost RDKit about a millisecond: read once they end)
_RISKY = frozenset("[%<>~$*/\\.:")  # characters after which the state machine alone may not see a dead end
# ... except a bracket atom that is a plain atom with its hydrogens and chirality stated ([nH], [C@@H], [O]) in a span
# that has written none of them: the state machine checks it as it checks the same atom written without brackets (in
# a span with dative bonds, metals or charges, where its view of rings and aromatic systems can depart from RDKit's,
# it is looked at as before)
_PLAIN_BRACKET = re.compile(r"\[(?:C|N|O|c|n|o)(?:@@?)?(?:H[1-3]?)?\]")
_SMILES_CHARS = re.compile(r"[A-Za-z0-9()\[\]=#$:/\\.@+\-%*~<>]+")


def _unusual(text: str) -> bool:
    """Whether SMILES ``text`` has a character after which the state machine alone may not see a dead end (plain
    bracket atoms aside: see ``_PLAIN_BRACKET``)."""
    return not _RISKY.isdisjoint(_PLAIN_BRACKET.sub("C", text))


class RowConstraint:
    """One row's domain constraint (see the module docstring); the base class allows everything."""

    failure: str | None = None
    can_yield = False  # set by an engine that lets a row yield its step (see the module docstring) ...
    step_work = WORK_PER_STEP  # ... with this many work units a step

    def check(self, token: int, remaining: int) -> bool:
        return True

    def banned(self, candidates, remaining: int) -> list[int]:
        return [t for t in candidates if not self.check(int(t), remaining)]

    def advance(self, token: int) -> None:
        pass

    def undo(self) -> bool:
        return False

    def must_close(self, remaining: int) -> bool:
        return False

    def closes(self, token: int) -> bool:
        return False

    def ending(self, remaining: int) -> tuple[int, ...] | None:
        return None

    def budget(self, default: int) -> int:
        return default

    def possible(self) -> np.ndarray | None:
        return None

    def settle(self) -> str | None:
        return None

    def spent(self) -> bool:
        return False

    def work_left(self) -> int | None:
        return None

    def renew(self, work: int | None = None) -> bool:
        return True

    def tidy(self) -> None:
        pass

    def fork(self) -> "RowConstraint":
        raise NotImplementedError


class SmilesVocab:
    """The tokenizer's pieces as SMILES text, classified once: which may appear inside a molecule span, and the
    longest-match spelling of a planned ending as token ids."""

    def __init__(self, table):
        self.table = table
        self.text = table.text
        self.open_id, self.close_id = table.id.get(MOL_OPEN), table.id.get(MOL_CLOSE)
        bad = set(table.bytes) | {i for p, i in table.id.items()}
        self.smiles = [bool(t) and i not in bad and _SMILES_CHARS.fullmatch(t) is not None
                       for i, t in enumerate(table.text)]
        self.piece: dict[str, int] = {}
        for i, t in enumerate(table.text):
            if self.smiles[i] and len(t) <= 8 and t not in self.piece:
                self.piece[t] = i
        self.longest = max(map(len, self.piece), default=1)
        self.plans: dict[tuple[str, bool], tuple[tuple[int, ...] | None, int]] = {}  # span text -> planned ending
        self.trials: dict[tuple[str, int], SmilesState | None] = {}  # (span text, piece) -> the state after it (None:
        # refused); rows share it, as they share early prefixes (states are never changed once fed: see check)
        self.retired: list[dict] = []  # full caches replaced by empty ones, freed by a row's tidy() (see retire)
        self._classify()

    def retire(self, name: str) -> dict:
        """Replace the full cache ``name`` (``plans`` or ``trials``) by an empty one, returned. Freeing the full one (up
        to hundreds of thousands of objects: tens of milliseconds) is left to :meth:`RowConstraint.tidy`, between
        steps; an engine that never tidies frees it at the next replacement."""
        self.retired.clear()
        self.retired.append(getattr(self, name))
        fresh: dict = {}
        setattr(self, name, fresh)
        return fresh

    # first characters of a piece, by what they need of the state before them (no character pending)
    _FIRST = {**{c: "bond" for c in "-=#$:/\\~"}, "<": "dative", ">": "dative",
              **{c: "label" for c in "0123456789%"}, "(": "open", ")": "close", ".": "dot"}

    def _classify(self) -> None:
        """Each SMILES piece once: the kind of its first character (an atom, a bond, a ring label, a branch opened or
        closed, a dot) and the deepest it closes branches opened before it; :meth:`possible` turns these into the
        pieces a state signature may accept (:meth:`SmilesRow.possible`)."""
        n = len(self.text)
        kinds = ("atom", "bond", "dative", "label", "open", "close", "dot")
        self.first = {k: np.zeros(n, dtype=bool) for k in kinds}
        self.unbranch = np.zeros(n, dtype=np.int64)  # branches before the piece that it closes
        self.dot_depth = np.full(n, 1, dtype=np.int64)  # depth of its first '.' (1: none), which must be the top level
        self.spelled = np.zeros(n, dtype=bool)  # reads as SMILES from a state with nothing pending
        # after which the state machine alone may not see a dead end: an unusual bond, label or atom character
        self.risky = [bool(self.smiles[i]) and _unusual(t) for i, t in enumerate(self.text)]
        self.plain_bracket = [bool(self.smiles[i]) and "[" in t and not self.risky[i] for i, t in enumerate(self.text)]
        for i, t in enumerate(self.text):
            if not self.smiles[i]:
                continue
            self.spelled[i] = _spelled(t)
            self.first[self._FIRST.get(t[0], "atom")][i] = True
            depth = low = 0
            inside = False
            for ch in t:
                if ch == "[":
                    inside = True
                elif ch == "]":
                    inside = False
                elif not inside and ch == "(":
                    depth += 1
                elif not inside and ch == ")":
                    depth -= 1
                    low = min(low, depth)
                elif not inside and ch == "." and self.dot_depth[i] == 1:
                    self.dot_depth[i] = depth
            self.unbranch[i] = -low
        self._possible: dict[tuple, np.ndarray] = {}

    def possible(self, signature: tuple) -> np.ndarray:
        """bool [vocabulary]: the SMILES pieces a state of ``signature`` (see :meth:`SmilesRow.possible`) does not
        surely refuse, plus the closing tag; cached per signature."""
        mask = self._possible.get(signature)
        if mask is not None:
            return mask
        no_current, bond, full, label_ok, empty_branch, branches = signature
        f = self.first
        if no_current:  # the span's first atom, or the one after a '.'
            ok = f["atom"] | f["dot"]
        elif full:  # the current atom cannot take the next bond: a branch end or a dot
            ok = f["close"] | f["dot"]
        elif bond:  # a bond written: its atom or ring label
            ok = f["atom"] | (f["label"] if label_ok else False)
        else:
            ok = f["atom"] | f["bond"] | f["close"] | f["dot"]
            if label_ok:
                ok = ok | f["label"]
            if not empty_branch:
                ok = ok | f["open"]
        ok = ok | f["dative"]  # '<' and '>' are judged later
        if bond or empty_branch:
            ok = ok & ~f["close"]
        if branches or bond:
            ok = ok & ~f["dot"]
        ok = ok & self.spelled & (self.unbranch <= branches) & ((self.dot_depth == 1) | (self.dot_depth == -branches))
        if self.close_id is not None:
            ok[self.close_id] = True
        self._possible[signature] = ok
        return ok

    def spell(self, text: str) -> list[int] | None:
        """Token ids spelling ``text`` (longest match first), None if some character has no piece."""
        out, i = [], 0
        while i < len(text):
            for n in range(min(self.longest, len(text) - i), 0, -1):
                tid = self.piece.get(text[i:i + n])
                if tid is not None:
                    out.append(tid)
                    i += n
                    break
            else:
                return None
        return out

    @staticmethod
    def of(table) -> "SmilesVocab":
        vocab = getattr(table, "_smiles_vocab", None)
        if vocab is None:
            vocab = table._smiles_vocab = SmilesVocab(table)
        return vocab


def _spelled(text: str) -> bool:
    """Whether ``text`` passes the checks of :class:`SmilesState` that read its characters alone, from a state with
    nothing pending: no unexpected character, ``%`` and ``<`` followed by what they need, every bracket atom a
    prefix of a valid one and, once closed, an atom of a real element with its charge and hydrogens (the same code
    on an empty state). A piece that fails cannot be accepted after any state with nothing pending."""
    from logos.decoding.atoms import BOND_ORDERS, bracket_prefix

    pending = ""
    for ch in text:
        if pending == "<":
            if ch != "-":
                return False
            pending = ""
            continue
        if pending in ("C", "B"):
            was, pending = pending, ""
            if (was, ch) in (("C", "l"), ("B", "r")):
                continue
        elif pending.startswith("%"):
            if not ch.isdigit():
                return False
            pending += ch
            if len(pending) == 3:
                pending = ""
            continue
        elif pending:  # inside [...]
            pending += ch
            if not bracket_prefix(pending):
                return False
            if ch == "]":
                try:
                    SmilesState()._bracket(pending)
                except SmilesError:
                    return False
                pending = ""
            continue
        if ch in "[%CB<":
            pending = ch
        elif not (ch in "NOPSFIbcnops*().>" or ch.isdigit() or ch in BOND_ORDERS):
            return False
    return True


@functools.lru_cache(maxsize=65536)
def _sanitizes(smiles: str, rings: bool = True) -> bool:
    """Whether RDKit parses and sanitizes ``smiles``. ``rings=False`` (a planned molecule's check in the sampling
    loop) leaves out the symmetrized smallest set of rings, a quarter of the time on the polycyclic strings a
    wandering row writes and a step that refuses nothing the others accept (same verdicts on thousands of planned
    molecules); a finished span is read in full (:meth:`SmilesRow.settle`)."""
    from rdkit import Chem, rdBase
    from rdkit.Chem import SanitizeFlags as F

    with rdBase.BlockLogs():
        if rings:
            return Chem.MolFromSmiles(smiles) is not None
        mol = Chem.MolFromSmiles(smiles, sanitize=False)
        ops = F.SANITIZE_ALL ^ F.SANITIZE_SYMMRINGS
        return mol is not None and Chem.SanitizeMol(mol, sanitizeOps=ops, catchErrors=True) == F.SANITIZE_NONE


def _rdkit_cost(state: SmilesState) -> int:
    """Work units of RDKit's check of a planned molecule: about one per atom (a few hundred microseconds for a
    40-atom molecule in the sampling loop, where RDKit's code and data are rarely in cache)."""
    return 4 + len(state.atoms)


class SmilesRow(RowConstraint):
    """The chemistry of every ``<MoleculeS>...<MoleculeE>`` span a row writes (molecules, reactions, ligands, linkers).

    The state (:class:`~logos.decoding.chemistry.SmilesState`) follows the span character by character;
    a candidate token is applied to a copy-on-write copy, so a check costs what the token touches. Within
    ``WINDOW`` tokens of the least an ending needs, a token is accepted only if a planned ending
    (:func:`~logos.decoding.ending.plan_ending`) still fits in the budget after it. The current state's plan is
    tried first (:meth:`_reuse`: most tokens leave it valid).

    The work of one row in one step is bounded (``WORK_NO_YIELD`` units of :func:`~logos.decoding.ending.cost`, which
    grows with the molecule: state updates, planner moves, RDKit checks): once it is spent the row accepts only its
    planned ending's next token, which the engine follows. An engine that lets rows yield (``can_yield``) sets a
    smaller, hard bound (``step_work``, ``WORK_PER_STEP`` by default, or what ``renew(work)`` gives): once it is
    spent the row refuses every token until it is renewed, and its searches go on where they stopped. Either way a
    step costs a bounded amount whatever the model writes.
    """

    def __init__(self, vocab: SmilesVocab, prompt_tail: str = ""):
        self.vocab = vocab
        self.state: SmilesState | None = None
        self.smiles = ""
        if MOL_OPEN in prompt_tail and MOL_CLOSE not in prompt_tail.rsplit(MOL_OPEN, 1)[1]:
            self.smiles = prompt_tail.rsplit(MOL_OPEN, 1)[1]  # a prompt may end inside a span
            self.state = SmilesState()
            self.state.feed(self.smiles)
        self._trial: tuple | None = None
        self._plan: tuple[int, ...] | None = None   # token ids of the planned ending for the current state
        self._planned = self._searched = False  # a planned ending known; searched for one this step
        self._work, self._refusals = [WORK_NO_YIELD], 0  # (an engine that lets it yield renews it)
        self._given = WORK_NO_YIELD  # the work it had when its step (or renewal) began
        self._searches: dict = {}  # ending searches of this state and its candidates paused for want of work
        self._litter: list = []  # searches let go of, freed by tidy() between steps (see the module docstring)
        self.closed: list[str] = []  # the spans this row closed, for RDKit once it has ended (settle)
        self._history: list[tuple] = []  # what undo() restores: the row before each of its last tokens
        self._forget_draws()

    def fork(self) -> "SmilesRow":
        new = SmilesRow.__new__(SmilesRow)
        new.vocab, new.smiles, new.failure = self.vocab, self.smiles, self.failure
        new.state = self.state.copy() if self.state is not None else None
        new._trial, new._plan, new._planned, new._work = None, self._plan, self._planned, [self._step_work()]
        new._searched = self._searched
        new._refusals, new.closed, new.can_yield, new._searches = self._refusals, list(self.closed), self.can_yield, {}
        new._litter, new._history = [], list(self._history)
        new._forget_draws()
        new.step_work, new._given = self.step_work, new._work[0]
        return new

    # ---------------------------------------------------------------- planning
    def _plan_tokens(self, state: SmilesState, remaining: int, quick: bool = False, text: str | None = None,
                     work: list[int] | None = None) -> tuple[int, ...] | None:
        """Token ids of a planned ending of ``state`` (whose span text is ``text``) within ``remaining`` tokens.

        Plans are shared by all rows through the vocabulary's cache, keyed by the span text (which determines
        the state): a plan found fits any larger budget, a failure any smaller one (a search cut short by
        ``work``, the row's work left this step, is not remembered). A row that can yield keeps a search cut short
        and returns :data:`~logos.decoding.ending.PAUSED`: it goes on in the next call for the same text, until it
        has taken ``ENDING_WORK`` in all (``QUICK_WORK`` for a ``quick`` search: a candidate far from the budget), then
        None.
        """
        key = (text, quick) if text is not None else None
        known = self._known(key, remaining)
        if known is not PAUSED:
            return known
        limit, nodes = max(remaining - 1, 0), 60 if quick else 120
        if not self.can_yield or key is None or work is not self._work:
            found = plan_ending(state, limit=limit, max_nodes=nodes, quick=30, work=work)
            return self._store(key, found, remaining, complete=found is not None or work is None or work[0] > 0)
        entry = self._searches.get((key, remaining))  # a row that yields: the search goes on where it stopped
        if entry is None:
            if len(self._searches) >= MAX_SEARCHES:  # the oldest candidate's search is let go of
                self._let_go(self._searches.pop(next(iter(self._searches))))
            entry = self._searches[(key, remaining)] = [plan_search(state, limit, nodes, 30, work), 0]
        if entry[0] is None:
            return None  # given up: it took ENDING_WORK (QUICK_WORK)
        before = work[0]
        found = run_search(entry[0])
        entry[1] += before - work[0]
        if found is PAUSED:
            if entry[1] < (QUICK_WORK if quick else ENDING_WORK):
                return PAUSED
            entry[0] = found = None
        return self._store(key, found, remaining, complete=entry[0] is not None)

    def _known(self, key, remaining: int):
        """A cached plan for ``key`` that fits ``remaining``, None if none is known to, PAUSED if a search must tell."""
        if key is not None and key in self.vocab.plans:
            plan, tried = self.vocab.plans[key]
            if plan is not None and len(plan) <= remaining:
                return plan
            if plan is None and tried >= max(remaining - 1, 0):
                return None
        return PAUSED

    def _store(self, key, found: str | None, remaining: int, complete: bool) -> tuple[int, ...] | None:
        """The token ids of an ending ``found`` (closing tag included), cached under ``key`` unless the search was cut
        short (not ``complete``)."""
        ids = self.vocab.spell(found) if found is not None else None
        plan = None if ids is None else (*ids, self.vocab.close_id)  # a tuple of ints: the GC need not follow it
        cache = self.vocab.plans
        if key is not None and (plan is not None or complete):
            if len(cache) > 200_000:
                cache = self.vocab.retire("plans")
            cache[key] = (plan, max(remaining - 1, 0))
        return plan

    def _risky(self, trial: SmilesState, token: int) -> bool:
        """Whether the state machine's own checks may miss a dead end after ``token``: a half-written bracket atom or
        label, an unusual bond, label or atom (rare in real molecules, frequent from a weak model:
        :attr:`SmilesVocab.risky`), any token of a row that has had a draw refused - the state machine checks the
        kekulé structure of finished aromatic systems and a necessary condition on unfinished ones, and a model that
        wanders writes states no ending completes - or a bond waiting for its atom that the same bond to a carbon
        would not leave checked: its dead ends show only once the atom is written (an aromatic atom's exocyclic
        double bond can leave its ring unable to kekulize), so the state machine checks the trial with a carbon
        written (a biaryl's ``-``, a carbonyl's ``=``: one update instead of an ending search). A row whose draws are
        accepted keeps the state machine's checks alone."""
        if trial.pending not in ("", "C", "B") or self.vocab.risky[token] or self._refusals >= 1:
            return True
        if self.vocab.plain_bracket[token] and _unusual(self.smiles):
            return True  # (see _PLAIN_BRACKET)
        return trial.bond is not None and apply_move(trial, "C", self._work) is None

    def _reuse(self, token: int, trial: SmilesState, remaining: int) -> tuple[int, ...] | None:
        """The current state's planned ending, if it also ends ``trial`` (the state after ``token``) within
        ``remaining`` tokens: the incremental plan - a token that follows the plan leaves the rest of it, and most
        others (a chain atom, a substituent) leave the ending as it was: one :meth:`SmilesState.feed` replaces a
        search."""
        plan = self._plan if self._planned else None
        if plan and plan[0] == token:  # following the plan: its rest ends the state it leads to, as planned
            return plan[1:] if 1 < len(plan) <= remaining + 1 else None
        if not plan or len(plan) > remaining:
            return None
        self._work[0] -= cost(trial)
        probe = trial.copy()
        try:
            probe.feed("".join(self.vocab.text[t] for t in plan[:-1]))
        except SmilesError:
            return None
        return plan if probe.can_close() else None

    def ending(self, remaining: int) -> tuple[int, ...] | None:
        if self.state is None:
            return None
        if not self._planned and self.can_yield and self._work[0] > 0:  # the search goes on where it stopped
            plan = self._plan_tokens(self.state, remaining, text=self.smiles, work=self._work)
            if plan is not PAUSED:
                self._plan, self._planned = plan, True
        elif not self._planned and not self._searched and not self.can_yield:  # one search a step, ENDING_WORK
            work = [max(self._work[0], ENDING_WORK)]
            self._plan = self._plan_tokens(self.state, remaining, text=self.smiles, work=work)
            self._planned, self._searched = self._plan is not None or work[0] > 0, True
            self._work[0] = min(self._work[0], work[0])
        return self._plan if self._planned else None

    def spent(self) -> bool:
        return self._work[0] <= 0 or self._rests

    def undo(self) -> bool:
        if not self._history:
            return False
        self.state, self.smiles, self._plan, self._planned, closed = self._history.pop()
        del self.closed[closed:]
        if self._searches:
            self._let_go(self._searches)
            self._searches = {}
        self._trial, self._searched, self._work = None, False, [self._step_work()]
        self._given = self._work[0]
        self._forget_draws()
        return True

    def tidy(self) -> None:
        self._litter = []
        self.vocab.retired.clear()

    def _let_go(self, searches) -> None:
        self._litter.append(searches)
        if len(self._litter) > 4 * MAX_SEARCHES:  # an engine that never tidies: they are freed here
            self._litter = []

    def work_left(self) -> int:
        return self._work[0]

    def _step_work(self) -> int:
        return self.step_work if self.can_yield else WORK_NO_YIELD

    def renew(self, work: int | None = None) -> bool:
        if work is not None and (self._waiting is not None or self._rests):
            return False  # its draw waits for RDKit's check, alone in the row's next step, or RDKit's check took it
        self._rests = False
        self._given = self._step_work() if work is None else work
        self._work[0] = self._given  # in place: a paused search holds this list
        self._searched, self._trial = False, None
        return True

    def closes(self, token: int) -> bool:
        return token == self.vocab.close_id and self.state is not None

    def settle(self) -> str | None:
        """RDKit's parse of every span the row closed (the state machine cannot see every kekulé structure and
        hypervalence RDKit refuses): ``"kekulize"`` if it refuses one."""
        if not all(map(_sanitizes, self.closed)):
            self.failure = "kekulize"
            return self.failure
        return None

    def must_close(self, remaining: int) -> bool:
        state = self.state
        if state is None or remaining > state.lower_bound() + WINDOW:
            return False
        plan = self.ending(remaining)
        return plan is not None and len(plan) + MARGIN >= remaining

    # ---------------------------------------------------------------- the interface
    def possible(self) -> np.ndarray | None:
        """The pieces the span's state may accept (:meth:`SmilesVocab.possible`), from its signature: whether an atom
        is current, a bond is pending, the current atom is full, a ring label may follow, a branch is empty, how many
        branches are open. None outside a span or with a character pending (a bracket atom, a ``%`` label, a ``C``
        that may become ``Cl``)."""
        state = self.state
        if state is None or state.pending:
            return None
        current = state.current
        full = current is not None and state.atoms[current].free < (1 if state.bond is None else state.bond)
        signature = (current is None, state.bond is not None, full, state.label_ok, state.empty_branch,
                     min(len(state.branches), 64))
        return self.vocab.possible(signature)

    def check(self, token: int, remaining: int = 1 << 30) -> bool:
        vocab, state = self.vocab, self.state
        if token == vocab.open_id:
            return state is None and remaining >= 4
        if state is None:
            return True
        if token == vocab.close_id:
            return state.can_close()  # RDKit reads the span once the row has ended (settle)
        if not vocab.smiles[token]:
            return False
        if self._refused == (token, remaining):
            return False  # (an engine checks a draw its row's work ran out after again: RDKit's verdict stands)
        work = self._work
        waited = self._waiting
        if waited is not None and waited[0] == (token, remaining) and work[0] >= self._given:  # (renewed: a new step,
            # as a row whose draw waits takes no work within a step)
            ok = self._rdkit_verdict(*waited)  # the draw that waited for its step: RDKit's check alone (a refusal
            self._rests = not ok  # ends the row's step: it draws again in the next)
            return ok
        if self._rests or (work[0] <= 0 and (self.can_yield or not (self._planned and self._plan and
                                                                  self._plan[0] == token))):
            return False  # the row's work for this step is spent: it yields, or takes its planned ending's next token
        work[0] -= cost(state)  # (charged on a known trial too: the row's verdicts never depend on what others did)
        key = (self.smiles, token)
        trial = vocab.trials.get(key, False)
        if trial is False:
            trial = state.copy()
            try:
                trial.feed(vocab.text[token])
            except SmilesError:
                trial = None
            if len(vocab.trials) >= TRIALS:
                vocab.retire("trials")
            vocab.trials[key] = trial
        if trial is None:
            self._refusals += 1
            return False
        need = trial.lower_bound() + 1  # at least the closing tag
        if need > remaining - 1:
            return False
        near = remaining - 1 <= need + WINDOW  # near the budget: a planned ending must fit after this token
        if near or self._risky(trial, token):  # or the token may lead where no ending is left
            plan = self._reuse(token, trial, remaining - 1)
            if plan is None:
                if work[0] <= 0:
                    return False
                plan = self._plan_tokens(trial, remaining - 1, quick=not near, text=self.smiles + vocab.text[token],
                                         work=work)
                if plan is PAUSED:
                    return False  # not decided within this step's work: the row yields, the search goes on
            if plan is None or len(plan) > remaining - 1:
                self._refusals += plan is not None or work[0] > 0  # (not when the search was cut short)
                return False
            if len(trial.atoms) <= RDKIT_ATOMS and (vocab.risky[token] or (
                    not near and (trial.pending not in ("", "C", "B") or self._refusals >= RDKIT_CHECK_AFTER))):
                molecule = self.smiles + vocab.text[token] + "".join(vocab.text[t] for t in plan[:-1])
                if self.can_yield and work[0] < _rdkit_cost(trial):
                    self._waiting = ((token, remaining), trial, plan, molecule)
                    work[0] = 0  # not within this step's work: the row yields and checks it alone in its next step
                    return False
                return self._rdkit_verdict((token, remaining), trial, plan, molecule)
            self._trial = (token, trial, plan)
            return True
        self._trial = (token, trial, None)
        return True

    def _forget_draws(self) -> None:
        """What the row knows of draws in its current state, let go of when the state changes."""
        self._waiting: tuple | None = None  # a draw whose RDKit check waits for the row's next step (see check)
        self._rests = False  # RDKit refused the draw that waited for this step: the row does nothing more in it
        self._refused: tuple | None = None  # (token, remaining) RDKit refused in the row's current state

    def _rdkit_verdict(self, draw: tuple[int, int], trial: SmilesState, plan: tuple[int, ...], molecule: str) -> bool:
        """RDKit's parse and sanitization of the planned ``molecule`` (the span, the token and its planned ending)
        decides ``draw`` (the token, the budget left), whose state after the token is ``trial``."""
        self._work[0] -= _rdkit_cost(trial)
        self._waiting = None
        if not _sanitizes(molecule, rings=False):
            self._refused = draw
            return False
        self._trial = (draw[0], trial, plan)
        return True

    def advance(self, token: int) -> None:
        vocab = self.vocab
        trial, self._trial, self._work = self._trial, None, [self._step_work()]
        self._given = self._work[0]
        self._forget_draws()
        if self._searches:  # freeing them (thousands of states) is left to tidy(), between steps
            self._let_go(self._searches)
            self._searches = {}
        plan = self._plan if self._planned else None
        self._history.append((self.state, self.smiles, self._plan, self._planned, len(self.closed)))
        if len(self._history) > UNDO_DEPTH:
            del self._history[0]
        self._plan, self._planned, self._searched = None, False, False
        if token == vocab.open_id and self.state is None:
            self.state, self.smiles = SmilesState(), ""
            return
        if token == vocab.close_id:
            if self.state is not None:
                self.closed.append(self.smiles)
            self.state, self.smiles = None, ""
            return
        if self.state is None:
            return
        if trial is not None and trial[0] == token:
            self.state = trial[1]
            if trial[2] is not None:
                self._plan, self._planned = trial[2], True
        else:  # (on a copy: the state before the token is kept for undo)
            self.state = self.state.copy()
            self.state.feed(vocab.text[token])
        if plan and plan[0] == token and not self._planned:  # following the planned ending: the rest still holds
            self._plan, self._planned = plan[1:], True
        self.smiles += vocab.text[token]


class CompositionRow(RowConstraint):
    """A crystal row against its composition header (:mod:`logos.decoding.composition`), and the crystal it closes:
    the closing tag is accepted only when the sites add up to the composition, and once the row has ended the decoded
    crystal must be one every reader accepts (:func:`logos.decoding.crystal_check.crystal_problem`, in
    :meth:`settle`; else the engine resamples the row). The header is the prompt's (crystal
    structure prediction from a cell composition), one of the prompt's ``choices`` (from a formula: the cells of the
    numbers of formula units its space group can hold, ``'Cl4Na4|Cl24Na24'``, which the grammar offers too) or,
    unconditionally, the model's own: written canonically (elements in alphabetical order, whole counts,
    charge-balanced by SMACT's rules as CDVAE scores it, as valences are kept for molecules). A header the model
    writes is ended by the space-group tag only when its sites fit in the budget left and the group can place it.
    With whole counts, sites are fully occupied (no ``<Occ>``), so every site uses up atoms and the row ends within
    :meth:`budget`."""

    MAX_ATOMS = 24  # the largest cell an unconditional row may declare in its header

    def __init__(self, table, prompt_text: str, choices: str = ""):
        from logos.decoding.composition import CompositionRows

        self.table = table
        self.close_id, self.occ_id = table.id.get("<CrystalE>"), table.id.get("<Occ>")
        self.text = prompt_text
        self.target = CompositionRows._target(prompt_text)
        self.header = self.target is None and prompt_text.endswith("<CrystalS>")  # the model writes the header
        self.head = ""
        self.choices = {h: _choice_counts(h) for h in choices.split("|")} if choices and self.header else {}

    def fork(self) -> "CompositionRow":
        new = CompositionRow.__new__(CompositionRow)
        new.__dict__.update(self.__dict__)
        return new

    @staticmethod
    def need(atoms: int) -> int:
        """Tokens a crystal of ``atoms`` atoms can need after its header: the space group, the lattice and one site
        per atom at most, each with three coordinates (digits are single tokens at worst), whatever the group."""
        return 64 + 32 * atoms

    def budget(self, default: int) -> int:
        if self.choices:  # the header (a token per character at most) and the largest cell offered
            return max(len(h) for h in self.choices) + self.need(max(sum(c.values()) for c in self.choices.values()))
        if self.header:
            return max(default, 32 + self.need(self.MAX_ATOMS))
        if self.target is None:
            return default
        return self.need(sum(self.target.values()))

    def check(self, token: int, remaining: int = 1 << 30) -> bool:
        from logos.decoding.composition import feasible

        piece = self.table.text[token]
        if self.header and self.choices:
            if not piece.startswith("<sg"):
                head = self.head + piece
                return any(h.startswith(head) for h in self.choices)
            target = self.choices.get(self.head)
            return target is not None and self.need(sum(target.values())) <= remaining and \
                feasible(target, self.text + piece, False)
        if self.header:
            if not piece.startswith("<sg"):
                head = self.head + piece
                return _header_prefix_ok(head, self.MAX_ATOMS) and not _header_dead(head, self.MAX_ATOMS)
            target = _header_counts(self.head)
            return target is not None and self.need(sum(target.values())) <= remaining and \
                _charge_balanced(tuple(sorted(target.items()))) and feasible(target, self.text + piece, False)
        if self.target is not None and token == self.occ_id:
            return False  # partial occupancy cannot add up to a composition of whole atoms
        text = self.text + piece
        final = token == self.close_id
        return self.target is None or feasible(self.target, text, final)

    def settle(self) -> str | None:
        """The crystal the row closed, written as a file and read back (pymatgen, gemmi, spglib, distances: tens of
        milliseconds, so once the row has ended, as RDKit reads molecules): why a reader refuses it (the engine
        resamples the row), None if none does."""
        from logos.decoding.crystal_check import crystal_problem

        if self.text.endswith("<CrystalE>"):
            problem = crystal_problem(self.text)
            if problem is not None:
                self.failure = f"crystal: {problem}"
        return self.failure

    def advance(self, token: int) -> None:
        piece = self.table.text[token]
        if self.header:
            if piece.startswith("<sg"):
                self.target = self.choices[self.head] if self.choices else _header_counts(self.head)
                self.header = False
            else:
                self.head += piece
        self.text += piece


_HEAD_PAIR = re.compile(r"([A-Z][a-z]?)([0-9]*)")


@functools.lru_cache(maxsize=None)
def _elements() -> tuple[str, ...]:
    from logos.decoding.crystal_rules import ELEMENTS

    return ELEMENTS


def _header_prefix_ok(head: str, max_atoms: int) -> bool:
    """Whether ``head`` can begin a canonical whole-count composition header (``Cl4Na4``: alphabetical, each element
    once, counts 1-99) of at most ``max_atoms`` atoms."""
    pairs = _HEAD_PAIR.findall(head)
    if "".join(el + n for el, n in pairs) != head:
        return False
    previous, atoms = "", 0
    for k, (el, n) in enumerate(pairs):
        last = k == len(pairs) - 1
        if n:
            if el not in _elements() or el <= previous or n[0] == "0" or len(n) > 2:
                return False
            atoms += int(n)
        elif not last:
            return False
        elif not any(e.startswith(el) and e > previous for e in _elements()):
            return False  # no element can still be spelled from here in order
        else:
            atoms += 1  # an element being written needs a count of at least 1
        previous = el
    return atoms <= max_atoms


@functools.lru_cache(maxsize=65536)
def _charge_balanced(counts: tuple[tuple[str, int], ...]) -> bool:
    """Whether a composition the model declares has a charge-neutral assignment of common oxidation states that
    passes the electronegativity test (SMACT's rules as CDVAE applies them; metals alone always pass)."""
    from logos.science.materials.validity import cdvae_compositional_validity

    return cdvae_compositional_validity(dict(counts))


@functools.lru_cache(maxsize=65536)
def _header_stuck(head: str, max_atoms: int) -> bool:
    """Whether a header that ends in a count can neither be extended (a digit, or a later element) nor ended (it is
    not charge-balanced): a dead end the row must not enter."""
    if not head[-1:].isdigit() or _header_counts(head) is None:
        return False
    last = _HEAD_PAIR.findall(head)[-1][0]
    extensions = [head + d for d in "0123456789"] + [head + e + "1" for e in _elements() if e > last]
    if any(_header_prefix_ok(x, max_atoms) for x in extensions):
        return False
    return not _charge_balanced(tuple(sorted(_header_counts(head).items())))


@functools.lru_cache(maxsize=65536)
def _header_dead(head: str, max_atoms: int) -> bool:
    """Whether a header prefix leads only to stuck headers within one more count: it is stuck itself, or it ends in
    an element being written whose every spelling with a first count digit is stuck or too large."""
    if head[-1:].isdigit():
        return _header_stuck(head, max_atoms)
    symbol = _HEAD_PAIR.findall(head)[-1][0]
    stem = head[: len(head) - len(symbol)]
    for element in _elements():
        if element.startswith(symbol):
            for digit in "123456789":
                full = stem + element + digit
                if _header_prefix_ok(full, max_atoms) and not _header_stuck(full, max_atoms):
                    return False
    return True


def _choice_counts(head: str) -> dict[str, int]:
    """The whole counts of a header choice (``Cl4Na4``), which must be canonical: the model writes it as given."""
    from logos.science.materials.parse import composition_text, parse_composition

    counts = parse_composition(head)
    if composition_text(counts) != head or any(v != round(v) for v in counts.values()):
        raise ValueError(f"header choice {head!r} is not a canonical whole-count composition")
    return {el: int(v) for el, v in counts.items()}


def _header_counts(head: str) -> dict[str, int] | None:
    """The counts of a finished header the model wrote, or None when it is not a canonical whole-count one."""
    from logos.science.materials.parse import composition_text, parse_composition
    from logos.util.records import RecordError

    if not head or not _header_prefix_ok(head, CompositionRow.MAX_ATOMS) or not head[-1].isdigit():
        return None
    try:
        counts = parse_composition(head)
    except RecordError:
        return None
    if composition_text(counts) != head:
        return None
    return {el: int(round(v)) for el, v in counts.items()}


class CopyRow(RowConstraint):
    """Binding-site search: the output spells the input chains (the grammar sees to that) with pocket marks; a mark
    is accepted only while the rest - closing the open pocket, copying the remaining residues one token each, the
    closing tags and the end of sequence - still fits in the budget."""

    TAGS = {"<ProteinS>": "open", "<AntibodyS>": "open", "<ProteinE>": "close", "<AntibodyE>": "close",
            "<PocketS>": "pocket", "<PocketE>": "unpocket"}

    def __init__(self, table, prompt_text: str):
        self.table = table
        inputs = prompt_text.split("<Search>")[0]
        chains = re.findall(r"<(?:Protein|Antibody)S>(.*?)<(?:Protein|Antibody)E>", inputs)
        self.residues = sum(len(re.sub(r"<[^>]+>", "", c)) for c in chains)
        self.chains = len(chains)
        self.kind = {i: self.TAGS[p] for p, i in table.id.items() if p in self.TAGS}
        self.written = self.opened = self.closed = 0
        self.in_pocket = False

    def fork(self) -> "CopyRow":
        new = CopyRow.__new__(CopyRow)
        new.__dict__.update(self.__dict__)
        return new

    def need(self) -> int:
        """Tokens still needed to end: the open pocket's closing mark, residues, chain tags, end of sequence."""
        return (self.residues - self.written) + self.in_pocket + (self.chains - self.opened) + \
            (self.chains - self.closed) + 1

    def budget(self, default: int) -> int:
        return max(default, self.need() + 16)

    def check(self, token: int, remaining: int = 1 << 30) -> bool:
        if self.kind.get(token) == "pocket":  # writes <PocketS> now and needs <PocketE> later
            return self.need() + 1 <= remaining - 1
        return True

    def advance(self, token: int) -> None:
        kind = self.kind.get(token)
        if kind == "open":
            self.opened += 1
        elif kind == "close":
            self.closed += 1
        elif kind == "pocket":
            self.in_pocket = True
        elif kind == "unpocket":
            self.in_pocket = False
        else:
            self.written += sum(ch.isalpha() for ch in self.table.text[token])

