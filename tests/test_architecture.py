"""The package's layers: every import (module level or inside a function) points down, and no module cycle exists.

The layers, top to bottom, are stated once in ``LAYERS`` and in ``docs/architecture.md``; modules in
one layer's sibling packages (``generate`` and ``evaluate``) do not import each other. The check reads
the source with ``ast``, so imports hidden in functions count as much as those at the top of a file.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "logos"

# top -> bottom; a tuple is a layer of independent sibling packages
LAYERS: list[tuple[str, ...]] = [
    ("cli",),
    ("api",),
    ("finetune", "report"),
    ("generate", "evaluate"),
    ("tasks",),
    ("decoding", "train"),
    ("data",),
    ("domains",),
    ("science",),
    ("language",),
    ("util",),
]
# nothing below the API may import the root package (its __init__ reaches the API)
ALLOWED: set[str] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The logos modules that ``name`` imports (``from pkg import module`` resolved to the module)."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "logos"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "logos":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in modules or sub in ALLOWED else target)
    return out


def _layer(module: str) -> tuple[int, str] | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for i, group in enumerate(LAYERS):
        if parts[1] in group:
            return i, parts[1]
    return None


def _graph():
    modules = _modules()
    return modules, {m: _imports(m, p, modules) for m, p in modules.items()}


def test_every_module_is_in_a_layer():
    modules, _ = _graph()
    loose = [m for m in modules if m != "logos" and m != "logos.__main__" and _layer(m) is None]
    assert not loose, f"modules outside every layer (put them in a layer folder): {loose}"


def test_imports_exist():
    modules, graph = _graph()
    missing = sorted({(m, t) for m, ts in graph.items() for t in ts if t not in modules and t not in ALLOWED})
    assert not missing, f"imports of modules that do not exist: {missing}"


def test_imports_point_down():
    _, graph = _graph()
    bad = []
    for module, targets in graph.items():
        here = _layer(module)
        if here is None:
            continue
        for t in targets:
            there = _layer(t)
            if there is None or t in ALLOWED:
                if t == "logos" or (t.startswith("logos.") and t not in ALLOWED and there is None):
                    bad.append(f"{module} -> {t} (the root package)")
                continue
            if there[0] < here[0] or (there[0] == here[0] and there[1] != here[1]):
                bad.append(f"{module} -> {t}")
    assert not bad, "upward or sideways imports:\n  " + "\n  ".join(sorted(bad))


def test_no_cycles():
    _, graph = _graph()
    # package __init__ files that re-export their own submodules are not edges of a cycle
    edges = {m: {t for t in ts if t in graph and not (m.startswith(t + ".") and graph.get(t) is not None)}
             for m, ts in graph.items()}
    for m in list(edges):
        edges[m] = {t for t in edges[m] if not (t == m.rpartition(".")[0])}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n  " + "\n  ".join(" -> ".join(c) for c in cycles)


# heavy libraries a lower layer must not import: science and util run without torch; the language layer
# uses Hugging Face tokenizers but no torch, except vocabulary extension, which resizes a model's embeddings
FORBIDDEN = {"logos.science": ("torch", "transformers", "deepspeed"), "logos.util": ("torch", "transformers", "deepspeed"),
             "logos.language": ("torch", "deepspeed")}
EXEMPT = {"logos.language.extend"}


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layers_need_no_torch(layer):
    bad = []
    for name, path in _modules().items():
        if not (name == layer or name.startswith(layer + ".")) or name in EXEMPT:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{name}: {n}" for n in names if n.split(".")[0] in FORBIDDEN[layer]]
    assert not bad, bad
