"""``logos plan`` and the scale presets: numbers equal DeepSpeed's estimators called directly."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from logos.config import load_recipe, padded_vocab
from logos.plan import model_size, plan_rows
from logos.train import ds_config


def test_8b_plan_matches_deepspeed_estimators(run_cli):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    from transformers import AutoModelForCausalLM
    import torch

    recipe = load_recipe(REPO / "pretrain" / "8b.yaml")
    hf = recipe.model.hf_config(padded_vocab(2394))
    size = model_size(hf)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    total = sum(p.numel() for p in model.parameters())
    assert size.total_params == total
    assert 6.9e9 < total < 7.1e9  # Qwen3-8B's body with our small vocabulary (its 151k-row embeddings dropped)
    rows = {r["stage"]: r for r in plan_rows(size, gpus_per_node=8, nodes=2)}
    cpu2, gpu2 = estimate_zero2_model_states_mem_needs(total, 8, 2, cpu_offload=False)
    cpu3, gpu3, _ = estimate_zero3_model_states_mem_needs(total, size.largest_layer_params, 8, 2,
                                                          cpu_offload=False, cpu_offload_params=False)
    assert (rows[2]["gpu_bytes"], rows[2]["node_cpu_bytes"]) == (gpu2, cpu2)
    assert (rows[3]["gpu_bytes"], rows[3]["node_cpu_bytes"]) == (gpu3, cpu3)
    assert rows[3]["node_gpu_bytes"] == 8 * gpu3
    code, _ = run_cli("plan", "--config", REPO / "pretrain" / "8b.yaml", "--gpus-per-node", "8", "--nodes", "2")
    assert code == 0


@pytest.mark.parametrize("name,stage", [("1b", 2), ("3b", 2), ("8b", 3)])
def test_scale_presets_merge_their_deepspeed_json(name, stage):
    recipe = load_recipe(REPO / "pretrain" / f"{name}.yaml")
    t = recipe.train
    assert t.precision == "bf16" and t.gradient_checkpointing and t.zero_stage == stage
    cfg = ds_config(recipe, world_size=16)
    assert cfg["zero_optimization"]["stage"] == stage and cfg["bf16"]["enabled"]
    assert cfg["train_batch_size"] == t.micro_batch * t.grad_accum * 16
    assert cfg["zero_optimization"]["overlap_comm"] is True


def test_every_deepspeed_json_loads_and_offload_variants_offload():
    for path in sorted((REPO / "pretrain").glob("ds_*.json")):
        cfg = json.loads(path.read_text())
        assert cfg["zero_optimization"]["stage"] in (2, 3)
        if "offload" in path.name:
            assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


def test_stage_mismatch_is_a_clear_error():
    from logos.config import ConfigError

    recipe = load_recipe(REPO / "pretrain" / "8b.yaml", ["train.zero_stage=2"])
    with pytest.raises(ConfigError, match="zero_optimization.stage 3"):
        ds_config(recipe, 1)
