"""Graph checks behind the SMILES state's aromaticity rules: cycles, kekulé matchings, prunable branches.

Pure functions over the state's atom list (each atom has ``neighbours`` and ``aromatic_bonds``), kept
apart from the character-level state machine in :mod:`logos.generate.chemistry`.
"""

from __future__ import annotations

import rustworkx as rx

__all__ = ["cycle_atoms", "perfect_matching", "covering_matching", "unpruned", "path_atoms"]

SEARCH_STEPS = 64  # steps of the memoised pairing search before the blossom algorithm decides


def cycle_atoms(atoms) -> set[int]:
    """Atoms on a closed cycle of the molecule graph (an incident bond that is not a bridge; Tarjan)."""
    n = len(atoms)
    order, low, out = [-1] * n, [0] * n, set()
    counter = 0
    for root in range(n):
        if order[root] >= 0:
            continue
        stack = [(root, -1, iter(atoms[root].neighbours))]
        order[root] = low[root] = counter
        counter += 1
        while stack:
            node, parent, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                if parent >= 0:
                    low[parent] = min(low[parent], low[node])
                    if low[node] <= order[parent]:  # the bond parent-node lies on a cycle
                        out.update((parent, node))
                continue
            if nxt == parent:
                continue
            if order[nxt] >= 0:
                low[node] = min(low[node], order[nxt])
            else:
                order[nxt] = low[nxt] = counter
                counter += 1
                stack.append((nxt, node, iter(atoms[nxt].neighbours)))
    return out


def perfect_matching(atoms, needing: list[int]) -> bool:
    """Whether the atoms that need a double bond pair up perfectly over their aromatic bonds (a kekulé structure).

    A memoised search that always pairs the atom with the fewest partners left (a few steps for any
    drug-like ring system); rustworkx's blossom algorithm (:func:`_blossom`) when that search branches.
    """
    need = set(needing)
    if len(need) % 2:
        return False
    partners = {i: frozenset(j for j in atoms[i].aromatic_bonds if j in need and j != i) for i in need}
    if any(not p for p in partners.values()):
        return False
    seen: set[frozenset[int]] = set()
    steps = [0]

    def match(left: frozenset[int]) -> bool | None:
        if not left:
            return True
        if left in seen:
            return False
        steps[0] += 1
        if steps[0] > SEARCH_STEPS:
            return None  # too many branches: let the blossom algorithm decide
        i = min(left, key=lambda k: (len(partners[k] & left), k))
        for j in partners[i] & left:
            found = match(left - {i, j})
            if found is None or found:
                return found
        seen.add(left)
        return False

    found = match(frozenset(need))
    if found is not None:
        return found
    return need <= _blossom(need, [(i, j, 1) for i in need for j in partners[i] if i < j], True)


def unpruned(atoms, anchors: set[int]) -> set[int]:
    """Atoms left after repeatedly removing non-anchor leaves: those on cycles or on paths between anchors."""
    degree = {i: len(a.neighbours) for i, a in enumerate(atoms)}
    alive = set(degree)
    leaves = [i for i in alive if degree[i] <= 1 and i not in anchors]
    while leaves:
        i = leaves.pop()
        if i not in alive:
            continue
        alive.discard(i)
        for j in atoms[i].neighbours:
            if j in alive:
                degree[j] -= 1
                if degree[j] <= 1 and j not in anchors:
                    leaves.append(j)
    return alive


def covering_matching(atoms, must: list[int], optional: list[int]) -> bool:
    """Whether the atoms of ``must`` can all be paired over aromatic bonds, with each other or with atoms of
    ``optional`` (which may also stay unpaired): a kekulé structure is still possible for an aromatic system whose
    atoms ``optional`` can still gain bonds. :func:`perfect_matching` is the case without optional atoms.

    A greedy pairing first (found: done); else a maximum-weight matching (:func:`_blossom`) in which an edge weighs
    the ``must`` atoms it pairs: one of weight ``len(must)`` covers them all, and only such a matching does.
    """
    need, free = set(must), set(optional) - set(must)
    if not need:
        return True
    if not free:
        return perfect_matching(atoms, must)
    every = need | free
    partners = {i: frozenset(j for j in atoms[i].aromatic_bonds if j in every and j != i) for i in every}
    if any(not partners[i] for i in need):
        return False
    taken: set[int] = set()  # greedy first (the atom with the fewest partners, a needing partner first): usually enough
    for i in sorted(need, key=lambda k: len(partners[k])):
        if i in taken:
            continue
        options = [j for j in partners[i] if j not in taken]
        if not options:
            break
        taken.update((i, min(options, key=lambda j: (j not in need, len(partners[j]), j))))
    else:
        return True
    edges = [(i, j, (i in need) + (j in need)) for i in every for j in partners[i] if i < j]
    return need <= _blossom(every, edges, False)


def _blossom(nodes, edges, max_cardinality: bool) -> set[int]:
    """The atoms paired by a maximum-weight matching (Edmonds' blossom algorithm, rustworkx: tens of microseconds
    where a search over subsets can take milliseconds) of ``edges`` (atom, atom, integer weight) among ``nodes``;
    with ``max_cardinality``, the heaviest of the largest matchings."""
    atoms = list(nodes)
    index = {atom: k for k, atom in enumerate(atoms)}
    graph = rx.PyGraph()
    graph.add_nodes_from(atoms)
    graph.add_edges_from([(index[i], index[j], w) for i, j, w in edges])
    pairs = rx.max_weight_matching(graph, max_cardinality=max_cardinality, weight_fn=lambda w: w)
    return {atoms[k] for pair in pairs for k in pair}


def path_atoms(atoms, start: int, goal: int) -> list[int]:
    """The atoms of a shortest path from ``start`` to ``goal`` in the molecule graph (both included; [] if none)."""
    if start == goal:
        return [start]
    parent = {start: start}
    frontier = [start]
    while frontier:
        nxt = []
        for i in frontier:
            for j in atoms[i].neighbours:
                if j in parent:
                    continue
                parent[j] = i
                if j == goal:
                    out = [j]
                    while out[-1] != start:
                        out.append(parent[out[-1]])
                    return out
                nxt.append(j)
        frontier = nxt
    return []
