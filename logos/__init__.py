"""LOGOS: one token grammar for molecules, reactions, proteins, pockets, crystals and MOFs, and one language model.

The public API (:mod:`logos.api`): ``encode``, ``decode``, ``validate``, ``load_model``, ``generate``,
``evaluate`` and the task registry ``tasks``. Names are imported on first use, so ``import logos`` (and
``logos --help``) loads neither RDKit, gemmi, spglib nor torch.
"""

from logos.util.version import VERSION as __version__

__all__ = ["encode", "decode", "validate", "load_model", "generate", "evaluate", "tasks", "__version__"]

_API = {"encode", "decode", "validate", "load_model", "generate", "evaluate"}


def __getattr__(name: str):
    if name in _API:
        from logos import api

        return getattr(api, name)
    if name == "tasks":
        import importlib

        return importlib.import_module("logos.tasks")
    raise AttributeError(f"module 'logos' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
