"""Build hook only (metadata lives in pyproject.toml): the compiled decoder core, and the shipped data in wheels.

The decoder's state machine and ending planner (``COMPILED`` of ``logos.decoding``: plain Python modules) are compiled by Cython into
extension modules beside their sources, the same code about 1.5x faster; ``_compiled.json`` beside them records
the digest of each source compiled, so that a source edited since is loaded instead of its stale build
(``logos/decoding/__init__.py``). Without Cython or a C compiler the package installs as plain Python.

The grammar, tokenizers, the tiny checkpoint and the recipes stay in their top-level repository folders
(``tokenizers/`` must never become a Python package: it would shadow Hugging Face ``tokenizers``).
``build_py`` copies them, keeping their relative paths, to ``<build_lib>/logos/_shipped/``, where
``logos.util.resources`` finds them at run time. ``MANIFEST.in`` lists the same files so that an sdist, and
a wheel built from it, carries them too. Editable installs copy nothing (``logos.util.resources`` then reads
the checkout), except in setuptools' strict editable mode, which links the same mapping.
"""

from __future__ import annotations

import ast
import glob
import hashlib
import json
import os

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext as _build_ext
from setuptools.command.build_py import build_py as _build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SHIPPED_ROOT = os.path.join("logos", "_shipped")
# Repository-relative globs of the data a wheel ships (keep MANIFEST.in in step; tests/test_packaging.py checks).
SHIPPED = [
    "grammar/*.lark",
    "tokenizers/*/**/*",
    "checkpoints/logos-tiny/**/*",
    "pretrain/*.yaml",
    "pretrain/*.json",
    "pretrain/hostfile.example",
    "pretrain/launch_multinode.sh",
    "finetune/*.yaml",
]


def shipped_files() -> list[str]:
    """Repository-relative paths of every shipped file (no hidden files, no caches)."""
    found = set()
    for pattern in SHIPPED:
        for path in glob.glob(os.path.join(HERE, pattern), recursive=True):
            rel = os.path.relpath(path, HERE)
            parts = rel.split(os.sep)
            if os.path.isfile(path) and not any(p.startswith(".") or p == "__pycache__" for p in parts):
                found.add(rel)
    return sorted(found)


class build_py(_build_py):
    """setuptools' build_py plus the shipped data under ``logos/_shipped/``."""

    def _shipped_mapping(self) -> dict[str, str]:
        return {os.path.join(self.build_lib, SHIPPED_ROOT, rel): os.path.join(HERE, rel) for rel in shipped_files()}

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        for dest, src in self._shipped_mapping().items():
            self.mkpath(os.path.dirname(dest))
            self.copy_file(src, dest)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:  # super() listed get_output_mapping(), which already has the data
            return outputs
        return outputs + list(self._shipped_mapping())

    def get_output_mapping(self) -> dict[str, str]:
        return {**super().get_output_mapping(), **self._shipped_mapping()}


DIGESTS = "_compiled.json"


def compiled_modules() -> list[str]:
    """The decoder's hot path to compile: ``COMPILED`` of ``logos/decoding/__init__.py``, read from its source (the
    build imports nothing of the package)."""
    with open(os.path.join(HERE, "logos", "decoding", "__init__.py")) as f:
        body = ast.parse(f.read()).body
    names = next(ast.literal_eval(node.value) for node in body if isinstance(node, ast.Assign)
                 and any(getattr(target, "id", None) == "COMPILED" for target in node.targets))
    return [f"logos.decoding.{name}" for name in names]


def source_digest(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class build_ext(_build_ext):
    """setuptools' build_ext (optional extensions: a failed compile leaves plain Python), then the digest of each
    compiled source in ``_compiled.json`` beside the modules built."""

    def run(self) -> None:
        super().run()
        digests: dict[str, dict[str, str]] = {}
        for ext in self.extensions:
            built = self.get_ext_fullpath(ext.name)
            if os.path.exists(built):
                folder = os.path.dirname(built)
                source = os.path.join(HERE, *ext.name.split(".")) + ".py"  # (ext.sources: the generated C)
                digests.setdefault(folder, {})[ext.name.rsplit(".", 1)[1]] = source_digest(source)
        for folder, table in digests.items():
            with open(os.path.join(folder, DIGESTS), "w") as f:
                json.dump(table, f, indent=1, sort_keys=True)

    def get_outputs(self) -> list[str]:
        folders = {os.path.dirname(self.get_ext_fullpath(ext.name)) for ext in self.extensions}
        return super().get_outputs() + [os.path.join(folder, DIGESTS) for folder in sorted(folders)]


def extensions() -> list[Extension]:
    """The compiled modules, or none where Cython is missing (plain Python then)."""
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("setup.py: Cython is not installed: the decoder's state machine stays plain Python")
        return []
    modules = [Extension(name, [os.path.join(*name.split(".")) + ".py"], optional=True) for name in compiled_modules()]
    # annotation_typing off: annotations are documentation here, not C types (the code stays plain Python)
    return cythonize(modules, build_dir=os.path.join("build", "cython"), quiet=True,
                     compiler_directives={"language_level": 3, "annotation_typing": False})


setup(cmdclass={"build_py": build_py, "build_ext": build_ext}, ext_modules=extensions())
