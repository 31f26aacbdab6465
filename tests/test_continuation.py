"""The continuation grammars (for engines whose grammar starts after the prompt) accept what the task grammar does."""

from __future__ import annotations

from pathlib import Path

import pytest


from logos.decoding.constraints import _lltokenizer, task_grammar  # noqa: E402
from logos.tasks.continuation import continuation_grammar  # noqa: E402
from logos.tasks import TASKS
from logos.tasks.prompts import Prompt, crystal_rules_for, search_rules  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ASPIRIN = "<MoleculeS>CC(=O)Oc1ccccc1C(=O)O<MoleculeE>"
CASES = [  # (task, prompt, rules, completion)
    ("molecule", "<MoleculeS>", "", "CC(=O)Oc1ccccc1C(=O)O<MoleculeE>"),
    ("forward", "<MoleculeS>CCO<MoleculeE><MoleculeS>CC(=O)O<MoleculeE><React>", "", "<MoleculeS>CCOC(C)=O<MoleculeE>"),
    ("retro", "<MoleculeS>CCOC(C)=O<MoleculeE><ReverseReact>", "",
     "<MoleculeS>CCO<MoleculeE><MoleculeS>CC(=O)O<MoleculeE><Reagent><MoleculeS>O<MoleculeE>"),
    ("protein", "<ProteinS>", "", "MKTAYIAKQR<ProteinE>"),
    ("antibody", "<AntibodyS>", "", "EVQLVESGG<AntibodyE>"),
    ("pocket", "<ProteinS>MKT<ProteinE><ProteinS>AY<ProteinE><Search>", search_rules(["MKT", "AY"]),
     "<ProteinS>M<PocketS>K<PocketE>T<ProteinE><ProteinS>AY<ProteinE>"),
    ("ligand", "<ProteinS>M<PocketS>K<PocketE>T<ProteinE>", "", ASPIRIN),
    ("crystal", "<CrystalS>", crystal_rules_for(None, None), "Cl4Na4<sg225>5.640 Na<wa> Cl<wb><CrystalE>"),
    ("crystal", "<CrystalS>Cl4Na4", crystal_rules_for(None, "Cl4Na4"), "<sg225>5.640 Na<wa> Cl<wb><CrystalE>"),
    ("crystal", "<CrystalS>Cl4Na4<sg225>", crystal_rules_for(225, "Cl4Na4"), "5.640 Na<wa> Cl<wb><CrystalE>"),
    ("crystal", "<CrystalS>", crystal_rules_for(225, None, ("Cl4Na4", "Cl8Na8")), "Cl4Na4<sg225>5.640 Na<wa> Cl<wb><CrystalE>"),
    ("mof", "<MaterialS><MetalS>", "", "Zn4O<MetalE><MoleculeS>O=C([O-])c1ccc(C(=O)[O-])cc1<MoleculeE><MaterialE>"),
    ("mof", "<MaterialS><MetalS>Zn4", "", "O<MetalE><MoleculeS>O=C([O-])c1ccc(C(=O)[O-])cc1<MoleculeE><MaterialE>"),
]


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(REPO / "checkpoints" / "logos-tiny"))


def _accepts(lltok, grammar: str, prefix: list[int], ids: list[int]) -> bool:
    import llguidance

    m = llguidance.LLMatcher(lltok, grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    m.consume_tokens(prefix)
    for t in ids:
        if m.is_error() or not m.consume_token(t):
            return False
    return m.is_accepting() and not m.is_error()


@pytest.mark.parametrize("task,prompt,rules,completion", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_continuation_accepts_what_the_task_grammar_accepts(tok, task, prompt, rules, completion):
    lltok = _lltokenizer(tok, 2432)
    t = TASKS[task]
    p = Prompt("x", prompt, rules)
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    full = task_grammar(t.start, t.rules + "\n" + rules)
    assert _accepts(lltok, full, enc(prompt), enc(completion))
    assert _accepts(lltok, continuation_grammar(t, p), [], enc(completion))
    if task == "pocket":  # the copy is exact: another residue is refused
        assert not _accepts(lltok, continuation_grammar(t, p), [], enc(completion.replace("AY", "AW")))
    if task == "crystal" and "<sg225>" in prompt:
        assert not _accepts(lltok, continuation_grammar(t, p), [], enc("5.640 Na<wz> Cl<wb><CrystalE>"))
    if task == "crystal" and "xtal_head" in rules:  # a header offered, in the group given, or nothing
        for other in ("Cl2Na2<sg225>5.640 Na<wa> Cl<wb><CrystalE>", "Cl4Na4<sg221>5.640 Na<wa> Cl<wb><CrystalE>"):
            assert not _accepts(lltok, full, enc(prompt), enc(other))
            assert not _accepts(lltok, continuation_grammar(t, p), [], enc(other))
