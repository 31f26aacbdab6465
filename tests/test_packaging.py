"""Packaging: the wheel (and a wheel built from the sdist) carries the shipped data; installed, ``logos`` runs anywhere.

The wheel is built from a copy of the checkout (``pip wheel --no-build-isolation``: the venv's setuptools,
offline), installed with ``pip install --target`` and run as its console script from an unrelated working
directory, with ``PYTHONPATH`` = the install target so the wheel's ``logos`` wins over the editable one.
The resolver's unit tests run in-process (``logos.util.resources`` is imported inside them so that, on a tree
without it, the wheel tests still run and fail for the real reason).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
ASSETS = Path(__file__).parent / "assets"
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
# What a checkout holds besides the sources: never copied into the build tree.
_NOT_SOURCES = shutil.ignore_patterns(".*", "__pycache__", "*.pyc", "*.egg-info", "build", "dist", "runs", "out",
                                      "demo_out", "corpus")
MUST_SHIP = ["grammar/logos.lark", "tokenizers/default/tokenizer.json", "tokenizers/default/tokenizer.model",
             "checkpoints/logos-tiny/model.safetensors", "checkpoints/logos-tiny/config.json",
             "checkpoints/logos-tiny/tokenizer.json", "pretrain/tiny.yaml", "pretrain/8b.yaml",
             "pretrain/ds_zero2.json", "pretrain/ds_zero3_offload.json", "pretrain/hostfile.example",
             "pretrain/launch_multinode.sh"]


def _run(cmd, cwd, env=None, timeout=300) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _build_wheel(source: Path, dist: Path) -> Path:
    _run(PIP + ["wheel", ".", "--no-deps", "--no-build-isolation", "--no-index", "-w", dist], cwd=source)
    wheels = list(dist.glob("logos-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def _shipped_names(wheel: Path) -> set[str]:
    prefix = "logos/_shipped/"
    with zipfile.ZipFile(wheel) as zf:
        return {n[len(prefix):] for n in zf.namelist() if n.startswith(prefix)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(tmp, source copy, wheel, install target): the checkout's sources -> wheel -> ``pip install --target``."""
    tmp = tmp_path_factory.mktemp("packaging")
    source = tmp / "source"
    shutil.copytree(REPO, source, ignore=_NOT_SOURCES)
    wheel = _build_wheel(source, tmp / "dist")
    site = tmp / "site"
    _run(PIP + ["install", "--no-deps", "--no-index", "--target", site, wheel], cwd=tmp)
    return tmp, source, wheel, site


def _installed_env(site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LOGOS_"))}
    env.update(PYTHONPATH=str(site), PYTHONNOUSERSITE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    return env


@pytest.mark.slow
def test_wheel_carries_the_shipped_data(built):
    _, _, wheel, _ = built
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert "logos/py.typed" in names
    shipped = _shipped_names(wheel)
    assert set(MUST_SHIP) <= shipped, sorted(set(MUST_SHIP) - shipped)
    # Same bytes as the checkout; tokenizers/ stays data (a package of that name shadows HF tokenizers).
    with zipfile.ZipFile(wheel) as zf:
        for rel in shipped:
            assert zf.getinfo("logos/_shipped/" + rel).file_size == (REPO / rel).stat().st_size, rel
    assert not any(n.endswith("tokenizers/__init__.py") for n in names)
    assert not any(n.endswith((".pyc", "__init__.py")) for n in ("logos/_shipped/" + s for s in shipped))
    assert {n.split("/")[0] for n in names} == {"logos", "-".join(wheel.name.split("-")[:2]) + ".dist-info"}
    # the decoder's state machine compiled (a platform wheel), with the digests of the sources it was built from
    compiled = {n.split("/")[-1].split(".")[0] for n in names if n.startswith("logos/decoding/") and n.endswith(".so")}
    assert compiled == {"atoms", "aromatic", "chemistry", "ending"} and "logos/decoding/_compiled.json" in names


@pytest.mark.slow
def test_wheel_from_sdist_carries_the_same_data(built, tmp_path):
    _, source, wheel, _ = built
    sdist_dir = tmp_path / "sdist"
    code = "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))"
    name = _run([sys.executable, "-c", code, sdist_dir], cwd=source).stdout.strip().splitlines()[-1]
    with tarfile.open(sdist_dir / name) as tf:
        tf.extractall(tmp_path / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    unpacked = next((tmp_path / "unpacked").iterdir())
    again = _build_wheel(unpacked, tmp_path / "dist")
    assert _shipped_names(again) == _shipped_names(wheel)


@pytest.mark.slow
def test_installed_cli_runs_from_any_directory(built, tmp_path):
    _, _, _, site = built
    work = tmp_path / "elsewhere"  # no grammar/, tokenizers/, checkpoints/ here
    work.mkdir()
    smi = work / "mols.smi"
    smi.write_text("".join((ASSETS / "molecules" / "moses_test_200.smi").read_text().splitlines(True)[:8]))
    shutil.copy(ASSETS / "crystal" / "NaCl.cif", work / "NaCl.cif")
    env = _installed_env(site)
    logos = site / "bin" / "logos"

    _run([logos, "tokenize", "mols.smi", "NaCl.cif", "-o", "out.jsonl", "-q"], cwd=work, env=env)
    assert len((work / "out.jsonl").read_text().splitlines()) >= 9  # 8 molecules + 1 crystal (+ header)
    proc = _run([logos, "validate", "out.jsonl"], cwd=work, env=env)
    assert "9 of 9 records parse" in proc.stderr
    proc = _run([logos, "generate", "--task", "molecule", "-n", "4", "-o", "out.smi", "-q"], cwd=work, env=env)
    assert "4 samples" in proc.stderr and (work / "out.smi").exists()
    assert not [p for p in work.iterdir() if p.is_dir()]  # no folder appeared in the working directory

    # The wheel's logos was the one that ran, and it read its own copy of the data.
    probe = ("import logos, logos.language.grammar as g, logos.util.resources as r, logos.decoding.ending as e; "
             "print(logos.decoding.native()); print(logos.__file__); print(g.GRAMMAR_PATH); "
             "print(r.resolve('pretrain/tiny.yaml')); print(r.resolve('pretrain/ds_zero3.json')); "
             "print(r.resolve('tokenizers/default'))")
    lines = _run([sys.executable, "-c", probe], cwd=work, env=env).stdout.splitlines()
    assert lines.pop(0) == str(dict.fromkeys(["atoms", "aromatic", "chemistry", "ending"], True))  # ran compiled
    assert Path(lines[0]).resolve().is_relative_to(site.resolve()), lines[0]
    for line in lines[1:]:
        assert Path(line).resolve().is_relative_to(site.resolve() / "logos" / "_shipped"), line


# ---------------------------------------------------------------------- the resolver, in-process


def test_user_path_wins_over_shipped(tmp_path, monkeypatch):
    from logos.util import resources
    (tmp_path / "tokenizers" / "default").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resources.resolve("tokenizers/default") == Path("tokenizers/default")
    assert resources.resolve("./tokenizers/default").resolve() == tmp_path / "tokenizers" / "default"


def test_shipped_path_from_an_unrelated_directory(tmp_path, monkeypatch):
    from logos.util import resources
    monkeypatch.chdir(tmp_path)
    for name in (resources.GRAMMAR, resources.DEFAULT_TOKENIZER, resources.DEFAULT_CHECKPOINT, "pretrain/tiny.yaml",
                 "pretrain/ds_zero2.json"):
        path = resources.resolve(name)
        assert path.is_absolute() and path.exists() and path == resources.shipped(name)
        assert path.relative_to(resources.shipped_root()).as_posix() == name
    assert (resources.resolve(resources.DEFAULT_CHECKPOINT) / "model.safetensors").is_file()


def test_missing_path_names_every_place_looked(tmp_path, monkeypatch):
    from logos.util import resources
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as info:
        resources.resolve("checkpoints/no-such-model")
    e = info.value
    assert isinstance(e, resources.ResourceNotFound) and e.filename == "checkpoints/no-such-model"
    assert e.looked == [tmp_path / "checkpoints/no-such-model", resources.shipped_root() / "checkpoints/no-such-model"]
    assert str(tmp_path / "checkpoints/no-such-model") in str(e)
    assert str(resources.shipped_root() / "checkpoints/no-such-model") in str(e)
    # Absolute and '..' paths are only ever taken as given.
    with pytest.raises(resources.ResourceNotFound) as info:
        resources.resolve(tmp_path / "nope")
    assert info.value.looked == [tmp_path / "nope"]
    with pytest.raises(resources.ResourceNotFound) as info:
        resources.resolve("../grammar/logos.lark")
    assert len(info.value.looked) == 1
    with pytest.raises(resources.ResourceNotFound, match="pretrain/no.yaml"):
        resources.shipped("pretrain/no.yaml")
    with pytest.raises(ValueError):
        resources.shipped("../pyproject.toml")


def test_installed_copy_is_the_only_root_when_present(tmp_path, monkeypatch):
    """A wheel's logos/_shipped wins, and then the folder next to the package (site-packages) is never searched."""
    from logos.util import resources
    (tmp_path / "grammar").mkdir()
    (tmp_path / "grammar" / "logos.lark").write_text("start: x\n")
    monkeypatch.setattr(resources, "_INSTALLED", tmp_path)
    assert resources.shipped_root() == tmp_path
    assert resources.shipped(resources.GRAMMAR) == tmp_path / "grammar" / "logos.lark"
    with pytest.raises(resources.ResourceNotFound):
        resources.shipped(resources.DEFAULT_TOKENIZER)  # present in the checkout, not in this "install"


def test_cli_defaults_keep_their_names_and_resolve(tmp_path, monkeypatch, run_cli):
    from logos.language import grammar
    from logos.util import resources
    from logos.cli import build_parser

    assert grammar.GRAMMAR_PATH == resources.shipped(resources.GRAMMAR)
    args = build_parser().parse_args(["generate", "-o", "x.smi"])
    assert args.checkpoint == "checkpoints/logos-tiny"
    assert build_parser().parse_args(["pack", "c.jsonl", "-o", "s"]).tokenizer == "tokenizers/default"
    monkeypatch.chdir(tmp_path)
    code, err = run_cli("generate", "--checkpoint", "runs/missing/hf", "-n", "1", "-o", "x.smi", "-q")
    assert code == 2 and "runs/missing/hf" in err and "looked in" in err and str(tmp_path) in err
