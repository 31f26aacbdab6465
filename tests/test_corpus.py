"""``logos corpus build``: sources -> deduplicated seeded splits with stats; reruns skip finished work."""

from __future__ import annotations

import json

import pytest
from rdkit import Chem
from rdkit.Chem.Scaffolds import MurckoScaffold

from conftest import ASSETS, REPO, records
from logos.data.corpus import CorpusConfig, Source, load_config
from logos.data.corpus_build import build_corpus


def _config(tmp_path, **kw) -> CorpusConfig:
    return CorpusConfig(
        sources=[Source(name="moses", files=[str(ASSETS / "molecules" / "moses_test_200.smi")]),
                 Source(name="moses-again", files=[str(ASSETS / "molecules" / "moses_test_200.smi")]),
                 Source(name="rxn", files=[str(ASSETS / "reactions" / "gauche_60.rsmi")]),
                 Source(name="retro", files=[str(ASSETS / "reactions" / "gauche_60.rsmi")], args=["--retro"])],
        validation=0.2, test=0.2, tokenizer=str(REPO / "tokenizers" / "default"), workers=1, **kw)


def test_build_dedups_splits_by_group_and_counts_tokens(tmp_path):
    out = tmp_path / "corpus"
    lines = []
    stats = build_corpus(_config(tmp_path), out, echo=lines.append)
    splits = {s: records(out / f"{s}.jsonl") for s in ("train", "validation", "test")}
    texts = [r["text"] for recs in splits.values() for r in recs]
    assert len(texts) == len(set(texts)) == 200 + 60 + 60  # the second MOSES copy is all duplicates
    assert stats["duplicates_dropped"] == 200
    assert all(len(recs) > 0 for recs in splits.values())
    # scaffold split: one scaffold never appears in two splits
    owner = {}
    for split, recs in splits.items():
        for r in recs:
            if r["domain"] == "molecule":
                smi = r["text"][len("<MoleculeS>"):-len("<MoleculeE>")]
                scaffold = MurckoScaffold.MurckoScaffoldSmiles(mol=Chem.MolFromSmiles(smi)) or smi
                assert owner.setdefault(scaffold, split) == split
    # forward and retro forms of one reaction share a split
    from logos.domains.reaction import reaction_from_text
    where = {}
    for split, recs in splits.items():
        for r in recs:
            if r["domain"] == "reaction":
                rs, _, ps = reaction_from_text(r["text"])
                assert where.setdefault((tuple(rs), tuple(ps)), split) == split
    table = (out / "stats.md").read_text()
    assert "| molecule |" in table and "| reaction |" in table
    saved = json.loads((out / "stats.json").read_text())
    assert saved["domains"]["molecule"]["train"]["tokens"] > saved["domains"]["molecule"]["train"]["records"]


def test_rerun_skips_finished_parts_and_redoes_changed_ones(tmp_path):
    out = tmp_path / "corpus"
    build_corpus(_config(tmp_path), out, echo=lambda line: None)
    first = (out / "train.jsonl").read_text()
    lines = []
    build_corpus(_config(tmp_path), out, echo=lines.append)
    assert sum("done earlier, skipped" in l for l in lines) == 5  # 4 parts + split
    assert (out / "train.jsonl").read_text() == first
    lines.clear()
    build_corpus(_config(tmp_path, seed=1), out, echo=lines.append)
    assert not any("skipped" in l for l in lines)  # the seed changes the samples and the split
    assert (out / "train.jsonl").read_text() != first


def test_shipped_corpus_config_parses():
    config = load_config(REPO / "pretrain" / "corpus.yaml")
    assert {s.name for s in config.sources} >= {"moses", "reactions", "retro"}


def test_changed_input_file_is_redone_and_bad_config_is_refused(tmp_path):
    src = tmp_path / "m.smi"
    src.write_text("CCO\nCCN\n")
    config = CorpusConfig(sources=[Source(name="mine", files=[str(src)])], validation=0.0, test=0.0,
                          tokenizer=str(REPO / "tokenizers" / "default"), workers=1)
    out = tmp_path / "c"
    build_corpus(config, out, echo=lambda line: None)
    src.write_text("CCO\nCCN\nCCC\n")
    lines = []
    stats = build_corpus(config, out, echo=lines.append)
    assert not any("skipped" in l for l in lines)
    assert stats["domains"]["molecule"]["train"]["records"] == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources:\n  - name: x\n    dataset: no-such-dataset\n")
    with pytest.raises(ValueError, match="unknown dataset"):
        load_config(bad)
    bad.write_text("sources:\n  - name: x\n    files: [a.smi]\n    args: ['--bogus']\n")
    with pytest.raises(ValueError, match="bad tokenize flags or options"):
        load_config(bad)


# ---------------------------------------------------------------- what a part depends on
def _digest_in_copy(tmp_path, name: str, domain: str, edit: str | None = None) -> str:
    """``encoder_digest(domain)`` computed in a child process over a copy of the package (optionally edited)."""
    import shutil
    import subprocess
    import sys

    root = tmp_path / name
    shutil.copytree(REPO / "logos", root / "logos", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "grammar", root / "grammar")
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")  # marks a source checkout (logos.util.resources)
    if edit:
        path = root / "logos" / edit
        path.write_text(path.read_text() + "\n# an encoder change\n")
    code = f"from logos.data.corpus import encoder_digest; print(encoder_digest({domain!r}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)})
    return out.stdout.strip()


def test_encoder_digest_follows_the_encoder_source_per_domain(tmp_path):
    base = _digest_in_copy(tmp_path, "a", "molecule")
    assert _digest_in_copy(tmp_path, "b", "molecule") == base  # same code, same digest
    assert _digest_in_copy(tmp_path, "c", "molecule", edit="domains/molecule.py") != base
    assert _digest_in_copy(tmp_path, "d", "molecule", edit="domains/textfiles.py") != base  # an imported module
    crystal = _digest_in_copy(tmp_path, "e", "crystal")
    assert _digest_in_copy(tmp_path, "f", "crystal", edit="domains/molecule.py") == crystal  # not its code


def test_part_is_redone_when_its_encoder_or_the_tokenizer_contents_change(tmp_path, monkeypatch):
    import shutil

    import logos.data.corpus as corpus

    tokenizer = tmp_path / "tok"
    shutil.copytree(REPO / "tokenizers" / "default", tokenizer)
    src = tmp_path / "m.smi"
    src.write_text("CCO\nCCN\n")
    config = CorpusConfig(sources=[Source(name="mine", files=[str(src)])], validation=0.0, test=0.0,
                          tokenizer=str(tokenizer), workers=1)
    out = tmp_path / "c"
    build_corpus(config, out, echo=lambda line: None)
    lines = []
    build_corpus(config, out, echo=lines.append)
    assert sum("skipped" in l for l in lines) == 2
    real = corpus.encoder_digest
    monkeypatch.setattr(corpus, "encoder_digest", lambda domain: real(domain) + "-changed")
    lines.clear()
    build_corpus(config, out, echo=lines.append)
    assert not any("mine: done earlier" in l for l in lines)
    monkeypatch.undo()
    build_corpus(config, out, echo=lambda line: None)
    (tokenizer / "tokenizer_config.json").write_text((tokenizer / "tokenizer_config.json").read_text() + "\n")
    lines.clear()
    build_corpus(config, out, echo=lines.append)  # same path, other contents: the split is redone
    assert any("mine: done earlier" in l for l in lines) and not any("split done earlier" in l for l in lines)


def test_corpus_options_are_typed_and_the_library_never_imports_the_cli(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "c.yaml"
    config.write_text("sources:\n  - name: r\n    files: [x.rsmi]\n    args: ['--retro']\n"
                      "    options: {drop_agents: true}\n")
    code = ("import sys; from logos.data.corpus import load_config, _tokenize_options; "
            f"c = load_config({str(config)!r}); o, d = _tokenize_options(c.sources[0]); "
            "print(o['reaction'].retro, o['reaction'].drop_agents, 'logos.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["True", "True", "False"]
    config.write_text("sources:\n  - name: r\n    files: [x.rsmi]\n    options: {retor: true}\n")
    with pytest.raises(ValueError, match="unknown encoder option.*retor"):
        load_config(config)


def test_record_limits_are_checked_and_redo_the_parts(tmp_path):
    src = tmp_path / "m.smi"
    src.write_text("CCO\nCN\n")
    with pytest.raises(ValueError, match="unknown limits"):
        CorpusConfig(sources=[Source(name="mine", files=[str(src)])], limits={"max_atom": 5})
    kw = dict(sources=[Source(name="mine", files=[str(src)])], validation=0.0, test=0.0,
              tokenizer=str(REPO / "tokenizers" / "default"), workers=1)
    build_corpus(CorpusConfig(**kw), tmp_path / "c", echo=lambda line: None)
    lines = []
    build_corpus(CorpusConfig(**kw, limits={"max_atoms": 2}), tmp_path / "c", echo=lines.append)
    assert not any("mine: done earlier" in l for l in lines)  # other limits, other records: redone
    assert json.loads((tmp_path / "c" / "parts" / "mine.done").read_text())["rejected"] == 1  # CCO: 3 atoms
