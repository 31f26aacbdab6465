"""Continued pretraining end to end, through the CLI, for the two base families the presets name.

A tiny Llama-3.2-shaped base (byte-level BPE; BOS ``<|begin_of_text|>``, EOS ``<|end_of_text|>``,
no pad token) and a tiny Qwen3-shaped base (byte-level BPE; no BOS, EOS and pad ``<|endoftext|>``,
untied head, QK-norm) each go: ``logos pack --tokenizer BASE`` -> ``logos pretrain --init-from BASE``
-> ``logos export RUN`` -> ``logos generate`` -> a detokenized file.
"""

from __future__ import annotations

import json

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from conftest import ASSETS, REPO
from logos.language.grammar import special_tokens
from logos.data.shards import load_meta
from train_fixtures import MOSES_500

BASE_TEXT = ["The quick brown fox jumps over the lazy dog.", "Proteins fold; molecules react <maybe>.",
             "x = 3.14 * r ** 2  # area"]
FAMILIES = {
    # Llama-3.2: <|begin_of_text|> starts every sequence, <|end_of_text|> ends documents, no pad token
    "llama": dict(specials=["<|begin_of_text|>", "<|end_of_text|>"], bos="<|begin_of_text|>",
                  eos="<|end_of_text|>", pad=None),
    # Qwen3 base: no BOS; <|endoftext|> ends documents and pads; chat tokens exist
    "qwen3": dict(specials=["<|endoftext|>", "<|im_start|>", "<|im_end|>"], bos=None, eos="<|endoftext|>",
                  pad="<|endoftext|>"),
}


def base_checkpoint(tmp_path, arch: str):
    """A tiny random base LLM with its family's tokenizer conventions, saved as a plain HF directory."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    fam = FAMILIES[arch]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = BASE_TEXT * 20 + (ASSETS / "molecules" / "moses_test_200.smi").read_text().splitlines()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=fam["specials"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=fam["bos"], eos_token=fam["eos"],
                                 pad_token=fam["pad"])
    ids = {k: hf.convert_tokens_to_ids(fam[k]) if fam[k] else None for k in ("bos", "eos", "pad")}
    torch.manual_seed(0)
    shape = dict(vocab_size=len(hf), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, bos_token_id=ids["bos"], eos_token_id=ids["eos"],
                 pad_token_id=ids["pad"])
    model = LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=True)) if arch == "llama" else \
        Qwen3ForCausalLM(Qwen3Config(**shape, head_dim=16, tie_word_embeddings=False))
    path = tmp_path / f"base-{arch}"
    model.save_pretrained(path)
    hf.save_pretrained(path)
    return path, hf


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_pack_pretrain_export_generate_from_a_base_llm(tmp_path, run_cli, arch):
    base, base_tok = base_checkpoint(tmp_path, arch)
    corpus, shards, run, export = tmp_path / "m.jsonl", tmp_path / "shards", tmp_path / "run", tmp_path / "export"
    assert run_cli("tokenize", MOSES_500, "-o", corpus, "-q")[0] == 0
    code, err = run_cli("pack", corpus, "--tokenizer", base, "-o", shards, "--val-fraction", "0.1", "-q")
    assert code == 0, err
    meta = load_meta(shards)
    assert meta["vocab_size"] == len(base_tok) + len(special_tokens())
    assert meta["bos_id"] == (base_tok.bos_token_id if arch == "llama" else base_tok.eos_token_id)  # Qwen: no BOS

    code, err = run_cli("pretrain", "--config", REPO / "pretrain" / "tiny.yaml", "--init-from", base, "-q",
                        "--set", f"train.data={shards}", "--set", f"train.out_dir={run}", "--set", "train.seq_len=64",
                        "--set", "train.max_minutes=null", "--set", "train.max_steps=6", "--set", "train.warmup_steps=1",
                        "--set", "train.lr=3e-3", "--set", "train.save_every=6", "--set", "train.log_every=3")
    assert code == 0, err
    code, err = run_cli("export", run, "-o", export)  # the CLI path: config and tokenizer the run used
    assert code == 0, err

    config = AutoConfig.from_pretrained(export)
    assert config.architectures == [{"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[arch]]
    assert config.hidden_size == 64 and config.num_hidden_layers == 2  # the base's shape, not the recipe's
    tok = AutoTokenizer.from_pretrained(export)
    assert len(tok) == meta["vocab_size"] and tok.bos_token == FAMILIES[arch]["bos"]
    assert tok.pad_token == FAMILIES[arch]["pad"]
    for text in BASE_TEXT:  # base text tokenizes as under the base tokenizer
        assert tok.encode(text, add_special_tokens=False) == base_tok.encode(text, add_special_tokens=False)
    for symbol in ("<MoleculeS>", "<MoleculeE>", "<sg225>", "<c+12>"):  # grammar symbols are single tokens
        assert len(tok.encode(symbol, add_special_tokens=False)) == 1
    live = AutoModelForCausalLM.from_pretrained(run / "hf")
    offline = AutoModelForCausalLM.from_pretrained(export)
    x = torch.tensor([tok.encode("<MoleculeS>CCO<MoleculeE> and prose", add_special_tokens=False)])
    with torch.no_grad():
        torch.testing.assert_close(offline(x).logits, live(x).logits)

    out = tmp_path / "gen.smi"
    code, err = run_cli("generate", "--checkpoint", export, "--task", "molecule", "-n", "6", "-o", out,
                        "--max-new-tokens", "24", "-q")
    assert code in (0, 1) and "generate: 6 samples" in err, err  # 1: a barely trained base may dead-end a sample
    written = out.read_text().splitlines()
    errors = out.with_name(out.name + ".errors.jsonl")
    rejected = errors.read_text().splitlines() if errors.exists() else []
    assert len(written) + len(rejected) == 6  # every sample is a molecule in the file or a logged rejection
    for line in rejected:  # grammar-constrained: rejections are chemistry (RDKit), never grammar
        reason = json.loads(line)["reason"]
        assert "grammar error" not in reason and "<|" not in reason.split(" | ")[-1], reason


def test_init_from_refuses_shards_packed_with_another_tokenizer(tmp_path):
    from logos.train import Trainer
    from logos.train.recipe import ConfigError
    from train_fixtures import make_shards, tiny_recipe

    base, _ = base_checkpoint(tmp_path, "qwen3")
    shards = make_shards(tmp_path)  # packed with the LOGOS default tokenizer
    recipe = tiny_recipe(shards, tmp_path / "run", init_from=str(base))
    with pytest.raises(ConfigError, match="pack the corpus with"):
        Trainer(recipe, progress=False, echo=lambda line: None)
