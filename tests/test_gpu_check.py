"""The GPU check's CPU parts: its arguments, the MFU formula (checked by hand), the scoring of carried texts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import gpu_check  # noqa: E402


def test_flops_per_token_and_mfu_by_hand():
    # 1B shape: N = 1.236e9, 16 layers x 32 heads x 64, T = 2048:
    # 6N = 7.416e9; 12*16*32*64*2048 = 805,306,368; sum 8.221e9 FLOPs per token.
    per_token = gpu_check.flops_per_token(1_236_000_000, 16, 32, 64, 2048)
    assert per_token == 6 * 1_236_000_000 + 805_306_368
    # 50,000 tokens/s on a 989 TFLOP/s peak: 8.2213e9 * 5e4 / 9.89e14 = 41.6 %
    assert gpu_check.mfu(50_000, per_token, gpu_check.H200_BF16_DENSE) == pytest.approx(0.41564, rel=1e-4)


def test_arguments_are_checked():
    args = gpu_check.parse_args(["--parts", "train,generate", "--steps", "10", "--warmup", "2"])
    assert args.parts == "train,generate" and args.steps == 10
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--parts", "train,fly"])
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--steps", "3", "--warmup", "3"])


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert gpu_check.main(["--out", str(tmp_path / "r.json")]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not (tmp_path / "r.json").exists()


def test_score_counts_grammar_valid_texts(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    rows = [{"text": "<MoleculeS>CCO<MoleculeE>"}, {"text": "<MoleculeS>CC(<MoleculeE>"}, {"text": "garbage"}]
    (texts / "molecule_constrained.smi.samples.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    scored = gpu_check.score(tmp_path)
    assert scored == {"molecule_constrained.smi.samples.jsonl": {"samples": 3, "grammar_valid": 1}}
