"""Crystal structure prediction from a formula as a chemist writes it: the cells a space group can hold, the model's
choice among them, ``Z=N`` and ``--cell-composition``, and lines refused before sampling.

Cells are checked by reading the samples' composition headers and by pymatgen on the CIFs written, never with logos's
own counting.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import warnings

import pytest

from conftest import ASSETS, REPO
from train_fixtures import random_checkpoint
from logos.decoding.composition import formula_units, placeable, placement_problem, smallest_formula_units
from logos.generate import GenerateOptions, generate
from logos.tasks import get
from logos.tasks.prompts import PromptOptions, build_prompts

SHIPPED = REPO / "checkpoints" / "logos-tiny"
TOKENIZER = REPO / "tokenizers" / "default"


class Errors:
    def __init__(self):
        self.lines: list[tuple[str, str]] = []

    def add(self, source: str, reason: str) -> None:
        self.lines.append((source, reason))


def _prompts(tmp_path, text: str, **options):
    path = tmp_path / "formulas.txt"
    path.write_text(text)
    errors = Errors()
    return build_prompts(get("crystal"), path, 2, errors, PromptOptions(**options)), errors.lines


def _header(text: str) -> str:
    return re.match(r"<CrystalS>([A-Za-z0-9.]+)<sg\d+>", text).group(1)


def _samples(out) -> list[dict]:
    return [json.loads(line) for line in out.with_name(out.name.split(".")[0] + ".samples.jsonl").read_text().splitlines()]


def test_the_cells_a_space_group_can_hold():
    """R-3c (hexagonal cell: 6a 6b 12c 18d 18e 36f): Fe2O3 fits only as Fe12O18 (12c + 18e) up to 48 atoms; Pnma
    holds olivine as Z = 4; Fm-3m holds NaCl as Na4Cl4 and Na24Cl24 (Na8Cl8 only with more symmetry); the spinel
    needs 56 atoms. Without a group every whole-count multiple fits (P1)."""
    assert formula_units({"Fe": 2, "O": 3}, 167, 48) == [6]
    assert formula_units({"Li": 1, "Fe": 1, "P": 1, "O": 4}, 62, 48) == [4]
    assert formula_units({"Na": 1, "Cl": 1}, 225, 48) == [4, 24]  # Na8Cl8 only as CsCl of half the edge (Pm-3m)
    assert formula_units({"Na": 1, "Cl": 1}, None, 6) == [1, 2, 3]
    assert formula_units({"Fe": 1.5, "O": 2}, None, 14) == [2, 4]  # whole counts only: Fe3O4, Fe6O8
    assert formula_units({"Mg": 1, "Al": 2, "O": 4}, 227, 48) == [] and \
        smallest_formula_units({"Mg": 1, "Al": 2, "O": 4}, 227) == 8
    assert smallest_formula_units({"Fe": 2, "O": 3}, 167) == 6
    assert placeable({"Na": 4, "Cl": 4}, 225) and not placeable({"Na": 2, "Cl": 2}, 225)
    assert not placeable({"Na": 12, "Cl": 12}, 225)  # 12 = 4 + 8 for one element only: 4a/4b and 8c are not shared
    assert "more symmetry (group 221)" in placement_problem({"Na": 8, "Cl": 8}, 225)
    assert placement_problem({"Ca": 1, "Ti": 1, "O": 3}, 221) is None  # perovskite: 1a 1b 3c, all fixed, stays Pm-3m


def test_formula_lines_are_formula_units_unless_the_line_or_flag_fixes_the_cell(tmp_path):
    text = ("formula group\nFe2O3 167 hematite\nLiFePO4 62 olivine\nNaCl 225 rocksalt\nNaCl - free\n"
            "LiFePO4 62 Z=4 z4\nMg3(PO4)2 - brackets\n")
    prompts, errors = _prompts(tmp_path, text)
    assert not errors
    by_id = {p.input_id: p for p, n in prompts}
    assert [n for _, n in prompts] == [2] * 6
    assert by_id["hematite"].text == "<CrystalS>Fe12O18<sg167>"  # the one cell that fits is the prompt
    assert by_id["olivine"].text == by_id["z4"].text == "<CrystalS>Fe4Li4O16P4<sg62>"
    rock = by_id["rocksalt"]  # several cells fit: the model chooses, knowing the group
    assert rock.choices == "Cl4Na4|Cl24Na24"
    assert [a.text for a in rock.alternatives] == [f"<CrystalS>Cl{k}Na{k}<sg225>" for k in (4, 24)]
    assert re.search(r'(?m)^xtal_head: "Cl4Na4" \| "Cl24Na24"$', rock.rules)
    free = by_id["free"]  # no group: the model writes the header (one of these) and then its group
    assert free.text == "<CrystalS>" and not free.alternatives
    assert free.choices.split("|") == [f"Cl{k}Na{k}" for k in range(1, 25)]
    assert by_id["brackets"].choices.startswith("Mg3O8P2|Mg6O16P4|")

    cells, errors = _prompts(tmp_path, "Na4Cl4 225 nacl\nTiO2 - rutile\nNa4Cl4 225 Z=6 six\n", cell_composition=True)
    assert not errors
    assert [p.text for p, _ in cells] == ["<CrystalS>Cl4Na4<sg225>", "<CrystalS>O2Ti1", "<CrystalS>Cl24Na24<sg225>"]
    assert not any(p.choices or p.alternatives for p, _ in cells)


def test_lines_no_cell_can_answer_are_refused_before_sampling_with_the_smallest_that_fits(tmp_path):
    text = ("Fe2O3 167 Z=1 one\nMgAl2O4 227 spinel\nXx2O3 167 unknown\nNaCl 231 group\nNaCl 225 Z=0 zero\n"
            "NaCl 225 Z=8 cscl\nNaCl 225 good\n")
    prompts, errors = _prompts(tmp_path, text)
    assert [p.input_id for p, _ in prompts] == ["good"]  # a bad line never loses the good ones
    reasons = dict(errors)
    path = str(tmp_path / "formulas.txt")
    one, spinel, unknown, group, zero, cscl = (f"{path}:{line}" for line in range(1, 7))  # refusals name the line
    assert set(reasons) == {one, spinel, unknown, group, zero, cscl}
    assert "group 167 (R-3c)" in reasons[one] and "Z=6 (Fe12O18, 30 atoms)" in reasons[one]
    assert "group 227 (Fd-3m)" in reasons[spinel] and "Z=8" in reasons[spinel]
    assert "Xx is not an element" in reasons[unknown]
    assert "space group 231: not in 1-230" in reasons[group]
    assert "more symmetry (group 221)" in reasons[cscl] and "Z=4 (Cl4Na4" in reasons[cscl]
    assert all("\n" not in r for r in reasons.values())
    _, errors = _prompts(tmp_path, "Fe2O3 167\n", cell_composition=True)
    assert "6 x Fe2O3 = Fe12O18" in errors[0][1] and "group 167" in errors[0][1]


def test_cell_composition_prompts_are_the_benchmarks_prompts(tmp_path):
    """The benchmarks' inputs (cell compositions, with and without a group; Perov-5 cells as the encoder writes their
    headers) make the prompts - text and grammar - they made when every formula was read as the cell's composition,
    so their samples are the same for a seed (the grammar's element alternation may come in any order)."""
    golden = json.loads((ASSETS / "crystal" / "cell_composition_prompts.json").read_text())
    from logos.science.materials import encode_crystal, read_cif_block
    from logos.tasks.crystal_pairs import split_crystal_text

    with open(ASSETS / "crystal" / "perov5_val_4.csv", newline="") as fh:
        for row in csv.DictReader(fh):  # the lines benchmarks/csp_match.py writes
            prompt, _ = split_crystal_text(encode_crystal(read_cif_block(row["cif"]), composition=True), False)
            assert f"{prompt.removeprefix('<CrystalS>')} - {row['material_id']}" in golden["lines"]
    prompts, errors = _prompts(tmp_path, "\n".join(golden["lines"]) + "\n", cell_composition=True)
    assert not errors

    def sorted_elements(rules: str) -> str:
        return re.sub(r"(?m)^XTAL_EL: / \((.*)\)/$",
                      lambda m: "XTAL_EL: / (" + "|".join(sorted(m.group(1).split("|"))) + ")/", rules)
    got = [{"id": p.input_id, "text": p.text, "rules_sha256": hashlib.sha256(sorted_elements(p.rules).encode())
            .hexdigest()} for p, _ in prompts]
    assert got == golden["prompts"]


def test_cell_compositions_sample_as_before_for_a_seed(tmp_path):
    """Byte for byte the samples file the shipped model wrote for these cell compositions and seed before formulas
    were read as formula units (recorded with the one sampling policy both engines share: the code before formulas,
    with that policy, writes the same bytes)."""
    inputs = tmp_path / "cells.txt"
    inputs.write_text("Cl4Na4 225 nacl\nO3SrTi 221 sto\nCd1Cu1N3 - 18517\n")
    out = tmp_path / "cells.cif"
    generate(SHIPPED, out, GenerateOptions(task="crystal", n=2, seed=0, prompts=PromptOptions(cell_composition=True)),
             inputs=inputs, progress=False)
    written = out.with_name("cells.samples.jsonl").read_bytes()
    assert written == (ASSETS / "crystal" / "cell_composition_seed0.samples.jsonl").read_bytes()


def test_shipped_model_predicts_structures_from_reduced_formulas(tmp_path, run_cli):
    """Fe2O3 in R-3c gives Fe12O18 cells, olivine in Pnma four formula units, NaCl in Fm-3m the rock-salt cell (the
    model's choice among the cells that fit, given the group); the line no cell can answer is one line on stderr and
    in the errors file, and never a dead end."""
    from pymatgen.core import Composition, Structure

    inputs = tmp_path / "formulas.txt"
    inputs.write_text("Fe2O3 167 hematite\nLiFePO4 62 olivine\nNaCl 225 rocksalt\nFe2O3 167 Z=1 one\n")
    out = tmp_path / "csp.cif"
    code, err = run_cli("generate", "--checkpoint", SHIPPED, "--task", "crystal", "--input", inputs, "-n", "2",
                        "--seed", "0", "-q", "-o", out)
    assert code == 1  # the refused line
    refusals = [line for line in err.splitlines() if line.startswith(f"{inputs}:")]
    assert refusals == [f"{inputs}:4: Fe2O3 Z=1 (Fe2O3) in group 167 (R-3c): no placement on its Wyckoff "
                        "positions; the smallest cell that can is Z=6 (Fe12O18, 30 atoms): add Z=6 to the line"]
    logged = [json.loads(line) for line in out.with_name("csp.cif.errors.jsonl").read_text().splitlines()]
    assert [e["source"] for e in logged] == [f"{inputs}:4"] and "dead-end" not in json.dumps(logged)
    samples = _samples(out)
    want = {"hematite": {"Fe": 12, "O": 18}, "olivine": {"Li": 4, "Fe": 4, "P": 4, "O": 16},
            "rocksalt": {"Na": 4, "Cl": 4}}
    assert sorted(s["id"] for s in samples) == sorted([*want] * 2)
    for s in samples:
        assert s["status"] == "done" and s["written"]
        assert Composition(_header(s["text"])) == Composition(want[s["id"]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cells = [Structure.from_file(str(p)) for p in sorted(out.with_suffix("").glob("*.cif"))]
    assert len(cells) == 6
    assert sorted(c.composition.reduced_formula for c in cells) == sorted(["Fe2O3", "LiFePO4", "NaCl"] * 2)
    assert sorted(len(c) for c in cells) == sorted([30, 28, 8] * 2)


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    return random_checkpoint(tmp_path_factory.mktemp("random") / "ckpt")


def test_random_model_cells_are_multiples_of_the_formula_the_group_can_hold(random_model, tmp_path):
    """Whatever a random model writes, a formula's samples have a cell of whole formula units that their group can
    hold: chosen before sampling where the line names the group, written under the grammar where it does not."""
    from pymatgen.core import Composition

    inputs = tmp_path / "formulas.txt"
    inputs.write_text("TiO2 136 rutile\nNaCl - free\n")
    out = tmp_path / "c.cif"
    options = GenerateOptions(task="crystal", n=3, batch_size=6, resamples=4,
                              prompts=PromptOptions(max_cell_atoms=12))
    result = generate(random_model, out, options, inputs=inputs, progress=False)
    assert result.written >= 1
    for s in result.samples:
        if not s.written:
            continue
        cell = Composition(_header(s.text))
        formula = Composition("TiO2" if s.input_id == "rutile" else "NaCl")
        units = cell.num_atoms / formula.num_atoms
        assert units == int(units) and cell == formula * int(units) and cell.num_atoms <= 12
        if s.input_id == "rutile":
            assert "<sg136>" in s.text and int(units) in (2, 4)  # Ti 2a, O 4f; or twice that


def test_choice_rows_write_only_a_header_offered_and_keep_to_it():
    from transformers import AutoTokenizer

    from logos.decoding.constraints import TokenTable
    from logos.decoding.rows import CompositionRow

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    table = TokenTable(tok, len(tok))
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    sg225 = ids("<sg225>")[0]

    def row_after(head: str) -> CompositionRow:
        row = CompositionRow(table, "<CrystalS>", "Cl4Na4|Cl8Na8")
        for t in ids(head):
            assert row.check(t, 1000), head
            row.advance(t)
        return row

    assert row_after("Cl4Na4").check(sg225, 1000)
    assert not row_after("Cl4Na4").check(sg225, CompositionRow.need(8) - 1)  # 8 atoms need more than the budget left
    assert not row_after("Cl4").check(sg225, 1000)  # not a whole header
    assert not CompositionRow(table, "<CrystalS>", "Cl4Na4|Cl8Na8").check(ids("Na")[0], 1000)  # not the first element
    assert not row_after("Cl").check(ids("2")[0], 1000)  # Cl2... is no header offered
    assert CompositionRow(table, "<CrystalS>", "Cl4Na4|Cl8Na8").budget(96) == len("Cl8Na8") + CompositionRow.need(16)
    row = row_after("Cl8Na8")
    row.advance(sg225)
    assert row.target == {"Cl": 8, "Na": 8}
    assert not row.check(ids("<CrystalE>")[0], 1000)  # the sites must add up to the header chosen
    unconditional = CompositionRow(table, "<CrystalS>")
    assert unconditional.choices == {} and unconditional.budget(96) == 32 + CompositionRow.need(24)
