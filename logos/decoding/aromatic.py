"""Graph checks behind the SMILES state's aromaticity rules: cycles, kekulé matchings, prunable branches.

Pure functions over the state's atom list (each atom has ``neighbours`` and ``aromatic_bonds``), kept
apart from the character-level state machine in :mod:`logos.generate.chemistry`.
"""

from __future__ import annotations

__all__ = ["cycle_atoms", "perfect_matching", "unpruned"]


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
    drug-like ring system); networkx's blossom algorithm when that search branches too much.
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
        if steps[0] > 2000:
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
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(need)
    graph.add_edges_from((i, j) for i in need for j in partners[i] if i < j)
    return 2 * len(nx.max_weight_matching(graph, maxcardinality=True)) == len(need)


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
