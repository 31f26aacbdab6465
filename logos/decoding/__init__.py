"""Constrained decoding: grammar masks, per-row domain constraints (chemistry, crystal composition), the sampler.

The chemistry state machine and the ending planner (``COMPILED``) are plain Python that the install compiles with
Cython (``setup.py``): the same code, about 1.5x faster. A compiled module is used only while its source is the one
it was built from (the digests in ``_compiled.json``, written by the build); a source edited since, a build that
failed, or ``LOGOS_PURE_PYTHON=1`` in the environment loads the source instead (:func:`native`).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from pathlib import Path

COMPILED = ("atoms", "aromatic", "chemistry", "ending")  # in import order (each imports only those before it)
_HERE = Path(__file__).resolve().parent


def _compiled_path(name: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _HERE / (name + suffix)
        if path.exists():
            return path
    return None


def _load_source(name: str) -> None:
    """Import ``logos.decoding.<name>`` from its ``.py`` file even where a compiled module sits beside it."""
    full = f"{__name__}.{name}"
    spec = importlib.util.spec_from_file_location(full, _HERE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[full] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[full]
        raise
    setattr(sys.modules[__name__], name, module)


def _prefer_current_sources() -> None:
    """Load from source each compiled module that is stale (its source's digest is not the one built) or unwanted."""
    built = [name for name in COMPILED if _compiled_path(name) is not None]
    if not built:
        return
    if os.environ.get("LOGOS_PURE_PYTHON") == "1":
        stale = built
    else:
        try:
            digests = json.loads((_HERE / "_compiled.json").read_text())
        except (OSError, ValueError):
            digests = {}
        stale = [name for name in built if digests.get(name) != hashlib.sha256((_HERE / f"{name}.py").read_bytes())
                 .hexdigest()]
        if stale:
            warnings.warn(f"logos.decoding: compiled modules older than their sources ({', '.join(stale)}): running "
                          "the sources, slower (rebuild: make native, or pip install -e .)", stacklevel=2)
    for name in COMPILED:  # in import order, so a source module imports the sources loaded before it
        if name in stale:
            _load_source(name)


def native() -> dict[str, bool]:
    """Which of the ``COMPILED`` modules run compiled (True) or as Python source (False)."""
    return {name: not sys.modules[f"{__name__}.{name}"].__file__.endswith(".py") for name in COMPILED
            if f"{__name__}.{name}" in sys.modules}


_prefer_current_sources()
