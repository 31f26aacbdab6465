"""Exports every Hugging Face reader loads as they are: rope_theta beside rope_parameters, a tokenizer class that
transformers 4 and vLLM know, the same tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from logos.train.hf_files import make_portable

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints" / "logos-tiny"


def test_the_shipped_checkpoint_is_portable():
    cfg = json.loads((SHIPPED / "config.json").read_text())
    tok = json.loads((SHIPPED / "tokenizer_config.json").read_text())
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"]
    assert tok["tokenizer_class"] == "PreTrainedTokenizerFast" and not isinstance(tok.get("extra_special_tokens"), list)


def test_make_portable_keeps_the_tokens(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    src = tmp_path / "v5"
    AutoTokenizer.from_pretrained(str(SHIPPED)).save_pretrained(str(src))  # as this transformers writes it
    shutil.copy2(SHIPPED / "config.json", src / "config.json")
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("rope_theta", None)
    (src / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "portable"
    shutil.copytree(src, out)
    assert "config.json" in make_portable(out)
    assert make_portable(out) == []  # idempotent
    tok = json.loads((out / "tokenizer_config.json").read_text())
    assert tok["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert json.loads((out / "config.json").read_text())["rope_theta"] == 10000.0
    a, b = AutoTokenizer.from_pretrained(str(src)), AutoTokenizer.from_pretrained(str(out))
    text = "<MoleculeS>CC(=O)Oc1ccccc1C(=O)O<MoleculeE><CrystalS>Cl4Na4<sg225>5.640 Na<wa> Cl<wb><CrystalE>"
    assert a(text)["input_ids"] == b(text)["input_ids"] and len(a) == len(b)
    assert (a.bos_token_id, a.eos_token_id, a.pad_token_id) == (b.bos_token_id, b.eos_token_id, b.pad_token_id)
    assert AutoConfig.from_pretrained(str(out)).rope_parameters["rope_theta"] == 10000.0
