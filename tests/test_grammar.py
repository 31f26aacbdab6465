"""The grammar file: token inventory (ids pinned), validation with error positions (v1 and v2 crystal text), llguidance loads it."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from logos.language import grammar
CRYSTALS = Path(__file__).parent / "assets" / "crystal"

VALID = [
    "<MoleculeS>CC(=O)O<MoleculeE>",
    "<MoleculeS>O=C([O-])c1ccccc1.[Na+]<MoleculeE>",
    "<MoleculeS>C[C@H](N)C(=O)O<MoleculeE><MoleculeS>C/C=C/C<MoleculeE>",
    "<MoleculeS>CC(=O)O<MoleculeE><MoleculeS>CCO<MoleculeE><Reagent><MoleculeS>[H+]<MoleculeE><React>"
    "<MoleculeS>CCOC(C)=O<MoleculeE>",
    "<MoleculeS>CCOC(C)=O<MoleculeE><ReverseReact><MoleculeS>CC(=O)O<MoleculeE><MoleculeS>CCO<MoleculeE>",
    "<ProteinS>MKTAYIAK<ProteinE><ProteinS>GSHM<ProteinE>",
    "<AntibodyS>EVQLVESGG<AntibodyE><AntibodyS>DIQMTQSP<AntibodyE>",
    "<ProteinS>MKV<PocketS>K<a3><a5><PocketE>LLA<c+12>GG<ProteinE><StructureS>dvvpqr<StructureE>"
    "<MoleculeS>CCO<MoleculeE>",
    "<MoleculeS>CCO<MoleculeE><ProteinS>MKV<PocketS>K<a0><PocketE>LL<ProteinE>",
    "<ProteinS>MKVKLL<ProteinE><Search><ProteinS>MKV<PocketS>K<PocketE>LL<ProteinE>",
    "<MoleculeS>CCO<MoleculeE><Trans><ProteinS>MKV<PocketS>K<PocketE>LL<ProteinE>",
    "<CrystalS><sg225> 5.692 5.692 5.692 90.00 90.00 90.00 Na<wa> 0.000 0.000 0.000 Cl<wb> 0.500 0.500 0.500"
    "<CrystalE>",
    "<CrystalS><sg221> 3.9 3.9 3.9 90 90 90 Fe<wa> 0 0 0<Occ>0.50 Co<wa> 0 0 0<Occ>0.50<CrystalE>",
    # v2: composition header, free lattice parameters, Wyckoff sites with their free coordinates only
    "<CrystalS>Cl4Na4<sg225>5.640 Na<wa> Cl<wb><CrystalE>",
    "<CrystalS><sg225>5.640 Na<wa> Cl<wb><CrystalE>",
    "<CrystalS>O4Ti2<sg136>4.653 2.969 Ti<wa> O<wf> 0.3048<CrystalE>",
    "<CrystalS>Co1Fe1<sg221>3.900 Fe<wa><Occ>0.500 Co<wa><Occ>0.500 Fe<wb><Occ>0.5 Co<wb><Occ>0.5<CrystalE>",
    "<CrystalS>H6Li2O4<sg2>3.250 5.577 5.680 96.07 104.53 104.92 H<wi> 0.1700 0.2710 0.7640 Li<we><CrystalE>",
    "<CrystalS>Fe1.5Ni3<sg221>3.5 Ni<wc><Occ>1.0 Fe<wa><Occ>0.5 Fe<wb><CrystalE>",
    "<MaterialS><MetalS>Zn4O<MetalE><MoleculeS>O=C([O-])c1ccc(C(=O)[O-])cc1<MoleculeE><MaterialE>",
]

INVALID = [  # (text, position of the first error)
    ("<MoleculeS>CC(=O<MoleculeE>", 16),
    ("<MoleculeS>CCO", 14),
    ("CCO", 0),
    ("<MoleculeS>CCO<MoleculeE><React>", 32),
    ("<ProteinS>MK<PocketS>KL<PocketE><ProteinE>", 22),
    ("<CrystalS><sg231> 1 1 1 90 90 90 Na<wa> 0 0 0<CrystalE>", 10),
    ("<CrystalS><sg225> 1 1 1 90 90 Na<wa> 0 0 0<CrystalE>", 29),  # ' Na': a site token carries its space
    ("<CrystalS><sg225>5.640 Na<wa> 1 2 3 4<CrystalE>", 35),       # v2: at most three coordinates
    ("<CrystalS><sg225>1 2 3 4 5 6 7 Na<wa><CrystalE>", 28),       # v2: at most six lattice numbers
    ("<CrystalS>Cl4Na4<sg225> 5.640 Na<wa> Cl<wb><CrystalE>", 23), # a composition header only in v2 text
    ("<CrystalS>Cl4Na4<sg225>5.640<CrystalE>", 28),                # at least one site
    ("<CrystalS>cl4<sg225>5.640 Na<wa><CrystalE>", 10),
    ("<ProteinS>MKV<reserved0>L<ProteinE>", 13),
    ("<MoleculeS>CCO<MoleculeE><ProteinS>MK<c+1024><ProteinE>", 37),
]


def test_inventory_ids_are_pinned():
    tokens = grammar.special_tokens()
    assert len(tokens) == 1622 == len(set(tokens))
    # Golden positions: a change here shifts every token id of every trained model.
    assert tokens[:4] == ("<MoleculeS>", "<MoleculeE>", "<ProteinS>", "<ProteinE>")
    assert tokens.index("<React>") == 16 and tokens.index("<Occ>") == 21
    assert tokens.index("<sg1>") == 22 and tokens.index("<sg230>") == 251
    assert tokens.index("<wa>") == 252 and tokens.index("<wA>") == 278
    assert tokens.index("<a0>") == 279 and tokens.index("<a255>") == 534
    assert tokens.index("<c+1>") == 535 and tokens.index("<c+1023>") == 1557
    assert tokens[-1] == "<reserved63>"
    assert tokens.index("<CrystalS>") == 10 and tokens.index("<sg225>") == 246 and tokens.index("<wb>") == 253
    assert grammar.grammar_text().startswith("// LOGOS grammar v2")


@pytest.mark.parametrize("text", VALID)
def test_valid_texts_parse(text):
    grammar.validate(text)


@pytest.mark.parametrize("text,position", INVALID)
def test_invalid_texts_name_the_first_error(text, position):
    with pytest.raises(grammar.GrammarError) as info:
        grammar.validate(text)
    assert info.value.position == position
    assert f"position {position}" in str(info.value)


def test_split_symbols():
    assert grammar.split_symbols("<ProteinS>MK<PocketS>V<a12><PocketE>L<c+7><ProteinE>") == [
        "<ProteinS>", "MK", "<PocketS>", "V", "<a12>", "<PocketE>", "L", "<c+7>", "<ProteinE>"]


def test_llguidance_loads_the_same_grammar_file():
    """The unchanged grammar file drives llguidance with the shared tokenizer (constrained decoding)."""
    import llguidance
    import llguidance.hf
    from logos.language.tokenizer import load_tokenizer
    from conftest import REPO

    tok = load_tokenizer(REPO / "tokenizers" / "default")
    lltok = llguidance.hf.from_tokenizer(tok)
    compiled = llguidance.LLMatcher.grammar_from_lark(grammar.grammar_text())
    for text in VALID:
        matcher = llguidance.LLMatcher(lltok, compiled)
        ids = tok.encode(text, add_special_tokens=False)
        assert matcher.try_consume_tokens(ids) == len(ids), text
        assert matcher.is_accepting(), text
    matcher = llguidance.LLMatcher(lltok, compiled)
    ids = tok.encode("<MoleculeS>CC(=O<MoleculeE>", add_special_tokens=False)
    assert matcher.try_consume_tokens(ids) < len(ids)


# ---------------------------------------------------------------- per-space-group grammar (constrained decoding)
@pytest.fixture(scope="module")
def llg():
    import llguidance
    import llguidance.hf
    from conftest import REPO
    from logos.language.tokenizer import load_tokenizer

    tok = load_tokenizer(REPO / "tokenizers" / "default")
    return llguidance, tok, llguidance.hf.from_tokenizer(tok)


def test_fragment_compiles_for_all_230_groups_and_accepts_encoded_texts(llg):
    from logos.science import materials as crystal
    from logos.decoding.crystal_rules import crystal_grammar
    llguidance, tok, lltok = llg
    t = time.perf_counter()
    compiled = llguidance.LLMatcher.grammar_from_lark(crystal_grammar())
    matcher = llguidance.LLMatcher(lltok, compiled)
    assert not matcher.is_error(), matcher.get_error()
    assert time.perf_counter() - t < 30
    for path in sorted(CRYSTALS.glob("mp_dielectric_*.cif")):  # 14 crystals, 10 space groups, 6 crystal systems
        text = crystal.encode_crystal(crystal.load(next(iter(crystal.read_crystal_file(path)))))
        header = re.match(r"<CrystalS>([A-Za-z0-9.]*)<sg", text).group(1)
        m = llguidance.LLMatcher(lltok, llguidance.LLMatcher.grammar_from_lark(crystal_grammar(composition=header)))
        ids = tok.encode(text, add_special_tokens=False)
        assert m.try_consume_tokens(ids) == len(ids) and m.is_accepting(), text
    for wrong in ("<CrystalS><sg225>5.640 Na<wa> 0.5000<CrystalE>",            # 4a has no free coordinate
                  "<CrystalS><sg225>5.640 5.640 Na<wa><CrystalE>",             # cubic: one length
                  "<CrystalS><sg136>4.653 2.969 O<wf> 0.3 0.3<CrystalE>",      # 4f: one coordinate, 4 decimals
                  "<CrystalS><sg2>5.000 5.000 5.000 150.00 90.00 90.00 Na<wa><CrystalE>",  # triclinic angle range
                  "<CrystalS><sg225>5.640 Na<wz><CrystalE>"):                  # no z in Fm-3m
        m = llguidance.LLMatcher(lltok, compiled)
        ids = tok.encode(wrong, add_special_tokens=False)
        assert m.try_consume_tokens(ids) < len(ids) or not m.is_accepting(), wrong


def test_random_walks_through_the_matcher_decode(llg):
    """Random allowed tokens (seeded) until <CrystalE>: every text passes the grammar check and decodes to a CIF;
    the only possible complaint is the composition/site mismatch (the grammar does not count; the row constraint does)."""
    import gemmi
    import llguidance.numpy as lln
    import numpy as np
    from logos.science import materials as crystal
    from logos.decoding.crystal_rules import crystal_grammar
    from logos.science.materials.parse import composition_text, parse_composition
    from logos.util.records import RecordError
    llguidance, tok, lltok = llg
    close = tok.convert_tokens_to_ids("<CrystalE>")
    rng = np.random.default_rng(0)
    for composition, walks in ((None, 40), ("Na4Cl4", 10)):
        compiled = llguidance.LLMatcher.grammar_from_lark(crystal_grammar(composition=composition))
        for _ in range(walks):
            m = llguidance.LLMatcher(lltok, compiled)
            mask = lln.allocate_token_bitmask(1, lltok.vocab_size)
            ids: list[int] = []
            while not ids or ids[-1] != close:
                lln.fill_next_token_bitmask(m, mask, 0)
                allowed = np.flatnonzero(np.unpackbits(mask[0].view(np.uint8), bitorder="little")[:lltok.vocab_size])
                choice = close if len(ids) > 60 and close in allowed else int(rng.choice(allowed))
                assert m.consume_token(choice), m.get_error()
                ids.append(choice)
                assert len(ids) < 400
            text = tok.decode(ids, skip_special_tokens=False)
            grammar.validate(text)
            head = re.match(r"<CrystalS>([A-Za-z0-9]+)<sg", text)  # unconditional rows write their own header
            assert head and (composition is None or head.group(1) == "Cl4Na4"), text
            try:
                crystal.decode_text(text)
            except RecordError as e:
                canonical = composition_text(parse_composition(head.group(1)))  # the grammar does not sort elements
                assert f"composition header {canonical} does not match" in str(e)
            text = text.replace(head.group(1), "", 1)
            cif = crystal.crystal_to_cif(crystal.decode_text(text), "walk")
            assert gemmi.make_small_structure_from_block(gemmi.cif.read_string(cif).sole_block()).sites
