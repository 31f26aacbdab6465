"""Build hook only (metadata lives in pyproject.toml): wheels carry the shipped data in ``logos/_shipped/``.

The grammar, tokenizers, the tiny checkpoint and the recipes stay in their top-level repository folders
(``tokenizers/`` must never become a Python package: it would shadow Hugging Face ``tokenizers``).
``build_py`` copies them, keeping their relative paths, to ``<build_lib>/logos/_shipped/``, where
``logos.util.resources`` finds them at run time. ``MANIFEST.in`` lists the same files so that an sdist, and
a wheel built from it, carries them too. Editable installs copy nothing (``logos.util.resources`` then reads
the checkout), except in setuptools' strict editable mode, which links the same mapping.
"""

from __future__ import annotations

import glob
import os

from setuptools import setup
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


setup(cmdclass={"build_py": build_py})
