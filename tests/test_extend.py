"""Continued pretraining set-up: a base LLM's tokenizer gains the grammar, its model is resized sensibly."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from conftest import ASSETS
from logos.language.extend import PAD_MULTIPLE, load_extended
from logos.language.grammar import special_tokens

BASE_TEXT = ["The quick brown fox jumps over the lazy dog.", "Proteins fold; molecules react <maybe>.",
             "x = 3.14 * r ** 2  # area"]


def _byte_level_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = BASE_TEXT * 20 + (ASSETS / "molecules" / "moses_test_200.smi").read_text().splitlines()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")


def _base_checkpoint(tmp_path, arch: str):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    tok = _byte_level_tokenizer()
    torch.manual_seed(0)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             tie_word_embeddings=True))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=16, tie_word_embeddings=False))
    path = tmp_path / f"base-{arch}"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path, tok, model


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_grammar_added_as_single_tokens_and_rows_initialised(tmp_path, arch):
    path, base_tok, base_model = _base_checkpoint(tmp_path, arch)
    model, tok = load_extended(path)
    for symbol in special_tokens():
        assert len(tok.encode(symbol, add_special_tokens=False)) == 1
    for text in BASE_TEXT:  # base text tokenizes exactly as before
        assert tok.encode(text, add_special_tokens=False) == base_tok.encode(text, add_special_tokens=False)
    n_base = len(base_tok)
    assert len(tok) == n_base + len(special_tokens())
    emb = model.get_input_embeddings().weight
    assert emb.shape[0] % PAD_MULTIPLE == 0 and emb.shape[0] >= len(tok)
    assert torch.equal(emb[:n_base], base_model.get_input_embeddings().weight)
    sub = base_tok.encode("<MoleculeS>", add_special_tokens=False)
    new_id = tok.convert_tokens_to_ids("<MoleculeS>")
    torch.testing.assert_close(emb[new_id], base_model.get_input_embeddings().weight[sub].mean(0))
    assert not torch.equal(emb[tok.convert_tokens_to_ids("<sg12>")], emb[tok.convert_tokens_to_ids("<sg225>")])
    if arch == "qwen3":
        head = model.get_output_embeddings().weight
        torch.testing.assert_close(head[new_id], base_model.get_output_embeddings().weight[sub].mean(0))
    # a mixed text: grammar + base text; decodes back exactly
    text = "<MoleculeS>CCO<MoleculeE> is ethanol"
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    # the extended model saves and reloads with plain transformers, same logits
    out = tmp_path / "extended"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    again = AutoModelForCausalLM.from_pretrained(out)
    tok2 = AutoTokenizer.from_pretrained(out)
    assert tok2.encode(text, add_special_tokens=False) == ids
    x = torch.tensor([ids])
    model.eval()
    again.eval()
    torch.testing.assert_close(again(x).logits, model(x).logits)
