"""The checkpoint store: atomic DeepSpeed checkpoints (manifest, commit, retention), RNG states, resume.

A checkpoint tag (``OUT/checkpoints/stepNNNNNNN``) is *complete* when its folder holds
``logos_manifest.json`` (every other file's relative path, size and sha256, plus the step and data
position) and every listed file matches it. Saving, on every rank:

1. DeepSpeed writes the tag (``save_latest=False``: ``latest`` is not touched); the client state
   carries the step, data position, tokens, elapsed time, the LR schedule's length and every
   rank's RNG states (torch, CUDA, python, numpy);
2. after a barrier the ranks hash the files, a slice each; rank 0 writes the manifest, then moves
   ``latest`` with a temp file + ``os.replace`` - the commit: ``latest`` always names a complete tag;
3. retention keeps the newest ``keep_checkpoints`` complete tags up to the new one.

Resume tries the tag ``latest`` names, then older tags newest-first, refusing (one line each) tags
whose manifest is missing or whose files do not match it. A damaged committed checkpoint with
nothing older usable is a :class:`CheckpointError`, not a silent restart from step 0.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from logos.train.distributed import Dist

__all__ = ["CheckpointStore", "CheckpointError", "CheckpointSaveError", "MANIFEST", "LATEST", "checkpoint_tags",
           "read_latest", "verify_checkpoint", "atomic_write_text", "rng_state", "set_rng_state"]

MANIFEST = "logos_manifest.json"
LATEST = "latest"


class CheckpointError(RuntimeError):
    """``--resume`` found checkpoints but none of them is usable."""


class CheckpointSaveError(CheckpointError):
    """A checkpoint could not be written (disk full, I/O error); the partial tag was removed."""


def tag_name(step: int) -> str:
    return f"step{step:07d}"


def _tag_step(name: str) -> int | None:
    return int(name[4:]) if name.startswith("step") and name[4:].isdigit() else None


def checkpoint_tags(ckpt: Path) -> list[str]:
    """Tag folders ``stepNNNNNNN`` in ``ckpt``, newest (highest step) first."""
    if not ckpt.is_dir():
        return []
    tags = [p.name for p in ckpt.iterdir() if p.is_dir() and _tag_step(p.name) is not None]
    return sorted(tags, key=_tag_step, reverse=True)


def read_latest(ckpt: Path) -> str | None:
    path = ckpt / LATEST
    return (path.read_text().strip() or None) if path.is_file() else None


def resume_candidates(ckpt: Path) -> list[str]:
    """Tags to try on resume: the one ``latest`` names, then the older tags newest-first.

    Tags newer than ``latest`` are not candidates: they belong to a save that never committed (or to
    a timeline abandoned by an earlier fallback).
    """
    tags = checkpoint_tags(ckpt)
    latest = read_latest(ckpt)
    if latest is None or _tag_step(latest) is None:
        return tags
    return [latest] + [t for t in tags if _tag_step(t) < _tag_step(latest)]


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``path`` via a temp file in the same folder + fsync + ``os.replace`` (never half-written)."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _file_digest(path: Path, sync: bool = False) -> tuple[int, str]:
    """(size, sha256) of a file; ``sync`` also fsyncs it (the bytes are durable before the manifest)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
        if sync:
            with contextlib.suppress(OSError):
                os.fsync(fh.fileno())
    return path.stat().st_size, h.hexdigest()


def _checkpoint_files(tag_dir: Path) -> list[str]:
    """Relative paths (posix) of every file in a tag folder except the manifest, sorted."""
    return sorted(p.relative_to(tag_dir).as_posix() for p in tag_dir.rglob("*")
                  if p.is_file() and p.name != MANIFEST)


def _digest_files(tag_dir: Path, files: list[str], sync: bool = False) -> dict[str, dict]:
    return {f: dict(zip(("size", "sha256"), _file_digest(tag_dir / f, sync))) for f in files}


def read_manifest(tag_dir: Path) -> tuple[dict | None, str | None]:
    """(manifest, None) or (None, why the tag is incomplete)."""
    if not tag_dir.is_dir():
        return None, "missing (no such folder)"
    path = tag_dir / MANIFEST
    if not path.is_file():
        return None, f"incomplete (missing {MANIFEST})"
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        assert isinstance(files, dict) and files
        return manifest, None
    except Exception:  # noqa: BLE001 - any unreadable manifest means the same thing
        return None, f"corrupt (unreadable {MANIFEST})"


def verify_files(tag_dir: Path, manifest: dict, files: list[str]) -> str | None:
    """Why the listed ``files`` of a tag do not match its manifest (None when they all match)."""
    for f in files:
        try:
            want = {"size": int(manifest["files"][f]["size"]), "sha256": str(manifest["files"][f]["sha256"])}
        except (KeyError, TypeError, ValueError):
            return f"corrupt (unreadable {MANIFEST})"
        path = tag_dir / f
        if not path.is_file():
            return f"incomplete ({f} is missing)"
        size = path.stat().st_size
        if size != want["size"]:
            return f"corrupt ({f}: {size} bytes, the manifest says {want['size']})"
        if _file_digest(path)[1] != want["sha256"]:
            return f"corrupt ({f}: sha256 differs from the manifest)"
    return None


def verify_checkpoint(tag_dir: Path) -> str | None:
    """Why a tag folder is not a complete checkpoint (None when it is): manifest present, files match."""
    manifest, why = read_manifest(tag_dir)
    return why or verify_files(tag_dir, manifest, sorted(manifest["files"]))


def rng_state() -> dict:
    """RNG states of this process as tensors and plain values (loadable with ``weights_only=True``)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(),
             "python": [version, list(internal), gauss],
             "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointStore:
    """Atomic save and verified resume of a DeepSpeed engine in ``folder`` (see the module docstring)."""

    def __init__(self, folder: Path, dist: Dist, keep: int, echo):
        self.folder = Path(folder)
        self.dist = dist
        self.keep = keep
        self.echo = echo

    def save(self, engine, step: int, state: dict) -> Path:
        """Write tag ``stepNNNNNNN`` with ``state`` (plus RNG states) as DeepSpeed client state; commit; retain."""
        tag = tag_name(step)
        if self.dist.is_main and (self.folder / tag).exists():  # left by an abandoned timeline: start clean
            shutil.rmtree(self.folder / tag)
        self.dist.barrier()
        state = {**state, "step": step, "rng": self.dist.gather_objects(rng_state())}
        why = None
        try:
            engine.save_checkpoint(str(self.folder), tag=tag, client_state=state, save_latest=False)
        except OSError as e:  # disk full, quota, I/O error: this tag is lost, the previous one is intact
            why = f"{e.strerror or e} ({e.filename or self.folder / tag})"
        why = next((w for w in self.dist.gather_objects(why) if w), None)  # every rank's files are written
        if why is not None:
            if self.dist.is_main:
                shutil.rmtree(self.folder / tag, ignore_errors=True)
            self.dist.barrier()
            previous = self.latest_complete()
            raise CheckpointSaveError(f"checkpoint {tag} not written: {why}; removed it, "
                                      + (f"{previous} stays the resume point" if previous else "no earlier checkpoint"))
        self._commit(tag, {k: state[k] for k in ("step", "position", "tokens") if k in state})
        return self.folder / tag

    def latest_complete(self) -> str | None:
        """The newest tag with a manifest (what ``--resume`` would try first), or None."""
        return next((t for t in resume_candidates(self.folder) if (self.folder / t / MANIFEST).is_file()), None)

    def _commit(self, tag: str, info: dict) -> None:
        """Manifest (files hashed by all ranks, a slice each), then ``latest``, then retention (rank 0)."""
        tag_dir = self.folder / tag
        files = self.dist.from_main(_checkpoint_files(tag_dir) if self.dist.is_main else None)
        parts = self.dist.gather_objects(_digest_files(tag_dir, files[self.dist.rank::self.dist.world], sync=True))
        if self.dist.is_main:
            entries = {k: v for part in parts for k, v in part.items()}
            body = {"format": 1, "tag": tag, **info, "world_size": self.dist.world,
                    "files": {f: entries[f] for f in sorted(entries)}}
            atomic_write_text(tag_dir / MANIFEST, json.dumps(body, indent=1) + "\n")
            atomic_write_text(self.folder / LATEST, tag)
            self._retain(tag)
        self.dist.barrier()

    def _retain(self, tag: str) -> None:
        """Keep the newest ``keep`` complete tags up to ``tag`` (always ``tag``); drop the rest.

        Incomplete tags (no manifest: a killed save) and tags past ``tag`` (a timeline this run
        abandoned by resuming from an earlier checkpoint) are removed too.
        """
        step = _tag_step(tag)
        complete = [t for t in checkpoint_tags(self.folder)
                    if _tag_step(t) <= step and (self.folder / t / MANIFEST).is_file()]
        kept = {tag} | set(complete[: self.keep])
        for old in checkpoint_tags(self.folder):
            if old not in kept:
                shutil.rmtree(self.folder / old, ignore_errors=True)

    def _usable(self, tag_dir: Path) -> str | None:
        """Why a tag is not a complete checkpoint (None when it is); the ranks share the hashing."""
        manifest, why = read_manifest(tag_dir)
        if why is None:
            why = verify_files(tag_dir, manifest, sorted(manifest["files"])[self.dist.rank::self.dist.world])
        return next((w for w in self.dist.gather_objects(why) if w), None)

    def load(self, engine) -> dict | None:
        """Load the newest complete checkpoint into ``engine``; its client state (RNG restored), or None (fresh)."""
        refused, chosen = [], None
        for tag in resume_candidates(self.folder):
            why = self._usable(self.folder / tag)
            if why is None:
                chosen = tag
                break
            refused.append((tag, why))
        if self.dist.is_main:
            for tag, why in refused:
                self.echo(f"pretrain: checkpoint {tag} is {why}; "
                          + (f"using {chosen}" if chosen else "no older checkpoint to use"))
        if chosen is None:
            if any((self.folder / tag / MANIFEST).is_file() for tag, _ in refused):
                raise CheckpointError(f"no usable checkpoint in {self.folder} (see above); move it away to start "
                                      f"fresh, or run without --resume")
            if self.dist.is_main:
                self.echo(f"pretrain: no complete checkpoint in {self.folder}; starting fresh")
            return None
        path, state = engine.load_checkpoint(str(self.folder), tag=chosen)
        if path is None:
            raise CheckpointError(f"cannot load the DeepSpeed checkpoint {self.folder / chosen}")
        rng = state.get("rng")
        if rng and len(rng) == self.dist.world:
            set_rng_state(rng[self.dist.rank])
        elif self.dist.is_main:
            self.echo(f"pretrain: RNG states not restored ({len(rng) if rng else 'no'} saved, "
                      f"{self.dist.world} processes now)")
        if self.dist.is_main:
            self.echo(f"pretrain: resumed {path} at step {state['step']}")
        return state
