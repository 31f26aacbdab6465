"""Typed checks of configuration files: dataclass field types checked by pydantic, errors naming the key."""

from __future__ import annotations

import functools

__all__ = ["check_types"]


def check_types(cls, values: dict, section: str, error: type[Exception] = ValueError) -> None:
    """Check ``values`` against the field types of dataclass ``cls`` (pydantic, lax: ``3`` is a fine float); a
    mismatch raises ``error`` naming the key (``train.micro_batch: Input should be a valid integer, got 'x'``).

    Only a check, before the dataclass is built from the values as given (so a valid config means what it
    meant); the dataclass's own checks (``__post_init__``) then raise their own errors."""
    from pydantic import ValidationError

    try:
        _adapter(cls).validate_python(values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            if err["type"] == "value_error":  # a __post_init__ check: the dataclass itself already passed it
                continue
            key = ".".join(str(p) for p in (section, *err["loc"]))
            problems.append(f"{key}: {err['msg']}, got {err['input']!r}")
        if problems:
            raise error("; ".join(problems)) from None


@functools.lru_cache(maxsize=None)
def _adapter(cls):
    from pydantic import TypeAdapter

    return TypeAdapter(cls)
