"""LOGOS: one token grammar for molecules, reactions, proteins, pockets, crystals and MOFs, and one language model.

The public API: ``encode``, ``decode``, ``validate`` and ``load_model`` (:mod:`logos.api`), ``generate.run``
and ``evaluate.run`` (the jobs), and the task registry ``tasks``. Names are imported on first use, so
``import logos`` (and ``logos --help``) loads neither RDKit, gemmi, spglib nor torch.
"""

from logos.util.version import VERSION as __version__

__all__ = ["encode", "decode", "validate", "load_model", "generate", "evaluate", "tasks", "__version__"]

_API = {"encode", "decode", "validate", "load_model"}
_PACKAGES = {"generate", "evaluate", "tasks"}  # logos.generate.run(...), logos.evaluate.run(...), logos.tasks.get(...)


def __getattr__(name: str):
    if name in _API:
        from logos import api

        return getattr(api, name)
    if name in _PACKAGES:
        import importlib

        return importlib.import_module(f"logos.{name}")
    raise AttributeError(f"module 'logos' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
