"""``logos plan`` and the scale presets: parameter counts against published model sizes, ZeRO bytes against the
per-parameter accounting worked by hand, and DeepSpeed's own estimators called directly."""

from __future__ import annotations

import json

import pytest

from conftest import REPO
from logos.train.recipe import load_recipe, padded_vocab
from logos.train.plan import ModelSize, model_size, plan_rows
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


def test_llama_3_2_1b_parameter_count_is_the_published_one():
    """Llama-3.2-1B (meta-llama/Llama-3.2-1B config.json): the model card gives "1B (1.23B)", shared embeddings.

    Exact figure: 1,235,814,400, which is what transformers builds and what the architecture gives by hand:
    embeddings 128256 x 2048 (tied, counted once); per layer q/o 2048 x 2048 each, k/v 2048 x 512 each
    (8 KV heads x head_dim 64), gate/up/down 3 x 2048 x 8192, two RMSNorms; a final RMSNorm. No biases.
    """
    from transformers import LlamaConfig

    cfg = LlamaConfig(vocab_size=128256, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=64, intermediate_size=8192, tie_word_embeddings=True)
    embed = 128256 * 2048
    layer = 2 * 2048 * 2048 + 2 * 2048 * 512 + 3 * 2048 * 8192 + 2 * 2048
    assert embed + 16 * layer + 2048 == 1_235_814_400
    size = model_size(cfg)
    assert size.total_params == 1_235_814_400
    assert size.largest_layer_params == embed  # the (tied) embedding matrix is the largest single module


def test_qwen3_8b_parameter_count_is_the_published_one():
    """Qwen3-8B (Qwen/Qwen3-8B config.json): the model card gives 8.2B parameters, 6.95B non-embedding.

    Exact figure: 8,190,735,360, which is what transformers builds and what the architecture gives by hand:
    input embeddings and an untied LM head, 151936 x 4096 each; per layer q/o 4096 x 4096 each, k/v
    4096 x 1024 each (8 KV heads x head_dim 128), QK-norm (2 x 128), gate/up/down 3 x 4096 x 12288, two
    RMSNorms; a final RMSNorm. No biases. Non-embedding: 6,946,075,648 (the card's 6.95B).
    """
    from transformers import Qwen3Config

    cfg = Qwen3Config(vocab_size=151936, hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, intermediate_size=12288, tie_word_embeddings=False)
    embed = 151936 * 4096
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 2 * 128 + 3 * 4096 * 12288 + 2 * 4096
    assert 2 * embed + 36 * layer + 4096 == 8_190_735_360
    assert 36 * layer + 4096 == 6_946_075_648
    size = model_size(cfg)
    assert size.total_params == 8_190_735_360
    assert size.largest_layer_params == embed  # embeddings and LM head: 151936 x 4096 each


def test_zero0_and_zero1_bytes_worked_by_hand():
    """The accounting of logos/train/plan.py's docstring, per parameter: 2 B of bf16 weights, then 18 B of
    bf16 gradients (2) + fp32 gradients (4) + fp32 master weights (4) + Adam moments (8).
    Stage 0 replicates all 20 B; stage 1 splits the 12 B of optimizer states (fp32 master + Adam) across
    GPUs; stage 2 (DeepSpeed's estimator) splits all 18 B."""
    n = 1_000_000
    size = ModelSize(total_params=n, largest_layer_params=100_000)
    rows = {r["stage"]: r for r in plan_rows(size, gpus_per_node=8, nodes=2)}  # 16 GPUs
    assert rows[0]["gpu_bytes"] == 20_000_000                 # 20 B x 1e6
    assert rows[1]["gpu_bytes"] == 8_000_000 + 750_000        # (2 + 2 + 4) B x 1e6 + 12 B x 1e6 / 16
    assert rows[2]["gpu_bytes"] == 2_000_000 + 1_125_000      # 2 B x 1e6 + 18 B x 1e6 / 16
    assert [rows[s]["node_gpu_bytes"] for s in (0, 1, 2)] == [160_000_000, 70_000_000, 25_000_000]  # x 8 GPUs
    # CPU per node, DeepSpeed's stage-2 rule without offload: 4 B x params x GPUs per node x 1.5 buffer.
    assert [rows[s]["node_cpu_bytes"] for s in (0, 1, 2)] == [48_000_000] * 3
    # One GPU: nothing to split, so stage 1 costs what stage 0 does (20 B per parameter).
    one = {r["stage"]: r for r in plan_rows(size, gpus_per_node=1, nodes=1)}
    assert one[0]["gpu_bytes"] == one[1]["gpu_bytes"] == one[2]["gpu_bytes"] == 20_000_000


@pytest.mark.parametrize("name,stage", [("1b", 2), ("3b", 2), ("8b", 3)])
def test_scale_presets_merge_their_deepspeed_json(name, stage):
    recipe = load_recipe(REPO / "pretrain" / f"{name}.yaml")
    t = recipe.train
    assert t.precision == "bf16" and t.gradient_checkpointing and t.zero_stage == stage
    cfg = ds_config(recipe, world_size=16, gpu=True)
    assert cfg["zero_optimization"]["stage"] == stage and cfg["bf16"]["enabled"]
    assert cfg["train_batch_size"] == t.micro_batch * t.grad_accum * 16
    assert cfg["zero_optimization"]["overlap_comm"] is True  # the JSON's GPU setting
    if stage == 2:  # on CPU there is nothing to overlap communication with
        cpu = ds_config(recipe, world_size=16, gpu=False)["zero_optimization"]
        assert (cpu["overlap_comm"], cpu["contiguous_gradients"], cpu["reduce_scatter"]) == (False, False, False)


def test_every_deepspeed_json_loads_and_offload_variants_offload():
    paths = sorted((REPO / "pretrain").glob("ds_*.json"))
    assert {"ds_zero2.json", "ds_zero2_offload.json", "ds_zero3.json", "ds_zero3_offload.json"} <= {
        p.name for p in paths}
    for path in paths:
        cfg = json.loads(path.read_text())
        assert cfg["zero_optimization"]["stage"] in (2, 3)
        if path.name.startswith(("ds_zero2", "ds_zero3")):
            assert cfg["zero_optimization"]["stage"] == int(path.name[len("ds_zero")])
        if "offload" in path.name:
            assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
        else:
            assert cfg["zero_optimization"].get("offload_optimizer", {}).get("device", "none") == "none"


def test_stage_mismatch_is_a_clear_error():
    from logos.train.recipe import ConfigError

    recipe = load_recipe(REPO / "pretrain" / "8b.yaml", ["train.zero_stage=2"])
    with pytest.raises(ConfigError, match="zero_optimization.stage 3"):
        ds_config(recipe, 1)


def _cfg(hidden=64, layers=2, vocab=100):
    from types import SimpleNamespace

    return SimpleNamespace(hidden_size=hidden, num_hidden_layers=layers, vocab_size=vocab)


def test_cpu_zero3_fp32_bytes_worked_by_hand():
    """ZeRO-3 in fp32 on 2 processes, per process: weights 4 B (the fp32 master is the weight partition itself),
    gradients 4 B and AdamW moments 8 B per parameter, halved; the backward's working set is the gathered
    parameters (live + prefetch limits), the reduce bucket and the largest layer's gradient, 4 B each, and the heap
    keeps twice as much (the measured heap slack); activations at 4 B per value; rank 0 adds the export copy and
    one shard at a save."""
    from logos.train.plan import PROCESS_BYTES, activation_bytes, cpu_memory

    size = ModelSize(total_params=1_000_000, largest_layer_params=10_000)
    zero = {"stage3_max_live_parameters": 80_000, "stage3_prefetch_bucket_size": 20_000, "reduce_bucket_size": 20_000}
    plan = cpu_memory(size, _cfg(), 3, 2, "fp32", micro_batch=2, seq_len=8, checkpointing=True, zero=zero,
                      export_dtype="bfloat16", shard_size=500_000)
    act = activation_bytes(_cfg(), 2, 8, True, element_bytes=4)
    assert act == 2 * 16 * 64 * 4 + 16 * 64 * 17 * 4 + 16 * 100 * 12  # layer inputs + one layer + fp32 logits x 3
    working = 4 * (100_000 + 20_000 + 10_000)
    assert plan.terms == {"fixed": PROCESS_BYTES, "weights": 2_000_000, "gradients": 2_000_000,
                          "optimizer": 4_000_000, "working set": working, "heap slack": 2 * working, "activations": act}
    assert plan.peak == PROCESS_BYTES + 8_000_000 + 3 * working + act
    assert plan.save_terms == {"export copy": 2_000_000, "shard being written": 500_000}
    # at a save rank 0 holds its states plus the export (10.5 MB) - more than its training peak here
    assert plan.rank0_peak == PROCESS_BYTES + 8_000_000 + 2_500_000 > plan.peak
    assert plan.node == plan.rank0_peak + plan.peak
    # gathered parameters never exceed the model
    small = cpu_memory(ModelSize(50_000, 10_000), _cfg(), 3, 2, "fp32", 1, 8, True, zero)
    assert small.terms["working set"] == 4 * (50_000 + 20_000 + 10_000)


def test_cpu_stage0_and_bf16_bytes_worked_by_hand():
    """Stage 0, one process: fp32 16 B per parameter (weights, gradients, two moments); DeepSpeed's bf16 mode 20 B
    (bf16 weights and gradients, fp32 master, fp32 gradients, moments). ZeRO-1 and 2 keep the weights whole and
    split the master copy and moments; ZeRO-2 splits the gradients too."""
    from logos.train.plan import cpu_memory

    size = ModelSize(total_params=1_000_000, largest_layer_params=100_000)
    states = ("weights", "gradients", "optimizer")
    fp32 = cpu_memory(size, _cfg(), 0, 1, "fp32", 1, 8, False)
    assert sum(fp32.terms[k] for k in states) == 16_000_000 and fp32.terms["working set"] == 400_000
    bf16 = cpu_memory(size, _cfg(), 0, 1, "bf16", 1, 8, False)
    assert sum(bf16.terms[k] for k in states) == 20_000_000
    z1 = cpu_memory(size, _cfg(), 1, 4, "fp32", 1, 8, False)
    z2 = cpu_memory(size, _cfg(), 2, 4, "fp32", 1, 8, False)
    assert (z1.terms["weights"], z1.terms["gradients"], z1.terms["optimizer"]) == (5_000_000, 4_000_000, 2_000_000)
    assert (z2.terms["weights"], z2.terms["gradients"], z2.terms["optimizer"]) == (5_000_000, 1_000_000, 2_000_000)


def test_plan_cpu_of_the_1b_preset(capsys):
    """`logos plan --device cpu` on the 1B preset as the scale check runs it: ZeRO-3 without the GPU JSON, fp32,
    2 processes; the model states are 16 B per parameter split over the two."""
    sets = ["train.precision=fp32", "train.zero_stage=3", "train.deepspeed=null", "train.seq_len=256",
            "train.micro_batch=1", "train.grad_accum=1"]
    from logos.cli import main

    args = ["plan", "--config", str(REPO / "pretrain" / "1b.yaml"), "--device", "cpu", "--processes", "2",
            *[a for s in sets for a in ("--set", s)]]
    assert main(args + ["--json"]) == 0
    plan = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    n = plan["parameters"]
    assert 0.97e9 < n < 0.99e9 and (plan["stage"], plan["precision"], plan["processes"]) == (3, "fp32", 2)
    assert plan["terms"]["weights"] + plan["terms"]["gradients"] + plan["terms"]["optimizer"] == pytest.approx(8 * n, 1e-6)
    assert plan["save_terms"]["export copy"] == 2 * n  # the preset exports bf16
    assert plan["node"] == plan["rank0_peak"] + plan["peak"] and 17 * 2**30 < plan["node"] < 21 * 2**30
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ZeRO-3, fp32" in out and "rank 0 peak" in out
