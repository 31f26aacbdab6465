"""The shortest way to end a SMILES being written: a small best-first search over closing characters.

A row near its length budget must still be able to close its molecule span validly. :func:`plan_ending`
finds a short suffix that does: close a bracket atom, close open rings, close branches, and add
atoms where rings, bonds or aromatic systems need them - aromatic ones (``c``) as well as aliphatic
(``C``), so a half-written benzene ring (``Cc1cc``) ends as ``cc1`` + ring closures rather than not
at all, and an exocyclic double bond where an aromatic ring needs one (a tropone ends ``c1=O``).
Each candidate move is applied to a copy-on-write copy of the state with the same checks
the decoder applies to a token (valence, rings, aromatic atoms that can still end in a ring,
finished aromatic systems that kekulize), and the goal is :meth:`SmilesState.can_close`. The
search is bounded (``max_nodes``), so a plan costs at most a few milliseconds; None means no
ending was found within the bounds (the caller resamples the row).
"""

from __future__ import annotations

import heapq

from logos.decoding.chemistry import SmilesError, SmilesState

__all__ = ["plan_ending", "plan_search", "run_search", "PAUSED", "cost", "apply_move"]

_ATOMS = ("c", "C", "n", "N", "O")
_ALIPHATIC_FIRST = ("C", "c", "N", "n", "O")
_EXOCYCLIC = ("=O", "=C")


def _moves(state: SmilesState) -> list[str]:
    if state.pending.startswith("["):
        return ["]", "H]"]
    if state.pending.startswith("%"):
        return list("0123456789")
    if state.pending == "<":
        return ["-"]
    moves = list(state.rings)  # single digits, or "%nn"
    if state.branches and state.bond is None:
        moves.append(")")
    if state.lonely and state.label_ok and state.bond is None and state.atoms[state.current].free >= 1:
        label = next((d for d in "123456789" if d not in state.rings), None)
        if label is not None:  # an aromatic atom on no ring yet: a new ring through it
            moves.append(label)
    aromatic = state.current is not None and state.atoms[state.current].aromatic
    moves.extend(_ATOMS if aromatic else _ALIPHATIC_FIRST)
    if aromatic and state.bond is None and state.atoms[state.current].free >= 2:
        moves.extend(_EXOCYCLIC)  # an aromatic atom short of a double bond in its ring takes one outside it
    if aromatic and not state.label_ok and state.bond is None and state.current in state.lonely:
        moves.append("(")  # an aromatic atom past its ring labels on no ring yet: a ring through a branch, c(=O)(C1)C1
    return moves


def cost(state: SmilesState) -> int:
    """Work units of one update of ``state`` (a character or piece applied and its dead-end checks): grows with the
    molecule, as the checks of its rings and aromatic systems do. One unit is about 10-25 microseconds in the
    sampling loop, where the model's forward pass has just pushed the checks' code and states out of the caches (a
    few microseconds when they are warm)."""
    return 2 + (len(state.atoms) >> 3)


def apply_move(state: SmilesState, move: str, work: list[int] | None = None) -> SmilesState | None:
    """``state`` with the characters of ``move`` applied to a copy and every check passed (None if one fails), its
    :func:`cost` taken from ``work``."""
    if work is not None:
        work[0] -= cost(state)
    trial = state.copy()
    try:
        for ch in move:
            trial._char(ch)
        trial.flush()
        if trial.dead_end() is not None:
            return None
    except SmilesError:
        return None
    return trial


def _greedy(start: SmilesState, limit: int, max_nodes: int, work: list[int] | None = None):
    """Depth first, moves in order (ring closures, branch ends, then atoms): finds a short ending in a few moves.
    A generator (see :func:`plan_search`): yields while ``work`` is spent, returns the ending or None."""
    stack = [("", start, iter(_moves(start)))]
    nodes = 0
    while stack and nodes < max_nodes:
        while work is not None and work[0] <= 0:
            yield
        path, s, moves = stack[-1]
        move = next(moves, None)
        if move is None:
            stack.pop()
            continue
        nxt = apply_move(s, move, work)
        nodes += 1
        if nxt is None:
            continue
        new = path + move
        if nxt.can_close():
            return new
        if len(new) + nxt.lower_bound() < limit:
            stack.append((new, nxt, iter(_moves(nxt))))
    return None


def plan_search(state: SmilesState, limit: int = 48, max_nodes: int = 400, quick: int = 40,
                work: list[int] | None = None):
    """:func:`plan_ending` as a generator that can be paused and resumed: it yields (None) whenever ``work`` (a
    one-element list) is spent, continues where it stopped once the caller has put work back in it, and returns the
    ending (``StopIteration.value``). A search spread over several steps costs what one search would."""
    start = state.copy()
    try:
        start.flush()
    except SmilesError:
        return None
    if start.can_close():
        return ""
    if start.lower_bound() > limit:
        return None
    if quick:
        found = yield from _greedy(start, min(limit, start.lower_bound() + 8), quick, work)
        if found is not None or max_nodes <= quick:
            return found
    heap = [(start.lower_bound(), 0, 0, "", start)]
    count, seen = 1, {""}
    while heap and count < max_nodes:
        *_, path, s = heapq.heappop(heap)
        for rank, move in enumerate(_moves(s)):
            while work is not None and work[0] <= 0:
                yield
            nxt = apply_move(s, move, work)
            if nxt is None:
                continue
            new = path + move
            if nxt.can_close():
                return new
            if len(new) + nxt.lower_bound() > limit or new in seen:
                continue
            seen.add(new)
            count += 1
            # fewest characters first; among equals the longer path, then the earlier move (ring closures first)
            heapq.heappush(heap, (len(new) + nxt.lower_bound(), -len(new), count * 16 + rank, new, nxt))
    return None


PAUSED = object()  # what :func:`run_search` returns for a search that has spent its work and can go on


def run_search(search) -> object:
    """Drive a :func:`plan_search` until it ends (its ending, or None) or spends its work (:data:`PAUSED`)."""
    try:
        next(search)
    except StopIteration as stop:
        return stop.value
    return PAUSED


def plan_ending(state: SmilesState, limit: int = 48, max_nodes: int = 400, quick: int = 40,
                work: list[int] | None = None) -> str | None:
    """A short suffix after which the span may close (``""``: it may close now), or None within the bounds.

    A depth-first try of ``quick`` moves first (the common case: close the ring, the branch); then a best-first
    search of up to ``max_nodes`` states for the shortest ending. ``work`` (a one-element list) bounds the work, shared
    by several calls: each move tried takes its :func:`cost`, and the search stops when none is left (None).
    """
    found = run_search(plan_search(state, limit, max_nodes, quick, work))
    return None if found is PAUSED else found
