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
    """Whether the atoms that need a double bond pair up perfectly over their aromatic bonds (a kekulé structure)."""
    import networkx as nx

    graph = nx.Graph()
    graph.add_nodes_from(needing)
    graph.add_edges_from((i, j) for i in needing for j in atoms[i].aromatic_bonds if j in graph and i < j)
    return 2 * len(nx.max_weight_matching(graph, maxcardinality=True)) == len(needing)


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
