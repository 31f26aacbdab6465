"""Export: the HF directory loads with plain transformers and reproduces the training-time logits."""

from __future__ import annotations

import json

import pytest
import torch

from logos.train import Trainer
from train_fixtures import TOKENIZER, make_shards, tiny_recipe


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.mktemp("export"))


@pytest.mark.parametrize("stage", [0, 3])
def test_export_reproduces_training_logits(shards, tmp_path, stage):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = Trainer(tiny_recipe(shards, tmp_path / "run", zero_stage=stage), progress=False, echo=lambda line: None)
    for _ in range(3):
        trainer.step()
    out = trainer.export(tmp_path / "hf")
    tokens = trainer.val_reader.rows_at([0, 1]).tokens
    x = torch.from_numpy(tokens[:, :-1])
    reference = trainer.logits(x)                                   # [2, L, V] from the DeepSpeed engine

    assert json.loads((out / "config.json").read_text())["rope_theta"] > 0  # transformers 4 and vLLM read it
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
    files = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "logos_run.json"} <= files
    assert not any(name.endswith((".bin", ".pt", ".pth", ".pkl")) for name in files)  # no pickles
    model = AutoModelForCausalLM.from_pretrained(out).eval()       # plain transformers, no project code
    with torch.no_grad():
        got = model(input_ids=x).logits.float()
    torch.testing.assert_close(got, reference)

    tok = AutoTokenizer.from_pretrained(out)
    default = AutoTokenizer.from_pretrained(str(TOKENIZER))
    text = "<MoleculeS>CC(=O)Oc1ccccc1C(=O)O<MoleculeE>"
    assert tok(text, add_special_tokens=False)["input_ids"] == default(text, add_special_tokens=False)["input_ids"]
    run = json.loads((out / "logos_run.json").read_text())
    assert run["step"] == 3 and run["recipe"]["train"]["zero_stage"] == stage
    assert model.config.vocab_size == 2432 and len(tok) == 2394


def test_export_replaces_atomically(shards, tmp_path):
    trainer = Trainer(tiny_recipe(shards, tmp_path / "run"), progress=False, echo=lambda line: None)
    first = trainer.export(tmp_path / "hf")
    trainer.step()
    second = trainer.export(tmp_path / "hf")
    assert first == second and not (tmp_path / "hf.tmp").exists() and not (tmp_path / "hf.old").exists()
    assert json.loads((second / "logos_run.json").read_text())["step"] == 1


@pytest.mark.parametrize("stage", [0, 2])
def test_logos_export_of_a_saved_checkpoint(shards, tmp_path, stage):
    from transformers import AutoModelForCausalLM

    from logos.cli import main

    trainer = Trainer(tiny_recipe(shards, tmp_path / "run", zero_stage=stage), progress=False, echo=lambda line: None)
    for _ in range(2):
        trainer.step()
    trainer.save()  # also writes run/hf from the live engine
    assert main(["export", str(tmp_path / "run"), "-o", str(tmp_path / "offline")]) == 0
    x = torch.from_numpy(trainer.val_reader.rows_at([0]).tokens[:, :-1])
    live = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf")
    offline = AutoModelForCausalLM.from_pretrained(tmp_path / "offline")
    with torch.no_grad():
        torch.testing.assert_close(offline(input_ids=x).logits, live(input_ids=x).logits)
    assert json.loads((tmp_path / "offline" / "logos_run.json").read_text())["step"] == 2
