"""Crystal encoder/detokenizer and validity checks on real Materials Project structures and broken CIFs."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import gemmi
import pytest

from logos import materials as crystal
from logos.cli import main
from logos.data import DATASETS
from logos.domains import DOMAINS, detect
from logos.domains.crystal import CrystalOptions
from logos.grammar import validate
from logos.materials.validity import check_crystal, compositional_validity, summarize
from logos.materials.wyckoff import MULTIPLICITY, multiplicity
from logos.records import RecordError, WorkItem

CRYSTAL = DOMAINS["crystal"]

pymatgen = pytest.importorskip("pymatgen")
from pymatgen.analysis.structure_matcher import StructureMatcher  # noqa: E402
from pymatgen.core import Structure  # noqa: E402
from pymatgen.symmetry.analyzer import SpacegroupAnalyzer  # noqa: E402

ASSETS = Path(__file__).parent / "assets" / "crystal"
MP_CIFS = sorted(ASSETS.glob("mp_dielectric_*.cif"))
GOOD = MP_CIFS + [ASSETS / "NaCl.cif"]
BROKEN = {
    "broken_missing_cell.cif": "missing cell",
    "broken_unknown_element.cif": "unknown element 'Qq'",
    "broken_truncated_loop.cif": "Wrong number of values in loop",
    "broken_binary.cif": "binary file",
}
NACL = ("<CrystalS><sg225> 5.640 5.640 5.640 90.00 90.00 90.00 "
        "Na<wa> 0.0000 0.0000 0.0000 Cl<wb> 0.0000 0.0000 0.5000<CrystalE>")


def run(capsys, *args) -> tuple[int, str]:
    code = main([str(a) for a in args])
    return code, capsys.readouterr().err


def records(path: Path) -> list[dict]:
    return [r for r in map(json.loads, Path(path).read_text().splitlines()) if "logos_header" not in r]


def pmg(path_or_text, text=False) -> Structure:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return Structure.from_str(path_or_text, fmt="cif") if text else Structure.from_file(path_or_text)


def spg(s: Structure) -> int:
    return SpacegroupAnalyzer(s).get_space_group_number()


def gemmi_atoms(path: Path) -> int:
    small = gemmi.read_small_structure(str(path))
    small.setup_cell_images()
    return len(small.get_all_unit_cell_sites())


# ---------------------------------------------------------------- round trip
@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    """Tokenize every good fixture, detokenize to one CIF per record; (records, written CIFs)."""
    tmp = tmp_path_factory.mktemp("rt")
    out = tmp / "crystals.jsonl"
    assert main(["tokenize", *map(str, GOOD), "-o", str(out), "-q"]) == 0
    recs = records(out)
    assert main(["detokenize", str(out), "-o", str(tmp / "crystals.cif"), "-q"]) == 0
    cifs = sorted((tmp / "crystals").glob("*.cif"))
    return recs, cifs


def test_round_trip_matches_and_keeps_space_group(round_trip):
    recs, cifs = round_trip
    assert len(recs) == len(GOOD) == len(cifs)
    matcher = StructureMatcher()
    for src, rec, cif in zip(GOOD, recs, cifs):
        validate(rec["text"])
        assert rec["source"].startswith(str(src))
        s_in, s_out = pmg(src), pmg(cif)
        assert matcher.fit(s_in, s_out), (src.name, rec["text"])
        assert spg(s_in) == spg(s_out), src.name
        assert rec["text"].startswith(f"<CrystalS><sg{spg(s_in)}>")
        assert gemmi_atoms(cif) == len(s_out)  # gemmi reads the same cell


def test_nacl_canonical_text(round_trip):
    recs, _ = round_trip
    assert recs[-1]["text"] == NACL
    assert recs[-1]["meta"] == {"symprec": 0.01, "angle_tolerance": 5.0, "digits": {"length": 3, "angle": 2, "frac": 4, "occ": 3}}


def test_cif_states_space_group(round_trip):
    _, cifs = round_trip
    block = gemmi.cif.read(str(cifs[-1])).sole_block()
    assert block.find_value("_space_group_IT_number") == "225"
    small = gemmi.make_small_structure_from_block(block)
    assert small.spacegroup.number == 225


def test_multi_block_cif(tmp_path, capsys):
    out = tmp_path / "c.jsonl"
    run(capsys, "tokenize", *MP_CIFS[:3], "-o", out, "-q")
    code, _ = run(capsys, "detokenize", out, "-o", tmp_path / "all.cif", "--cif-multi-block", "-q")
    assert code == 0
    doc = gemmi.cif.read(str(tmp_path / "all.cif"))
    assert len(doc) == 3


def test_pymatgen_json_and_poscar(tmp_path, capsys):
    out = tmp_path / "j.jsonl"
    code, err = run(capsys, "tokenize", ASSETS / "mp_dielectric_3.json", ASSETS / "mp_dielectric_10.vasp", "-o", out, "-q")
    assert code == 0, err
    recs = records(out)
    assert len(recs) == 4
    inputs = [Structure.from_dict(d) for d in json.loads((ASSETS / "mp_dielectric_3.json").read_text())]
    inputs.append(Structure.from_file(ASSETS / "mp_dielectric_10.vasp"))
    assert len(inputs) == len(recs)  # 3 structures in the JSON list + 1 POSCAR
    for rec, s_in in zip(recs, inputs):
        s_out = pmg(crystal.crystal_to_cif(crystal.decode_text(rec["text"]), "x"), text=True)
        assert StructureMatcher().fit(s_in, s_out)


def test_partial_occupancy_is_written_not_dropped(tmp_path):
    cif = (ASSETS / "NaCl.cif").read_text().replace("Na1 Na 0.0 0.0 0.0 1.0", "Na1 Na 0.0 0.0 0.0 0.5\nK1 K 0.0 0.0 0.0 0.5")
    text = CRYSTAL.encode(WorkItem("x", cif), CrystalOptions())[0]["text"]
    validate(text)
    assert "Na<wa> 0.0000 0.0000 0.0000<Occ>0.500" in text and "K<wa> 0.0000 0.0000 0.0000<Occ>0.500" in text
    out = pmg(crystal.crystal_to_cif(crystal.decode_text(text), "x"), text=True)
    assert out.composition.reduced_formula == pmg(cif, text=True).composition.reduced_formula
    assert StructureMatcher().fit(pmg(cif, text=True), out)


def test_symprec_option_recorded(tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    run(capsys, "tokenize", ASSETS / "NaCl.cif", "-o", out, "-q", "--symprec", "0.1", "--frac-digits", "3")
    header = json.loads(out.read_text().splitlines()[0])["logos_header"]
    assert header["options"]["crystal"] == {"symprec": 0.1, "angle_tolerance": 5.0, "frac_digits": 3}
    assert "Cl<wb> 0.000 0.000 0.500" in records(out)[0]["text"]


# ---------------------------------------------------------------- detection and broken input
def test_cif_told_apart_by_content():
    assert detect(ASSETS / "NaCl.cif") is CRYSTAL
    assert detect(ASSETS / "mp_dielectric_3.json") is CRYSTAL
    assert not CRYSTAL.claims(ASSETS / "protein_like.cif")  # mmCIF (_atom_site. table): a structure, not a crystal
    assert detect(ASSETS / "protein_like.cif") is DOMAINS["pocket"]
    assert not DOMAINS["mof"].claims(ASSETS / "NaCl.cif")


def test_broken_cifs_one_clear_error_each_and_good_records_kept(tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    inputs = [ASSETS / "NaCl.cif", *(ASSETS / n for n in BROKEN), ASSETS / "mixed_blocks.cif", MP_CIFS[0]]
    code, err = run(capsys, "tokenize", *inputs, "-o", out, "-q")
    assert code == 1
    errors = [json.loads(l) for l in (tmp_path / "b.errors.jsonl").read_text().splitlines()]
    assert len(errors) == len(BROKEN) + 1  # + the cell-less block of mixed_blocks.cif
    for name, reason in BROKEN.items():
        hits = [e for e in errors if Path(e["source"].split(":")[0]).name == name]
        assert len(hits) == 1 and reason in hits[0]["reason"], (name, hits)
    assert any("block2_no_cell" in e["source"] and "missing cell" in e["reason"] for e in errors)
    recs = records(out)
    # NaCl.cif; the two good blocks of mixed_blocks.cif (data_NaCl, data_block3_Li2TlBi); mp_dielectric_142.cif
    # (data_PF5). Ids are the data block names, sources file:block.
    assert [r["id"] for r in recs] == ["NaCl", "NaCl", "block3_Li2TlBi", "PF5"]
    assert [r["source"] for r in recs] == [f"{ASSETS / 'NaCl.cif'}:NaCl", f"{ASSETS / 'mixed_blocks.cif'}:NaCl",
                                           f"{ASSETS / 'mixed_blocks.cif'}:block3_Li2TlBi", f"{MP_CIFS[0]}:PF5"]
    assert MP_CIFS[0].name == "mp_dielectric_142.cif"
    assert recs[0]["text"] == recs[1]["text"] == NACL  # Cl at (1/2,1/2,1/2) is the same 4b orbit as (0,0,1/2)
    for r in recs:
        validate(r["text"])


def test_detokenizer_rejects_bad_text_keeps_good(tmp_path, capsys):
    inp = tmp_path / "in.jsonl"
    bad = NACL.replace("<sg225>", "<sg2>").replace("<wb>", "<wz>")  # P-1 has no z position: expands fine
    lines = [{"text": NACL, "id": "good"}, {"text": "<CrystalS><sg225> 1 2<CrystalE>", "id": "bad"},
             {"text": NACL.replace("5.640 5.640 5.640", "0.000 5.640 5.640"), "id": "zero"}, {"text": bad, "id": "b2"}]
    inp.write_text("\n".join(json.dumps(l) for l in lines) + "\n")
    code, err = run(capsys, "detokenize", inp, "-o", tmp_path / "o.cif", "-q")
    assert code == 1
    written = sorted((tmp_path / "o").glob("*.cif"))
    assert len(written) == 2 and "good" in written[0].name
    assert "grammar error" in err and "invalid lattice" in err
    for text, reason in ((NACL.replace("Na<wa>", "Xx<wa>"), "unknown element 'Xx'"),
                         (NACL.replace("0.5000<CrystalE>", "0.5000<Occ>1.5<CrystalE>"), "occupancy 1.5")):
        with pytest.raises(RecordError, match=reason):
            crystal.decode_text(text)


# ---------------------------------------------------------------- validity
def test_validity_hand_checked_cases():
    assert check_crystal(NACL).valid
    nacl2 = NACL.replace("Cl<wb> 0.0000 0.0000 0.5000", "Cl<wc> 0.25 0.25 0.25")  # Na4Cl8 = NaCl2
    r = check_crystal(nacl2)
    assert r.compositional is False and r.structural and r.space_group and r.multiplicity and not r.valid
    close = ("<CrystalS><sg1> 5.000 5.000 5.000 90.00 90.00 90.00 "
             "Na<wa> 0.000 0.000 0.000 Cl<wa> 0.060 0.000 0.000<CrystalE>")  # 0.3 A apart
    r = check_crystal(close)
    assert r.structural is False and "0.300 A apart" in " ".join(r.reasons)
    wrong_sg = NACL.replace("<sg225>", "<sg221>").replace("0.0000 0.0000 0.5000", "0.5 0.5 0.5")  # CsCl-type
    assert check_crystal(wrong_sg).valid
    r = check_crystal(NACL.replace("<sg225>", "<sg216>"))  # F-43m: rock salt is Fm-3m
    assert r.space_group is False
    r = check_crystal(NACL.replace("Cl<wb>", "Cl<wc>"))  # 8c in Fm-3m, but (0,0,1/2) expands to 4
    assert r.multiplicity is False
    r = check_crystal(NACL.replace("Cl<wb>", "Cl<wz>"))
    assert r.multiplicity is False and "no Wyckoff position 'z'" in " ".join(r.reasons)
    assert compositional_validity("Fe3Ni")[0]  # alloy
    s = summarize([NACL, nacl2, "<CrystalS>"])
    assert s["n"] == 3 and s["valid"] == pytest.approx(1 / 3) and s["parsed"] == pytest.approx(2 / 3)


def test_wyckoff_table_agrees_with_spglib():
    for sg in range(1, 231):
        rots, _ = crystal.space_group_operations(sg)
        assert MULTIPLICITY[sg][-1] == len(rots), sg  # general position = all operations
    assert multiplicity(225, "a") == 4 and multiplicity(47, "A") == 8


def test_encoded_letters_have_the_table_multiplicity(round_trip):
    recs, _ = round_trip
    for rec in recs:
        asym, sizes = crystal.expand(crystal.parse_crystal_text(rec["text"]))
        assert [multiplicity(asym.space_group, s.wyckoff) for s in asym.sites] == sizes


def test_datasets_are_pinned():
    assert DATASETS["mp-dielectric"].package == "crystal-toolkit" and DATASETS["mp-dielectric"].version
    assert DATASETS["core-mof"].package == "core-mof" and DATASETS["core-mof"].version == "2019.1"
    assert DATASETS["core-mof"].members == ("CoRE_MOF/data/2019-ASR.tar.xz",)


def test_canonical_text_does_not_depend_on_the_cell():
    """A rotated supercell of the same crystal gives the same text (one site per Wyckoff orbit)."""
    s = pmg(ASSETS / "mp_dielectric_4631.cif")
    reference = crystal.encode_crystal(crystal.crystal_from_dict(s.as_dict()))
    bigger = s.copy()
    bigger.make_supercell([[1, 1, 0], [-1, 1, 0], [0, 0, 2]])
    assert crystal.encode_crystal(crystal.crystal_from_dict(bigger.as_dict())) == reference
    primitive = SpacegroupAnalyzer(s).get_primitive_standard_structure()
    assert crystal.encode_crystal(crystal.crystal_from_dict(primitive.as_dict())) == reference


def test_supercell_orbit_is_not_split():
    """mp-dielectric-508 (Mg3NSb, Pm-3m) is stored as a 20-atom supercell: Mg is one 3c orbit."""
    item = next(iter(crystal.read_crystal_file(ASSETS / "mp_dielectric_508_supercell.json")))
    text = CRYSTAL.encode(item, CrystalOptions())[0]["text"]
    assert text.count("Mg<wc>") == 1 and text.startswith("<CrystalS><sg221>")
    assert StructureMatcher().fit(Structure.from_dict(item.payload),
                                  pmg(crystal.crystal_to_cif(crystal.decode_text(text), "x"), text=True))


def test_overfull_site_is_an_error_rounding_is_scaled():
    cif = (ASSETS / "NaCl.cif").read_text()
    scaled = cif.replace("Na1 Na 0.0 0.0 0.0 1.0", "Na1 Na 0.0 0.0 0.0 0.52\nK1 K 0.0 0.0 0.0 0.50")
    assert "Na<wa> 0.0000 0.0000 0.0000<Occ>0.510" in CRYSTAL.encode(WorkItem("x", scaled), CrystalOptions())[0]["text"]
    overfull = cif.replace("Na1 Na 0.0 0.0 0.0 1.0", "Na1 Na 0.0 0.0 0.0 0.7\nK1 K 0.0 0.0 0.0 0.6")
    with pytest.raises(RecordError, match="occupancies sum to 1.300"):
        CRYSTAL.encode(WorkItem("x", overfull), CrystalOptions())
