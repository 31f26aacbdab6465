"""Rewrite imports of the pre-layering module paths to the layered package (``logos/util``, ``language``, ...).

The layered layout moved every module once (``git mv``); code written against the old paths (another
branch, a notebook) is brought over with::

    python scripts/relayout.py FILE_OR_DIR ...

It rewrites dotted module paths (``logos.chem`` -> ``logos.science.chemistry``) in Python, Markdown,
shell and YAML files, and ``from logos import <old module> [as name]`` lines. It is idempotent; lines that
import several old modules at once (``from logos import grammar, resources``) are left for a person.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

# old dotted module -> new dotted module; longer (more specific) names first
MOVES = {
    "logos.materials.constraint": "logos.decoding.crystal_rules",
    "logos.generate.chemistry": "logos.decoding.chemistry",
    "logos.generate.atoms": "logos.decoding.atoms",
    "logos.generate.aromatic": "logos.decoding.aromatic",
    "logos.generate.constraints": "logos.decoding.constraints",
    "logos.generate.composition": "logos.decoding.composition",
    "logos.generate.sampler": "logos.decoding.sampler",
    "logos.generate.tasks": "logos.tasks.prompts",
    "logos.finetune.lora": "logos.train.lora",
    "logos.finetune.data": "logos.tasks.pairs",
    "logos.finetune.crystals": "logos.tasks.crystal_pairs",
    "logos.materials": "logos.science.materials",
    "logos.records": "logos.util.records",
    "logos.resources": "logos.util.resources",
    "logos.isolate": "logos.util.isolate",
    "logos.grammar": "logos.language.grammar",
    "logos.tokenizer": "logos.language.tokenizer",
    "logos.extend": "logos.language.extend",
    "logos.chem": "logos.science.chemistry",
    "logos.data": "logos.data.datasets",
    "logos.encode": "logos.data.encode",
    "logos.decode": "logos.data.decode",
    "logos.splits": "logos.data.splits",
    "logos.corpus_ray": "logos.data.corpus_ray",
    "logos.corpus": "logos.data.corpus",
    "logos.pack": "logos.data.pack",
    "logos.shards": "logos.data.shards",
    "logos.export": "logos.train.export",
    "logos.plan": "logos.train.plan",
}
# single names that moved to another module, applied after MOVES: (module, name) -> new module
NAMES = {
    ("logos.generate", "molecule_summary"): "logos.evaluate.molecules",
    ("logos.generate.pipeline", "molecule_summary"): "logos.evaluate.molecules",
    ("logos.data.corpus", "build_corpus"): "logos.data.corpus_build",
    ("logos.data.corpus", "get_engine"): "logos.data.corpus_build",
    ("logos.data.datasets", "cache_dir"): "logos.util.files",
}
# modules of the new ``logos.data`` package: ``from logos.data import pack`` is already the new layout
_DATA_MODULES = {"datasets", "encode", "decode", "splits", "corpus", "corpus_ray", "corpus_build", "pack", "shards"}


def _pattern(old: str) -> re.Pattern:
    # a dotted path not followed by more identifier characters; "logos.data" only when it is not already a
    # path into the new ``logos.data`` package
    tail = r"(?![\w])" if old != "logos.data" else r"(?![\w.])"
    return re.compile(r"(?<![\w.])" + re.escape(old) + tail)


def _path_form(dotted: str) -> str:
    return dotted.replace(".", "/")


def rewrite(text: str) -> str:
    for old, new in MOVES.items():
        if old == "logos.data":
            text = re.sub(r"(?<![\w.])logos\.data(?![\w.])(?!\.datasets)(?! import (\w+))", "logos.data.datasets", text)
            text = re.sub(r"(?<![\w.])logos\.data import (\w+)",
                          lambda m: m.group(0) if m.group(1) in _DATA_MODULES else f"logos.data.datasets import {m.group(1)}",
                          text)
            text = re.sub(r"(?m)^(\s*)from logos import data\b(?! as)", r"\1from logos.data import datasets as data", text)
            continue
        text = _pattern(old).sub(new, text)
        pkg, _, mod = old.rpartition(".")
        newpkg, _, newmod = new.rpartition(".")
        # from logos.generate import tasks  ->  from logos.tasks import prompts as tasks (also "... as x")
        text = re.sub(rf"(?m)^(\s*)from {re.escape(pkg)} import {mod}(\s+as\s+\w+)?\s*$",
                      lambda m: f"{m.group(1)}from {newpkg} import {newmod}"  # noqa: B023 - called here
                      + (m.group(2) or (f" as {mod}" if newmod != mod else "")), text)  # noqa: B023
        # file paths in docs: logos/science/chemistry.py -> logos/science/chemistry.py
        ends = r"(\.py|/)" if old == "logos.science.materials" else r"(\.py)"
        text = re.sub(rf"(?<![\w/]){re.escape(_path_form(old))}{ends}", _path_form(new) + r"\1", text)
    for (module, name), new in NAMES.items():
        text = re.sub(rf"(?m)^(\s*)from {re.escape(module)} import {name}\s*$", rf"\1from {new} import {name}", text)
    return text


def main(paths: list[str]) -> None:
    suffixes = {".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".cfg", ".txt"}
    files = []
    for p in map(Path, paths):
        files += [f for f in p.rglob("*") if f.is_file() and f.suffix in suffixes] if p.is_dir() else [p]
    for f in files:
        if f.resolve() == Path(__file__).resolve():
            continue
        old = f.read_text(encoding="utf-8")
        new = rewrite(old)
        if new != old:
            f.write_text(new, encoding="utf-8")
            print(f"rewrote {f}")


if __name__ == "__main__":
    main(sys.argv[1:])
