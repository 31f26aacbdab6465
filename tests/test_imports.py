"""Import order: the materials package and the domain registry import each other's modules."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize("first", ["logos.materials.validity", "logos.domains.mof"])
def test_materials_and_domains_import_in_either_order(first):
    # logos.materials.framework imports logos.domains.molecule, which loads the registry and
    # logos.domains.mof while framework is half-initialized when logos.materials comes first.
    code = (f"import {first}; import logos.materials as m, logos.domains as d; "
            "assert d.DOMAINS['mof'].options_type().bond_tolerance == 0.4 and callable(m.split_framework)")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)
