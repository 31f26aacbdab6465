"""Continued pretraining: a tiny random Llama with a byte-level BPE tokenizer learns the grammar and exports."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from logos.grammar import special_tokens
from logos.pack import pack
from logos.train import Trainer
from test_extend import BASE_TEXT, _base_checkpoint
from train_fixtures import MOSES_500, tiny_recipe


def test_init_from_base_llm_trains_and_exports_a_plain_transformers_checkpoint(tmp_path, run_cli):
    base, base_tok, _ = _base_checkpoint(tmp_path, "llama")
    corpus = tmp_path / "m.jsonl"
    assert run_cli("tokenize", MOSES_500, "-o", corpus, "-q")[0] == 0
    pack([corpus], base, tmp_path / "shards", val_fraction=0.1, progress=False)  # base tokenizer + grammar
    meta = json.loads((tmp_path / "shards" / "meta.json").read_text())
    assert meta["vocab_size"] == len(base_tok) + len(special_tokens())

    recipe = tiny_recipe(tmp_path / "shards", tmp_path / "run", max_steps=8, init_from=str(base),
                         lr=3e-3, warmup_steps=1)
    trainer = Trainer(recipe, progress=False, echo=lambda line: None)
    result = trainer.train()
    assert result.last_loss < result.first_loss
    out = tmp_path / "export"
    trainer.export(out)

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    for symbol in special_tokens():  # grammar symbols are single tokens
        assert len(tok.encode(symbol, add_special_tokens=False)) == 1
    for text in BASE_TEXT:  # base text tokenizes as under the base tokenizer
        assert tok.encode(text, add_special_tokens=False) == base_tok.encode(text, add_special_tokens=False)
    ids = torch.tensor([tok.encode("<MoleculeS>CCO<MoleculeE> and prose", add_special_tokens=False)])
    model.eval()
    torch.testing.assert_close(model(ids).logits.float(), trainer.logits(ids), rtol=1e-4, atol=1e-4)


def test_init_from_refuses_shards_packed_with_another_tokenizer(tmp_path, run_cli):
    import pytest
    from logos.train.recipe import ConfigError
    from train_fixtures import make_shards

    base, _, _ = _base_checkpoint(tmp_path, "qwen3")
    shards = make_shards(tmp_path)  # packed with the LOGOS default tokenizer
    recipe = tiny_recipe(shards, tmp_path / "run", init_from=str(base))
    with pytest.raises(ConfigError, match="pack the corpus with"):
        Trainer(recipe, progress=False, echo=lambda line: None)
