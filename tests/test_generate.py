"""logos generate: batched sampling, task mask and length budget, writers, metrics, retrosynthesis prompts."""

from __future__ import annotations

import json
import re

import pytest
import torch
from rdkit import Chem, rdBase

from logos.grammar import is_valid
from logos.generate import TaskMask, canonical_set, generate, load_checkpoint, molecule_metrics
from logos.train import Trainer
from train_fixtures import MOSES_500, REPO, make_shards, tiny_recipe

SHIPPED = REPO / "checkpoints" / "tiny-moses"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny model trained for a few steps on the fixture and exported (mechanics, not quality)."""
    tmp = tmp_path_factory.mktemp("generate")
    trainer = Trainer(tiny_recipe(make_shards(tmp), tmp / "run", max_steps=10), progress=False, echo=lambda l: None)
    for _ in range(10):
        trainer.step()
    return trainer.export(tmp / "hf")


def test_task_mask_bans_and_budget(checkpoint):
    model, tok = load_checkpoint(checkpoint)
    close = tok.convert_tokens_to_ids("<MoleculeE>")
    mask = TaskMask(tok, 2432, {"<MoleculeE>"}, close, prompt_len=2, budget=5)
    scores = mask(torch.ones(1, 3, dtype=torch.long), torch.zeros(1, 2432))
    banned = set(torch.nonzero(scores[0] == float("-inf")).flatten().tolist())
    for t in ("<s>", "</s>", "<pad>", "<unk>", "<MoleculeS>", "<ProteinS>", "<React>", "<0x43>"):
        assert tok.convert_tokens_to_ids(t) in banned, t
    assert close not in banned and tok.convert_tokens_to_ids("C") not in banned
    assert set(range(len(tok), 2432)) <= banned  # padded vocabulary rows
    forced = mask(torch.ones(1, 6, dtype=torch.long), torch.zeros(1, 2432))  # 4 generated: budget reached
    assert torch.isfinite(forced[0]).nonzero().flatten().tolist() == [close]


def _canonical(smiles: str) -> str | None:
    """RDKit's canonical SMILES, or None when RDKit rejects it (or it has no atoms); independent of logos."""
    with rdBase.BlockLogs():
        mol = Chem.MolFromSmiles(smiles)
    return Chem.MolToSmiles(mol) if mol is not None and mol.GetNumAtoms() else None


def _molecule_sample(text: str) -> str | None:
    """Canonical SMILES of a molecule sample: exactly one closed span that RDKit parses, else None."""
    m = re.fullmatch(r"<MoleculeS>([^<]+)<MoleculeE>", text)
    return _canonical(m.group(1)) if m else None


def _retro_line(text: str) -> str | None:
    """``reactants>agents>product`` of a retrosynthesis sample: the product span, <ReverseReact>, one or more
    closed reactant spans, optionally <Reagent> and closed agent spans; every SMILES parsed by RDKit. Else None."""
    span = r"<MoleculeS>[^<]+<MoleculeE>"
    m = re.fullmatch(rf"<MoleculeS>([^<]+)<MoleculeE><ReverseReact>((?:{span})+)(?:<Reagent>((?:{span})+))?", text)
    if not m:
        return None
    sides = [re.findall(r"<MoleculeS>([^<]+)<MoleculeE>", g or "") for g in (m.group(2), m.group(3))]
    canon = [[_canonical(s) for s in side] for side in sides] + [[_canonical(m.group(1))]]
    if any(c is None for side in canon for c in side):
        return None
    return ">".join(".".join(side) for side in canon)


def _error_log(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _sdf_entries(path) -> list[tuple[str, str]]:
    """(title line, ``smiles`` data item) of each SDF entry, read as plain text."""
    out = []
    for block in path.read_text().split("$$$$\n")[:-1]:
        lines = block.splitlines()
        k = next(k for k, line in enumerate(lines) if line.startswith(">") and "<smiles>" in line)
        out.append((lines[0], lines[k + 1]))
    return out


@pytest.mark.parametrize("suffix,constrained", [(".smi", True), (".sdf", False)])
def test_generate_molecules_writes_files_and_metrics(tmp_path, suffix, constrained):
    """The shipped checkpoint (75-90 % valid): validity, uniqueness and novelty recomputed here with RDKit
    from the returned texts; the file holds exactly the valid samples, the error log exactly the others."""
    n = 16
    out = tmp_path / f"gen{suffix}"
    result = generate(SHIPPED, out, n=n, batch_size=5, max_new_tokens=48, reference=MOSES_500, progress=False,
                      constrained=constrained)
    assert result.samples == n and len(result.texts) == n
    assert all(t.startswith("<MoleculeS>") for t in result.texts)
    closed = [t for t in result.texts if t.endswith("<MoleculeE>")]
    if constrained:  # every closed sample parses under the grammar
        assert closed and all(is_valid(t) for t in closed)
    else:  # the length budget closes every span
        assert len(closed) == n
    ids = [f"gen-{i + 1}" for i in range(n)]
    canon = [_molecule_sample(t) for t in result.texts]
    valid = [(i, c) for i, c in zip(ids, canon) if c is not None]
    invalid = [(i, t) for i, t, c in zip(ids, result.texts, canon) if c is None]
    # Seed 0 of the shipped model gives both kinds (13 valid of 16 when written); if a sampling change
    # makes this fail, pick a seed that does, so the file and error-log checks below keep their meaning.
    assert valid and invalid, result.texts
    assert result.valid == len(valid)
    assert result.unique == len({c for _, c in valid})
    reference = {_canonical(line.split()[0]) for line in MOSES_500.read_text().splitlines() if line.strip()}
    assert result.novel == len({c for _, c in valid} - reference)
    if suffix == ".sdf":
        written = _sdf_entries(out)
    else:
        written = [tuple(line.split("\t")[::-1]) for line in out.read_text().splitlines()]
    assert written == valid  # (id, canonical SMILES) of each valid sample, in order, and nothing else
    errors = _error_log(tmp_path / f"gen{suffix}.errors.jsonl")
    assert [e["source"] for e in errors] == [i for i, _ in invalid]
    assert all(e["reason"].endswith("| " + t) for e, (_, t) in zip(errors, invalid))
    # Novelty against a reference that holds 3 of these molecules, written as sampled (not canonical).
    seen = [re.fullmatch(r"<MoleculeS>(.+)<MoleculeE>", result.texts[ids.index(i)]).group(1) for i, _ in valid[:3]]
    ref = tmp_path / "ref.smi"
    ref.write_text("smiles\tid\n" + "".join(f"{smi}\tref-{k}\n" for k, smi in enumerate(seen)))
    again = generate(SHIPPED, tmp_path / "again.smi", n=n, batch_size=5, max_new_tokens=48, progress=False,
                     constrained=constrained, reference=ref)
    assert again.texts == result.texts  # one seed, one result
    assert again.novel == len({c for _, c in valid} - {_canonical(smi) for smi in seen}) == result.unique - 3
    other = generate(SHIPPED, tmp_path / "other.smi", n=n, batch_size=5, max_new_tokens=48, seed=1,
                     progress=False, constrained=constrained)
    assert other.texts != result.texts


PRODUCTS = "CC(=O)Oc1ccccc1C(=O)O\tp1\nnot_a_smiles\nc1ccccc1\tp3\n"
RETRO_IDS = ["product-1-1", "product-1-2", "product-3-1", "product-3-2"]  # the bad 2nd input is skipped


def _check_retro_files(result, out):
    expected = [(i, _retro_line(t)) for i, t in zip(RETRO_IDS, result.texts)]
    valid = [(i, line) for i, line in expected if line is not None]
    assert [tuple(line.split("\t")[::-1]) for line in out.read_text().splitlines()] == valid
    assert result.valid == len(valid)
    assert result.unique == len({t for (i, line), t in zip(expected, result.texts) if line is not None})
    errors = _error_log(out.with_name(out.name + ".errors.jsonl"))
    assert [e["source"] for e in errors] == [i for i, line in expected if line is None]
    return valid


def test_retrosynthesis_prompts(tmp_path):
    products = tmp_path / "products.smi"
    products.write_text(PRODUCTS)
    out = tmp_path / "retro.rsmi"
    result = generate(SHIPPED, out, task="reaction", inputs=products, n=2, max_new_tokens=16, progress=False)
    assert result.samples == 4  # 2 valid products x 2 samples; the bad input is reported and skipped
    aspirin, benzene = "CC(=O)Oc1ccccc1C(=O)O", "c1ccccc1"  # RDKit canonical forms of the inputs
    assert [t.split("<ReverseReact>")[0] for t in result.texts] == [f"<MoleculeS>{aspirin}<MoleculeE>"] * 2 + [
        f"<MoleculeS>{benzene}<MoleculeE>"] * 2
    assert all(is_valid(t) for t in result.texts)  # grammar-constrained, every sample closed within 16 tokens
    valid = _check_retro_files(result, out)
    # The shipped model gives both kinds here (3 of 4 valid when written): the file and log checks bite.
    assert 0 < len(valid) < 4, result.texts
    assert all(line.endswith(">" + (aspirin if i.startswith("product-1") else benzene)) for i, line in valid)


def test_retrosynthesis_truncated_sample_is_not_valid(tmp_path):
    """With 10 new tokens the 3rd sample stops mid-span ('...<MoleculeS>COc1cccc(Cl)c1NC(=O)C1c2ccccc2NC1=O',
    no <MoleculeE>): not a reaction text (the grammar rejects it), so it must go to the error log, not the file."""
    products = tmp_path / "products.smi"
    products.write_text(PRODUCTS)
    out = tmp_path / "retro.rsmi"
    result = generate(SHIPPED, out, task="reaction", inputs=products, n=2, max_new_tokens=10, progress=False)
    if all(is_valid(t) for t in result.texts):  # the precondition; pytest.fail is not the xfail's AssertionError
        pytest.fail(f"no truncated sample with 10 new tokens any more, pick another budget: {result.texts}")
    _check_retro_files(result, out)


def test_metrics_on_known_smiles():
    texts = ["<MoleculeS>CCO<MoleculeE>", "<MoleculeS>OCC<MoleculeE>", "<MoleculeS>C1CC<MoleculeE>",
             "<MoleculeS>c1ccccc1<MoleculeE>"]
    canon, unique, novel = molecule_metrics(texts, canonical_set(["c1ccccc1"]))
    assert canon[0] == canon[1] == "CCO" and canon[2] is None
    assert (unique, novel) == (2, 1)


def test_cli_generate(checkpoint, tmp_path, capsys):
    """The command on a freshly exported checkpoint: the reported valid count is what the files hold."""
    from logos.cli import main

    out = tmp_path / "g.smi"
    assert main(["generate", "--checkpoint", str(checkpoint), "-n", "4", "-o", str(out),
                 "--max-new-tokens", "16", "-q"]) == 0
    m = re.search(r"generate: 4 samples; valid (\d+) ", capsys.readouterr().err)
    assert m, "no summary line"
    written = [line.split("\t") for line in out.read_text().splitlines()]
    assert len(written) == int(m.group(1))
    assert all(_canonical(smiles) == smiles for smiles, _ in written)  # RDKit parses each, already canonical
    logged = [e["source"] for e in _error_log(tmp_path / "g.smi.errors.jsonl")]
    assert sorted([name for _, name in written] + logged) == ["gen-1", "gen-2", "gen-3", "gen-4"]


def test_shipped_checkpoint_writes_mostly_valid_molecules(tmp_path):
    """Quality floor of the shipped model, counted here with RDKit: >= 60 % valid, >= 90 % of those distinct."""
    result = generate(SHIPPED, tmp_path / "g.smi", n=50, temperature=0.7, reference=MOSES_500, progress=False)
    valid = [c for c in map(_molecule_sample, result.texts) if c is not None]
    assert len(valid) == len((tmp_path / "g.smi").read_text().splitlines()) == result.valid
    assert result.unique == len(set(valid))
    assert len(valid) >= 0.6 * 50, result.summary()
    assert len(set(valid)) >= 0.9 * len(valid)
