"""logos generate: batched sampling, task mask and length budget, writers, metrics, retrosynthesis prompts."""

from __future__ import annotations

import pytest
import torch
from rdkit import Chem

from logos.records import errors_path_for
from logos.grammar import is_valid
from logos.generate import TaskMask, canonical_set, generate, load_checkpoint, molecule_metrics
from logos.train import Trainer
from train_fixtures import MOSES_500, REPO, make_shards, tiny_recipe

SHIPPED = REPO / "checkpoints" / "tiny-moses"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny model trained for a few steps on the fixture and exported (mechanics, not quality)."""
    tmp = tmp_path_factory.mktemp("generate")
    trainer = Trainer(tiny_recipe(make_shards(tmp), tmp / "run", max_steps=10), progress=False, echo=lambda l: None)
    for _ in range(10):
        trainer.step()
    return trainer.export(tmp / "hf")


def test_task_mask_bans_and_budget(checkpoint):
    model, tok = load_checkpoint(checkpoint)
    close = tok.convert_tokens_to_ids("<MoleculeE>")
    mask = TaskMask(tok, 2432, {"<MoleculeE>"}, close, prompt_len=2, budget=5)
    scores = mask(torch.ones(1, 3, dtype=torch.long), torch.zeros(1, 2432))
    banned = set(torch.nonzero(scores[0] == float("-inf")).flatten().tolist())
    for t in ("<s>", "</s>", "<pad>", "<unk>", "<MoleculeS>", "<ProteinS>", "<React>", "<0x43>"):
        assert tok.convert_tokens_to_ids(t) in banned, t
    assert close not in banned and tok.convert_tokens_to_ids("C") not in banned
    assert set(range(len(tok), 2432)) <= banned  # padded vocabulary rows
    forced = mask(torch.ones(1, 6, dtype=torch.long), torch.zeros(1, 2432))  # 4 generated: budget reached
    assert torch.isfinite(forced[0]).nonzero().flatten().tolist() == [close]


@pytest.mark.parametrize("suffix,constrained", [(".smi", True), (".sdf", False)])
def test_generate_molecules_writes_files_and_metrics(checkpoint, tmp_path, suffix, constrained):
    out = tmp_path / f"gen{suffix}"
    result = generate(checkpoint, out, n=12, batch_size=5, max_new_tokens=24, reference=MOSES_500, progress=False,
                      constrained=constrained)
    assert result.samples == 12 and len(result.texts) == 12
    assert all(t.startswith("<MoleculeS>") for t in result.texts)
    closed = [t for t in result.texts if t.endswith("<MoleculeE>")]
    if constrained:  # every closed sample parses under the grammar
        assert closed and all(is_valid(t) for t in closed)
    else:  # the length budget closes every span
        assert len(closed) == 12
    assert result.valid <= 12 and result.unique <= result.valid and result.novel <= result.unique
    written = [m for m in Chem.SDMolSupplier(str(out))] if suffix == ".sdf" else out.read_text().splitlines()
    assert len(written) == result.valid
    errors = errors_path_for(out)
    assert (errors.exists() and len(errors.read_text().splitlines()) == 12 - result.valid) or result.valid == 12
    again = generate(checkpoint, tmp_path / "again.smi", n=12, batch_size=5, max_new_tokens=24, progress=False,
                     constrained=constrained)
    assert again.texts == result.texts  # one seed, one result
    other = generate(checkpoint, tmp_path / "other.smi", n=12, batch_size=5, max_new_tokens=24, seed=1,
                     progress=False, constrained=constrained)
    assert other.texts != result.texts


def test_retrosynthesis_prompts(checkpoint, tmp_path):
    products = tmp_path / "products.smi"
    products.write_text("CC(=O)Oc1ccccc1C(=O)O\tp1\nnot_a_smiles\nc1ccccc1\tp3\n")
    result = generate(checkpoint, tmp_path / "retro.rsmi", task="reaction", inputs=products, n=2, max_new_tokens=16,
                      progress=False)
    assert result.samples == 4  # 2 valid products x 2 samples; the bad input is reported and skipped
    assert all("<ReverseReact>" in t and t.startswith("<MoleculeS>CC(=O)Oc1ccccc1C(=O)O<MoleculeE>")
               for t in result.texts[:2])
    assert all(is_valid(t) for t in result.texts if t.endswith("<MoleculeE>"))  # grammar-constrained
    assert result.unique <= result.valid <= result.samples
    written = (tmp_path / "retro.rsmi").read_text().splitlines()
    assert len(written) == result.valid and all(">>" in line or ">" in line for line in written)


def test_metrics_on_known_smiles():
    texts = ["<MoleculeS>CCO<MoleculeE>", "<MoleculeS>OCC<MoleculeE>", "<MoleculeS>C1CC<MoleculeE>",
             "<MoleculeS>c1ccccc1<MoleculeE>"]
    canon, unique, novel = molecule_metrics(texts, canonical_set(["c1ccccc1"]))
    assert canon[0] == canon[1] == "CCO" and canon[2] is None
    assert (unique, novel) == (2, 1)


def test_cli_generate(checkpoint, tmp_path, capsys):
    from logos.cli import main

    assert main(["generate", "--checkpoint", str(checkpoint), "-n", "4", "-o", str(tmp_path / "g.smi"),
                 "--max-new-tokens", "16", "-q"]) == 0
    assert "valid" in capsys.readouterr().err


@pytest.mark.skipif(not (SHIPPED / "config.json").exists(), reason="no shipped checkpoint")
def test_shipped_checkpoint_writes_mostly_valid_molecules(tmp_path):
    result = generate(SHIPPED, tmp_path / "g.smi", n=50, temperature=0.7, reference=MOSES_500, progress=False)
    assert result.validity >= 0.6, result.summary()
    assert result.uniqueness >= 0.9
