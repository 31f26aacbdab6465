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


def test_logos_export_of_a_zero3_checkpoint_in_shards(shards, tmp_path):
    """A ZeRO-3 checkpoint holds each rank's slices of the parameters; `logos export` joins them (weights-only
    loads) and writes safetensors shards with an index when --shard-size is below the model's size: the same
    weights as the export gathered from the live engine, and plain transformers loads them."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    from logos.cli import main

    trainer = Trainer(tiny_recipe(shards, tmp_path / "run", zero_stage=3), progress=False, echo=lambda line: None)
    for _ in range(2):
        trainer.step()
    trainer.save()  # run/hf: gathered from the engine, one file
    tag = tmp_path / "run" / "checkpoints" / "step0000002"
    assert (tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt").exists()
    assert main(["export", str(tmp_path / "run"), "-o", str(tmp_path / "offline"), "--shard-size", "4MB"]) == 0
    offline = tmp_path / "offline"
    files = sorted(p.name for p in offline.glob("model-*.safetensors"))
    index = json.loads((offline / "model.safetensors.index.json").read_text())
    assert len(files) >= 2 and set(index["weight_map"].values()) == set(files)
    assert not (offline / "model.safetensors").exists()
    for f in files:
        assert (offline / f).stat().st_size <= 4_000_000 + 100_000  # a shard's header may add a little
    live = {}
    with safe_open(str(tmp_path / "run" / "hf" / "model.safetensors"), framework="pt") as fh:
        live = {k: fh.get_tensor(k) for k in fh.keys()}
    joined = {}
    for f in files:
        with safe_open(str(offline / f), framework="pt") as fh:
            joined.update({k: fh.get_tensor(k) for k in fh.keys()})
    assert sorted(joined) == sorted(live)
    for k in live:
        assert torch.equal(joined[k], live[k]), k
    x = torch.from_numpy(trainer.val_reader.rows_at([0]).tokens[:, :-1])
    model = AutoModelForCausalLM.from_pretrained(offline).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=x).logits.float(), trainer.logits(x))
    assert json.loads((offline / "logos_run.json").read_text())["step"] == 2


def test_zero3_slices_of_several_ranks_join_in_parameter_order(tmp_path):
    """Rank r holds elements [r*k, (r+1)*k) of each flattened parameter, k = ceil(n / ranks), the last slice padded,
    in param_shapes order across its flat groups; tied parameters are filled in by name."""
    import math

    from logos.train.export import zero3_state_dict

    torch.manual_seed(0)
    shapes = [{"a.weight": torch.Size([3, 5]), "b.weight": torch.Size([7])}, {"c.bias": torch.Size([2])}]
    full = {name: torch.randn(shape) for group in shapes for name, shape in group.items()}
    world = 3
    for rank in range(world):
        groups = []
        for group in shapes:
            pieces = []
            for name, shape in group.items():
                n = math.prod(shape)
                k = math.ceil(n / world)
                flat = torch.cat([full[name].flatten(), torch.zeros(k * world - n)])
                pieces.append(flat[rank * k:(rank + 1) * k])
            groups.append(torch.cat(pieces))
        torch.save({"optimizer_state_dict": {"fp32_flat_groups": groups, "partition_count": world}},
                   tmp_path / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
        torch.save({"module": {}, "param_shapes": shapes, "shared_params": {"tied.weight": "a.weight"},
                    "buffer_names": [], "frozen_param_shapes": {}, "dp_world_size": world, "step": 7},
                   tmp_path / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
    state, saved = zero3_state_dict(tmp_path, torch.bfloat16)
    assert saved["step"] == 7 and sorted(state) == ["a.weight", "b.weight", "c.bias", "tied.weight"]
    for name, tensor in full.items():
        assert torch.equal(state[name], tensor.to(torch.bfloat16)), name
    assert state["tied.weight"] is state["a.weight"]
    (tmp_path / "zero_pp_rank_2_mp_rank_00_optim_states.pt").unlink()
    from logos.util.records import InputError

    with pytest.raises(InputError, match="zero_pp_rank_2_mp_rank_00_optim_states.pt is missing"):
        zero3_state_dict(tmp_path)


def test_shard_sizes_and_a_bad_one(shards, tmp_path, capsys):
    from logos.cli import main
    from logos.train.export import parse_size

    assert [parse_size(s) for s in ("500MB", "2GB", "1.5GiB", "1024", " 4 kb ")] == [
        500 * 10**6, 2 * 10**9, int(1.5 * 2**30), 1024, 4000]
    trainer = Trainer(tiny_recipe(shards, tmp_path / "run"), progress=False, echo=lambda line: None)
    trainer.step()
    trainer.save()
    assert main(["export", str(tmp_path / "run"), "-o", str(tmp_path / "x"), "--shard-size", "lots"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("logos export")]
    assert len(err) == 1 and "--shard-size" in err[0] and "lots" in err[0] and not (tmp_path / "x").exists()
