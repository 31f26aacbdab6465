"""``logos generate --engine vllm``: the exported tiny model loads in vLLM as it is; molecules, crystals from a
composition and a binding-site search come out valid; one seed gives one result."""

from __future__ import annotations

import json
import re

import pytest

from conftest import SHIPPED

pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The shipped weights exported by ``export_hf`` from a tokenizer saved by this transformers (as a run saves
    it): what vLLM loads must need no edits."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer

    from logos.train.export import export_hf

    tmp = tmp_path_factory.mktemp("export")
    AutoTokenizer.from_pretrained(str(SHIPPED)).save_pretrained(str(tmp / "tokenizer"))
    state = load_file(str(SHIPPED / "model.safetensors"))
    if "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    config = AutoConfig.from_pretrained(str(SHIPPED))
    out = export_hf({k: v.to(torch.float32) for k, v in state.items()}, config, tmp / "tokenizer", tmp / "hf",
                    {"shards": json.loads((SHIPPED / "logos_run.json").read_text()).get("shards")})
    return out


@pytest.fixture(scope="module")
def llm(exported):
    from logos.generate.vllm_engine import EngineOptions, close_llm, make_llm

    llm = make_llm(exported, EngineOptions(max_num_seqs=32), seed=0, max_len=512)
    yield llm
    close_llm(llm)


def _opts(**kw):
    from logos.generate import GenerateOptions

    return GenerateOptions(**kw)


def test_export_names_what_transformers_4_and_vllm_read(exported, llm):
    cfg = json.loads((exported / "config.json").read_text())
    tok = json.loads((exported / "tokenizer_config.json").read_text())
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"]
    assert tok["tokenizer_class"] == "PreTrainedTokenizerFast" and "extra_special_tokens" not in tok
    for name in ("config.json", "tokenizer_config.json"):  # the shipped checkpoint is already portable
        shipped = json.loads((SHIPPED / name).read_text())
        assert {k: shipped.get(k) for k in ("rope_theta", "tokenizer_class")} == \
            {k: json.loads((exported / name).read_text()).get(k) for k in ("rope_theta", "tokenizer_class")}
    assert llm.llm_engine.model_config.max_model_len == 512  # loaded by vLLM as exported


def test_molecules_are_valid_ranked_and_seeded(llm, exported, tmp_path):
    from rdkit import Chem

    from logos.generate.vllm_engine import generate_vllm

    out = tmp_path / "gen.smi"
    result = generate_vllm(exported, out, _opts(n=16, seed=0), llm=llm)
    assert result.exit_code == 0 and result.written == 16
    lines = [json.loads(x) for x in out.with_name("gen.samples.jsonl").read_text().splitlines()]
    assert [x["rank"] for x in lines] == list(range(1, 17))
    assert [x["text"] for x in lines] == result.texts  # unconditional samples keep their generation order
    for x in lines:
        smi = re.fullmatch(r"<MoleculeS>([^<]+)<MoleculeE>", x["text"]).group(1)
        assert Chem.MolFromSmiles(smi) is not None, smi
    assert len(out.read_text().splitlines()) == 16
    assert result.engine.rows == 16 and result.engine.counts.policy.row_steps > 0 and result.engine.counts.requests
    assert result.not_whole > 0  # finished molecules the model would not end the record after: drawn again
    again = generate_vllm(exported, tmp_path / "again.smi", _opts(n=16, seed=0), llm=llm)
    assert again.texts == result.texts and [s.logprob for s in again.samples] == [s.logprob for s in result.samples]
    other = generate_vllm(exported, tmp_path / "other.smi", _opts(n=16, seed=1), llm=llm)
    assert other.texts != result.texts


def test_unconstrained_keeps_the_task_mask(llm, exported, tmp_path):
    from logos.generate.vllm_engine import generate_vllm

    result = generate_vllm(exported, tmp_path / "u.smi", _opts(n=8, seed=0, constrained=False), llm=llm)
    assert len(result.samples) == 8 and result.engine.counts.policy.row_steps == 0  # no policy decisions
    for s in result.samples:  # no symbol the task never writes; the closing tag only at the end
        assert s.text.startswith("<MoleculeS>") and "<MoleculeE>" not in s.text[:-len("<MoleculeE>")], s.text
        assert not re.search(r"<(?!MoleculeE>)[A-Za-z][A-Za-z0-9+]*>", s.text[len("<MoleculeS>"):]), s.text
    # as in the built-in engine, an unconstrained row writes its stop token where it may within the last
    # closing_slack (8) tokens of its budget, so no row runs out of budget
    from logos.generate import Sampling

    short = generate_vllm(exported, tmp_path / "s.smi", _opts(n=8, seed=0, constrained=False,
                                                             sampling=Sampling(max_new_tokens=12)), llm=llm)
    assert short.resampled == 0 and all(s.text.endswith("<MoleculeE>") for s in short.samples), short.texts


def test_logprob_is_the_models_own(llm, exported):
    """The rescored log-probability equals the built-in scoring with transformers (temperature 1, no mask)."""
    import torch
    from transformers import AutoModelForCausalLM

    from logos.tasks import TASKS

    from logos.tasks.prompts import build_prompts
    from logos.generate.vllm_engine import Checkpoint, end_probabilities, sample_jobs

    ck = Checkpoint(exported)
    task = TASKS["molecule"]
    jobs = ck.jobs(task, build_prompts(task, None, 2, None), 0)
    res = sample_jobs(lambda r, p: llm.generate(r, p, use_tqdm=False), ck, task, jobs, _opts(n=2, seed=3))
    model = AutoModelForCausalLM.from_pretrained(str(exported)).eval()
    for s, (ids, toks) in zip(res.samples, res.finals):
        full = ids + toks
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([full])).logits[0].float(), -1)
        want = sum(float(logp[j - 1, full[j]]) for j in range(len(ids), len(full)))
        assert abs(want - s.logprob) < 1e-3 * max(1.0, abs(want)), (want, s.logprob)
        # the whole-record draw: the model's probability of the end of document after the molecule
        (_, p_end), = end_probabilities(lambda r, p: llm.generate(r, p, use_tqdm=False), [(ids, toks)],
                                        ck.tok.eos_token_id)
        assert abs(p_end - float(logp[-1, ck.tok.eos_token_id].exp())) < 1e-3, p_end


def test_crystals_add_up_to_their_composition(llm, exported, tmp_path):
    from pymatgen.core import Composition, Structure

    from logos.generate.vllm_engine import generate_vllm

    from logos.tasks.prompts import PromptOptions

    inputs = tmp_path / "compositions.txt"
    inputs.write_text("Na4Cl4 225 nacl\nTiO2 - rutile\n")
    out = tmp_path / "xtal.cif"
    result = generate_vllm(exported, out, _opts(task="crystal", n=2, seed=0, resamples=8,
                                                prompts=PromptOptions(cell_composition=True)), inputs=inputs, llm=llm)
    assert len(result.samples) == 4
    files = sorted(out.with_suffix("").iterdir())  # -o xtal.cif: one CIF per crystal in xtal/
    assert len(files) == result.written and result.written >= 3, [(s.status, s.text) for s in result.samples]
    for s in result.samples:
        assert s.text.startswith("<CrystalS>Cl4Na4<sg225>") or s.text.startswith("<CrystalS>O2Ti1")
        assert "<Occ>" not in s.text
    for f in files:
        st = Structure.from_file(str(f))
        want = Composition("NaCl") if "nacl" in f.name else Composition("TiO2")
        assert st.composition.reduced_composition == want.reduced_composition, (f.name, st.composition)


def test_crystals_from_formulas_have_a_cell_the_group_holds(llm, exported, tmp_path):
    """A formula is one formula unit: Fe2O3 in R-3c is an Fe12O18 cell, NaCl in Fm-3m the cell the model prefers
    given the group (scored through vLLM), TiO2 without a group a cell of whole formula units the model writes under
    the grammar and the row constraint in the logits processor, as in the built-in engine."""
    from pymatgen.core import Composition

    from logos.generate import Sampling
    from logos.generate.vllm_engine import generate_vllm
    from logos.tasks.prompts import PromptOptions

    inputs = tmp_path / "formulas.txt"
    inputs.write_text("Fe2O3 167 hematite\nNaCl 225 rocksalt\nTiO2 - titania\n")
    out = tmp_path / "xtal.cif"
    result = generate_vllm(exported, out, _opts(task="crystal", n=2, seed=0, resamples=8,
                                                sampling=Sampling(max_new_tokens=400),
                                                prompts=PromptOptions(max_cell_atoms=30)), inputs=inputs, llm=llm)
    assert len(result.samples) == 6 and result.written >= 4, [(s.status, s.text) for s in result.samples]
    for s in result.samples:
        cell = Composition(re.match(r"<CrystalS>([A-Za-z0-9]+)<sg\d+>", s.text).group(1))
        if s.input_id == "hematite":
            assert cell == Composition("Fe12O18") and "<sg167>" in s.text
        elif s.input_id == "rocksalt":
            assert cell in (Composition("Na4Cl4"), Composition("Na8Cl8")) and "<sg225>" in s.text
        else:
            units = cell.num_atoms / 3
            assert units == int(units) and cell == Composition("TiO2") * int(units) and cell.num_atoms <= 30


def test_binding_site_search_copies_the_sequence(llm, exported, tmp_path):
    from logos.generate.vllm_engine import generate_vllm

    inputs = tmp_path / "p.fasta"
    inputs.write_text(">p1\nMKTAYIAKQR\n")
    out = tmp_path / "site.pocket.json"
    result = generate_vllm(exported, out, _opts(task="pocket", n=2, seed=0), inputs=inputs, llm=llm)
    assert result.exit_code == 0 and len(result.samples) == 2
    for s in result.samples:
        assert s.status == "done"
        assert re.sub(r"<[^>]+>", "", s.text.split("<Search>")[1]) == "MKTAYIAKQR"
    assert out.exists() and out.with_name("site.marked.fasta").exists()


def test_a_molecule_model_cli_run_through_vllm(tmp_path):
    """The CLI flag reaches the engine (a fresh load: only the argument path is checked, on a tiny n)."""
    from logos.cli.main import build_parser

    args = build_parser().parse_args(["generate", "-o", str(tmp_path / "x.smi"), "--engine", "vllm",
                                      "--tensor-parallel-size", "1", "--vllm-arg", "max_num_seqs=8"])
    from logos.cli.serve import engine_options

    e = engine_options(args)
    assert args.engine == "vllm" and e.extra == {"max_num_seqs": 8} and e.tensor_parallel_size == 1
