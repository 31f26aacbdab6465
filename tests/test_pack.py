"""logos pack: token shards of the real MOSES fixture, split rule, index and reader."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from logos.pack import ShardReader, load_meta, pack
from train_fixtures import MOSES_500, TOKENIZER, make_shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("pack"))


def _docs(shard_dir, split):
    meta = load_meta(shard_dir)
    tokens = np.fromfile(shard_dir / f"{split}.bin", dtype=meta["dtype"])
    index = np.load(shard_dir / f"{split}.docs.npy", allow_pickle=False)
    bounds = list(index[:, 0]) + [len(tokens)]
    return [tokens[a:b] for a, b in zip(bounds, bounds[1:])], index[:, 1]


def test_meta_and_dtype(shards):
    meta = load_meta(shards)
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 2394
    assert meta["docs"]["train"] + meta["docs"]["val"] == 500
    assert 0 < meta["docs"]["val"] < 100  # ~10% held out
    assert meta["domains"] == ["molecule"]
    assert meta["inputs"][0]["header"]["grammar"] == "v1"  # the tokenizer header travels with the shards


def test_documents_round_trip(shards):
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    texts = {}
    for line in (shards.parent / "moses.jsonl").read_text().splitlines()[1:]:
        rec = json.loads(line)
        texts[rec["text"]] = rec
    seen = 0
    for split in ("train", "val"):
        docs, domains = _docs(shards, split)
        assert set(domains.tolist()) == {0}
        for doc in docs:
            assert doc[0] == tok.bos_token_id and doc[-1] == tok.eos_token_id
            assert tok.decode(doc[1:-1].tolist(), skip_special_tokens=False) in texts
            seen += 1
    assert seen == 500


def test_split_is_deterministic_and_order_free(shards, tmp_path):
    lines = (shards.parent / "moses.jsonl").read_text().splitlines()
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("\n".join([lines[0]] + lines[1:][::-1]) + "\n")
    pack([shuffled], TOKENIZER, tmp_path / "again", val_fraction=0.1, progress=False)
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    for split in ("train", "val"):
        a = sorted(tok.decode(d.tolist()) for d in _docs(shards, split)[0])
        b = sorted(tok.decode(d.tolist()) for d in _docs(tmp_path / "again", split)[0])
        assert a == b


def test_reader_rows_positions_and_epochs(shards):
    r = ShardReader(shards, "train", seq_len=32, seed=0)
    tokens, domains = r.batch(0, 4)
    assert tokens.shape == (4, 33) and domains.shape == (4, 32) and tokens.dtype == np.int64
    again, _ = ShardReader(shards, "train", seq_len=32, seed=0).batch(0, 4)
    np.testing.assert_array_equal(tokens, again)  # the data position fully determines the batch
    np.testing.assert_array_equal(r.batch(2, 2)[0], tokens[2:])
    one_epoch = r.row_ids(0, r.rows)
    assert sorted(one_epoch.tolist()) == list(range(r.rows))  # every row once per epoch
    assert not np.array_equal(r.row_ids(r.rows, r.rows), one_epoch)  # a new order next epoch
    other, _ = ShardReader(shards, "train", seq_len=32, seed=1).batch(0, 4)
    assert not np.array_equal(other, tokens)


def test_cli_pack(run_pack_cli):
    code, err = run_pack_cli
    assert code == 0 and "train" in err and "val" in err


@pytest.fixture
def run_pack_cli(shards, tmp_path, capsys):
    from logos.cli import main

    code = main(["pack", str(shards.parent / "moses.jsonl"), "--tokenizer", str(TOKENIZER), "-o", str(tmp_path / "s"),
                 "-q"])
    return code, capsys.readouterr().err


def test_pack_rejects_empty_input(tmp_path):
    from logos.records import InputError

    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"logos_header": {}}\n')
    with pytest.raises(InputError):
        pack([empty], TOKENIZER, tmp_path / "s", progress=False)


def test_fixture_is_real_moses():
    lines = MOSES_500.read_text().splitlines()
    assert len(lines) == 500 and all("moses-train-" in line for line in lines)
