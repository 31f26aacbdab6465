"""Import order: the materials package and the domain registry never need each other half-initialized."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize("first", ["logos.science.materials.validity", "logos.domains.mof", "logos.science.materials.framework"])
def test_materials_and_domains_import_in_either_order(first):
    # logos.science.materials uses the RDKit helpers of logos.science.chemistry, not the molecule domain, so no import cycle
    code = (f"import {first}; import logos.science.materials as m, logos.domains as d; "
            "assert d.DOMAINS['mof'].options_type().bond_tolerance == 0.4 and callable(m.split_framework)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_the_library_never_imports_the_cli():
    code = ("import sys, logos.data.corpus, logos.data.encode, logos.data.decode, logos.data.pack, logos.generate, logos.train, "
            "logos.science.materials.validity; assert 'logos.cli' not in sys.modules, 'library imports the CLI'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_every_script_compiles():
    """The benchmark and helper scripts (run by hand or by make targets, imported by no test) are valid Python."""
    import ast

    scripts = sorted((REPO / "benchmarks").glob("*.py")) + sorted((REPO / "scripts").glob("*.py"))
    assert scripts
    for path in scripts:
        ast.parse(path.read_text(), filename=str(path))
