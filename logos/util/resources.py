"""Shipped data (grammar, default tokenizer, tiny checkpoint, recipes, DeepSpeed JSONs) found from any directory.

Everything the package ships as data keeps its repository-relative name (``grammar/logos.lark``,
``tokenizers/default``, ``checkpoints/logos-tiny``, ``pretrain/tiny.yaml``, ``pretrain/ds_zero3.json``,
``finetune/*.yaml``) and is looked up under ONE root:

* an installed wheel: ``logos/_shipped/`` inside the package (``setup.py``'s ``build_py`` copies the
  data there);
* a source checkout or editable install (no ``_shipped/``): the repository root next to ``logos/``.

Only one of the two is ever searched: in an installed wheel the folder next to ``logos/`` is
``site-packages``, whose ``tokenizers/`` is Hugging Face's package, not ours.

:func:`shipped` names a shipped file; :func:`resolve` takes a path a user or a recipe gave: the
path as given (relative to the current directory) wins when it exists, else the shipped file of the
same relative name, else :class:`ResourceNotFound` (a ``FileNotFoundError``) says where it looked.

>>> shipped(GRAMMAR).name
'logos.lark'
>>> shipped("pretrain/tiny.yaml").relative_to(shipped_root()).as_posix()
'pretrain/tiny.yaml'
"""

from __future__ import annotations

import errno
import os
from pathlib import Path, PurePath

__all__ = [
    "GRAMMAR",
    "DEFAULT_TOKENIZER",
    "DEFAULT_CHECKPOINT",
    "ResourceNotFound",
    "shipped_root",
    "shipped",
    "resolve",
]

GRAMMAR = "grammar/logos.lark"
"""The Lark grammar: the language and the special-token inventory."""
DEFAULT_TOKENIZER = "tokenizers/default"
"""The shared SentencePiece/HF tokenizer (``logos pack --tokenizer``, recipes' ``train.tokenizer``)."""
DEFAULT_CHECKPOINT = "checkpoints/logos-tiny"
"""The shipped Hugging Face checkpoint (``logos generate --checkpoint``)."""

_PACKAGE = Path(__file__).resolve().parent.parent  # logos/ (this module is logos/util/resources.py)
_INSTALLED = _PACKAGE / "_shipped"  # written by setup.py's build_py into wheels
_CHECKOUT = _PACKAGE.parent  # the repository root of a source checkout / editable install


class ResourceNotFound(FileNotFoundError):
    """A shipped or user-given data path that exists nowhere; the message lists every place tried."""

    def __init__(self, path: str | os.PathLike, looked: list[Path], hint: str = ""):
        self.looked = list(looked)
        where = ", ".join(str(p) for p in self.looked) or "nowhere (no shipped data found next to the package)"
        super().__init__(errno.ENOENT, f"not found; looked in {where}{hint}", str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def shipped_root() -> Path | None:
    """The folder that holds the shipped data: the wheel's ``logos/_shipped``, else the source checkout."""
    if _INSTALLED.is_dir():
        return _INSTALLED
    if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "grammar").is_dir():
        return _CHECKOUT
    return None


def _relative(path: str | os.PathLike) -> PurePath | None:
    """``path`` as a shipped name (``tokenizers/default``), or None when it cannot be one (absolute, ``..``)."""
    p = PurePath(path)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        return None
    return p


def shipped(relpath: str | os.PathLike) -> Path:
    """The shipped file or folder ``relpath`` (e.g. ``"pretrain/tiny.yaml"``); never the current directory."""
    rel = _relative(relpath)
    if rel is None:
        raise ValueError(f"{relpath}: a shipped name is a relative path without '..'")
    root = shipped_root()
    candidate = root / rel if root is not None else None
    if candidate is not None and candidate.exists():
        return candidate
    raise ResourceNotFound(relpath, [candidate] if candidate is not None else [],
                           hint=" (the data shipped with logos; reinstall the package)")


def resolve(path: str | os.PathLike) -> Path:
    """A user path if it exists as given, else the shipped path of the same relative name.

    ``resolve("tokenizers/default")`` is ``./tokenizers/default`` when that exists, else the shipped
    default tokenizer; an absolute or ``..`` path is only ever taken as given.
    """
    given = Path(path).expanduser()
    if given.exists():
        return given
    looked = [given if given.is_absolute() else Path.cwd() / given]
    rel = _relative(given)
    root = shipped_root()
    if rel is not None and root is not None:
        candidate = root / rel
        if candidate.exists():
            return candidate
        looked.append(candidate)
    raise ResourceNotFound(path, looked)
