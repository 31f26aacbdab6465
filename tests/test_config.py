"""Typed checks of recipes and corpus configs: a value of the wrong type fails at once, naming its key."""

from __future__ import annotations

import pytest
import yaml

from conftest import REPO
from logos.data.corpus import load_config
from logos.train.recipe import ConfigError, load_recipe


@pytest.mark.parametrize("override, message", [
    ("train.micro_batch=abc", "train.micro_batch: Input should be a valid integer"),
    ("model.hidden_size=12.5", "model.hidden_size: Input should be a valid integer"),
    ("train.betas=[0.9, x]", "train.betas.1: Input should be a valid number"),
    ("finetune.augment=two", "finetune.augment: Input should be a valid integer"),
])
def test_recipe_type_errors_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load_recipe("finetune/retro.yaml", [override])


def test_valid_values_keep_their_meaning():
    recipe = load_recipe("finetune/retro.yaml", ["train.lr=3e-4", "train.micro_batch=4"])
    assert recipe.train.lr == 3e-4 and recipe.train.micro_batch == 4 and recipe.train.betas == (0.9, 0.95)


def test_corpus_type_errors_name_the_key(tmp_path):
    doc = yaml.safe_load((REPO / "pretrain" / "corpus.yaml").read_text())
    doc["sources"][0]["limit"] = "many"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match=r"corpus\.sources\.0\.limit: Input should be a valid integer"):
        load_config(tmp_path / "c.yaml")
