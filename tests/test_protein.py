"""Proteins, pockets and complexes: round trips on real structures, checked against direct gemmi computations."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import gemmi
import numpy as np
import pytest
from Bio import SeqIO
from rdkit import Chem

from logos.cli import build_parser
from logos.data.decode import detokenize_file
from logos.domains import DOMAINS, detect, encoder_options, pocket, protein, structure
from logos.domains.base import WriterOptions
from logos.data.encode import tokenize_files
from logos.language.grammar import validate
from logos.science.chemistry import molecules_in_text

ASSETS = Path(__file__).parent / "assets" / "protein"
POCKET, CONTACT = 5.0, 4.0


def _options(*argv: str) -> dict:
    args = build_parser().parse_args(["tokenize", "x", "-o", "y", *argv])
    return encoder_options(vars(args), strict=False)


def _tokenize(tmp_path: Path, paths, *argv: str, domain=None, name="out.jsonl"):
    lines: list[str] = []
    out = tmp_path / name
    result = tokenize_files([Path(p) for p in paths], out, _options(*argv), domain=domain, progress=False,
                            echo=lines.append)
    records = [json.loads(l) for l in out.read_text().splitlines()[1:]]
    for rec in records:
        validate(rec["text"])
    return records, lines, result


def _detokenize(tmp_path: Path, records: list[dict], suffix: str, *argv: str):
    inp = tmp_path / f"in{suffix}.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / f"out{suffix}"
    lines: list[str] = []
    result = detokenize_file(inp, out, WriterOptions(three_d="--3d" in argv), progress=False, echo=lines.append)
    assert not lines, lines
    return out, result


# ---------------------------------------------------------------- direct gemmi computations
def _gemmi_model(path: Path) -> gemmi.Model:
    st = gemmi.read_structure(str(path))
    st.remove_hydrogens()
    st.setup_entities()
    return st, st[0]


def _protein_residues(model: gemmi.Model):
    keep = set()
    for ch in model:
        for res in ch.get_polymer():
            if gemmi.find_tabulated_residue(res.name) and gemmi.find_tabulated_residue(res.name).is_amino_acid():
                keep.add((ch.name, res.seqid.num, res.seqid.icode.strip()))
    return keep


def _gemmi_pocket(path: Path, lig_xyz: np.ndarray) -> dict[tuple, set[int]]:
    """{(chain, number, icode): ligand atom indices within CONTACT} for residues within POCKET (gemmi NS)."""
    st, model = _gemmi_model(path)
    protein_keys = _protein_residues(model)
    ns = gemmi.NeighborSearch(model, st.cell, 6).populate()
    pocket_set: dict[tuple, set[int]] = {}
    for k, xyz in enumerate(lig_xyz):
        pos = gemmi.Position(*map(float, xyz))
        for mark in ns.find_atoms(pos, "\0", radius=POCKET):
            cra = mark.to_cra(model)
            key = (cra.chain.name, cra.residue.seqid.num, cra.residue.seqid.icode.strip())
            if key not in protein_keys:
                continue
            d = cra.atom.pos.dist(pos)
            if d <= POCKET:
                atoms = pocket_set.setdefault(key, set())
                if d <= CONTACT:
                    atoms.add(k)
    return pocket_set


def _decoded_pocket(tmp_path, rec) -> dict[tuple, list[int]]:
    out, _ = _detokenize(tmp_path, [rec], ".pocket.json")
    (obj,) = json.loads(out.read_text())
    return {(r["chain"], r["number"], r["icode"]): r["atoms"] for r in obj["residues"]}, obj


def _smiles_order(mol: Chem.Mol, smiles: str, original_index) -> None:
    """Assert that atom K of the decoded SMILES is the ligand atom original_index(K) (a graph match)."""
    parsed = Chem.MolFromSmiles(smiles)
    mapping = tuple(original_index(k) for k in range(parsed.GetNumAtoms()))
    matches = set(mol.GetSubstructMatches(parsed, uniquify=False, useChirality=False, maxMatches=100000))
    assert mapping in matches


# ---------------------------------------------------------------- tests
def test_fasta_round_trip(tmp_path):
    records, lines, _ = _tokenize(tmp_path, [ASSETS / "LuxC.faa"])
    expected = [str(r.seq) for r in SeqIO.parse(ASSETS / "LuxC.faa", "fasta")]
    assert not lines and len(records) == len(expected) == 12
    assert records[0]["domain"] == "protein" and records[0]["text"].startswith("<ProteinS>M")
    out, _ = _detokenize(tmp_path, records, ".fasta")
    assert [str(r.seq) for r in SeqIO.parse(out, "fasta")] == expected


@pytest.mark.parametrize("ligand_file,structure_file", [("1s3v_ligand.sdf", "1s3v_protein.pdb"),
                                                         ("1ia1_ligand.sdf", "1ia1_protein.pdb.gz")])
def test_sdf_ligand_pocket_equals_gemmi(tmp_path, ligand_file, structure_file):
    records, lines, _ = _tokenize(tmp_path, [ASSETS / structure_file], "--ligand", str(ASSETS / ligand_file))
    assert not lines and len(records) == 1
    rec = records[0]
    assert rec["domain"] == "pocket" and rec["source"].endswith(f"{ligand_file}#1")
    sdf = Chem.MolFromMolFile(str(ASSETS / ligand_file))
    decoded, obj = _decoded_pocket(tmp_path, rec)
    expected = _gemmi_pocket(ASSETS / structure_file, sdf.GetConformer().GetPositions())
    assert len(expected) >= 10 and any(expected.values())  # a real pocket (20 and 15 residues), with contacts
    assert set(decoded) == set(expected)
    # <aK> -> SDF atom via the meta's atom names ("C12" = 12th SDF atom), checked against the SMILES graph.
    names = rec["meta"]["ligand"]["atoms"]
    _smiles_order(sdf, obj["ligand"][0], lambda k: int("".join(c for c in names[k] if c.isdigit())) - 1)
    for key, atoms in decoded.items():
        assert {int("".join(c for c in names[a] if c.isdigit())) - 1 for a in atoms} == expected[key]


def test_hetero_ligands_pocket_equals_gemmi(tmp_path):
    path = ASSETS / "7ztl_protein.pdb.gz"
    records, lines, _ = _tokenize(tmp_path, [path])
    assert not lines
    assert [r["meta"]["ligand"]["name"] for r in records] == ["ADP", "JWG"]  # MG, NA, GOL are ignored
    st, model = _gemmi_model(path)
    for rec in records:
        lig = rec["meta"]["ligand"]
        res = model[lig["chain"]][str(lig["number"])][0]
        names = [a.name for a in res]
        xyz = np.array([a.pos.tolist() for a in res])
        decoded, obj = _decoded_pocket(tmp_path, rec)
        expected = _gemmi_pocket(path, xyz)
        assert expected and any(expected.values())  # ADP: 20 pocket residues, JWG: 7
        assert set(decoded) == set(expected)
        for key, atoms in decoded.items():
            assert {names.index(rec["meta"]["ligand"]["atoms"][a]) for a in atoms} == expected[key]
        # The SMILES atom order and the CCD atom names agree element by element.
        parsed = Chem.MolFromSmiles(obj["ligand"][0])
        elements = {a.name: a.element.name for a in res}
        assert [a.GetSymbol().upper() for a in parsed.GetAtoms()] == [elements[n].upper() for n in lig["atoms"]]
    # The chain sequences are the modelled polymer residues, in order.
    chains = protein.parse_chains(records[0]["text"])
    polymers = [c for c in model if len(c.get_polymer())]
    assert len(chains) == len(polymers) == 2  # 7ZTL: the kinase (A) and a peptide (B)
    for ch, gch in zip(chains, polymers):
        letters = [gemmi.find_tabulated_residue(r.name).one_letter_code.upper() for r in gch.get_polymer()]
        assert ch.sequence == "".join(letters)
    # 7ZTL has a phosphothreonine: written as its parent T, its CCD name kept in meta.
    assert "TPO" in records[0]["meta"]["chains"][0]["names"].values()


def test_mmcif_and_pdb_give_the_same_text(tmp_path):
    a, _, _ = _tokenize(tmp_path, [ASSETS / "7ztl_protein.pdb.gz"], "--contacts", name="a.jsonl")
    b, _, _ = _tokenize(tmp_path, [ASSETS / "7ztl_protein.cif.gz"], "--contacts", name="b.jsonl")
    assert [r["text"] for r in a] == [r["text"] for r in b] and len(a) == 2
    assert [r["meta"]["chains"] for r in a] == [r["meta"]["chains"] for r in b]


def test_golden_text():
    """Pinned text of the JWG record of 7ZTL (complex form, default cut-offs)."""
    st = structure.read_structure(ASSETS / "7ztl_protein.pdb.gz")
    k = [r.name for r in st.ligand_residues].index("JWG")
    text, _ = pocket.encode_structure(st, pocket._hetero_ligand(st, k), _options()["pocket"])
    assert text == (ASSETS / "7ztl_JWG.golden.txt").read_text().strip()


def test_residue_contacts_round_trip(tmp_path):
    path = ASSETS / "1s3v_protein.pdb"
    records, lines, _ = _tokenize(tmp_path, [path], "--contacts", domain="protein")
    assert not lines and len(records) == 1 and "<c+" in records[0]["text"]
    out, _ = _detokenize(tmp_path, records, ".contacts.csv")
    decoded = {(r["chain"], int(r["res_i"]), int(r["res_j"])) for r in csv.DictReader(open(out))}
    st, model = _gemmi_model(path)
    expected = set()
    for ch in model:
        pts = []
        for i, res in enumerate(ch.get_polymer()):
            atom = res.find_atom("CB", "*") if res.name != "GLY" else None
            atom = atom or res.find_atom("CA", "*")
            if atom:
                pts.append((i, res.seqid.num, atom.pos))
        for i, ni, pi in pts:
            for j, nj, pj in pts:
                if j - i >= 6 and pi.dist(pj) < 8.0:
                    expected.add((ch.name, ni, nj))
    assert decoded == expected and len(expected) > 100


def test_three_di_and_forms(tmp_path):
    path, lig = ASSETS / "1s3v_protein.pdb", str(ASSETS / "1s3v_ligand.sdf")
    (rec,), _, _ = _tokenize(tmp_path, [path], "--ligand", lig, "--structure-tokens", "3di", name="c.jsonl")
    chains = protein.parse_chains(rec["text"])
    assert chains[0].fold and len(chains[0].fold) == len(chains[0].sequence)
    out, _ = _detokenize(tmp_path, [rec], ".3di.fasta")
    assert out.read_text().splitlines()[1] == chains[0].fold
    base = {i for i in chains[0].pockets}
    for form in ("ligand-first", "search", "trans"):
        (r,), _, _ = _tokenize(tmp_path, [path], "--ligand", lig, "--form", form, name=f"{form}.jsonl")
        (ch,) = protein.parse_chains(r["text"])  # the output side for <Search>/<Trans>
        assert set(ch.pockets) == base and ch.sequence == chains[0].sequence
        if form == "search":
            assert "<a" not in r["text"] and "<MoleculeS>" not in r["text"]
        if form == "ligand-first":
            assert r["text"].startswith("<MoleculeS>")
    sdf, _ = _detokenize(tmp_path, [rec], ".sdf")
    mol = next(iter(Chem.SDMolSupplier(str(sdf))))
    assert Chem.MolToSmiles(mol) == Chem.MolToSmiles(Chem.MolFromMolFile(lig))


def _write_broken_inputs(tmp: Path) -> dict[str, Path]:
    good = (ASSETS / "1s3v_protein.pdb").read_text().splitlines(keepends=True)
    files = {}
    files["truncated"] = tmp / "truncated.pdb"
    cut = next(i for i, l in enumerate(good) if l.startswith("ATOM")) + 400
    files["truncated"].write_text("".join(good[:cut]) + good[cut][:40])
    files["no_ca"] = tmp / "no_ca.pdb"
    files["no_ca"].write_text("".join(l for l in good if not (l.startswith("ATOM") and l[12:16] == " CA ")))
    files["fake_gzip"] = tmp / "fake.pdb.gz"
    files["fake_gzip"].write_text("".join(good))
    return files


def test_broken_inputs_one_error_each(tmp_path):
    files = _write_broken_inputs(tmp_path)
    paths = [files["truncated"], files["no_ca"], files["fake_gzip"], ASSETS / "1s3v_protein.pdb"]
    records, lines, result = _tokenize(tmp_path, paths, domain="protein")
    assert len(records) == 1 and records[0]["source"].endswith("1s3v_protein.pdb")
    assert result.errors == 3 and len(lines) == 3
    assert lines[0].startswith(f"{files['truncated']}: ") and "truncated" in lines[0]
    assert lines[1].startswith(f"{files['no_ca']}: ") and "no CA atoms" in lines[1]
    assert lines[2].startswith(f"{files['fake_gzip']}: ") and "not gzip" in lines[2]
    assert not any("Traceback" in l or "internal error" in l for l in lines)


def test_bad_ligands_one_error_each(tmp_path):
    sdf = (ASSETS / "1s3v_ligand.sdf").read_text().rstrip()
    sdf = sdf if sdf.endswith("$$$$") else sdf + "\n$$$$"
    mol = Chem.MolFromMolFile(str(ASSETS / "1s3v_ligand.sdf"))
    far = Chem.Mol(mol)
    conf = far.GetConformer()
    for i in range(far.GetNumAtoms()):
        p = conf.GetAtomPosition(i)
        conf.SetAtomPosition(i, (p.x + 100.0, p.y, p.z))
    # An unsanitizable copy: a carbon with five bonds (one single bond turned triple).
    block = Chem.MolToMolBlock(mol).splitlines()
    n_atoms = mol.GetNumAtoms()
    bond_line = next(i for i in range(4 + n_atoms, len(block)) if block[i][6:9].strip() == "1"
                     and mol.GetAtomWithIdx(int(block[i][:3]) - 1).GetSymbol() == "C"
                     and mol.GetAtomWithIdx(int(block[i][:3]) - 1).GetDegree() >= 3)
    block[bond_line] = block[bond_line][:6] + "  3" + block[bond_line][9:]
    ligs = tmp_path / "ligands.sdf"
    ligs.write_text(sdf.rstrip() + "\n" + Chem.MolToMolBlock(far) + "$$$$\n" + "\n".join(block) + "\n$$$$\n")
    records, lines, result = _tokenize(tmp_path, [ASSETS / "1s3v_protein.pdb"], "--ligand", str(ligs))
    assert len(records) == 1 and records[0]["source"].endswith("ligands.sdf#1")
    assert len(lines) == 2 and result.errors == 2
    assert "ligands.sdf#2: " in lines[0] and "no protein heavy atom within 5.0" in lines[0]
    assert "ligands.sdf#3: " in lines[1] and "valence" in lines[1].lower()


def test_hetero_ligand_without_ccd_names_is_matched_to_its_ccd_entry_as_a_graph(tmp_path):
    """1IA1 as shipped by posebusters has renamed ligand atoms: the CCD entry is matched as a graph
    (meta says ``ccd-graph``), and TQ3 comes out as the crystal ligand of its SDF."""
    records, lines, _ = _tokenize(tmp_path, [ASSETS / "1ia1_protein.pdb.gz"])
    assert not lines and [r["meta"]["ligand"]["name"] for r in records] == ["TQ3", "NDP", "NDP"]
    assert all(r["meta"]["ligand"]["bond_orders"] == "ccd-graph" for r in records)
    sdf = Chem.MolFromMolFile(str(ASSETS / "1ia1_ligand.sdf"))
    assert Chem.CanonSmiles(molecules_in_text(records[0]["text"])[-1]) == Chem.MolToSmiles(sdf)


def test_detection_and_small_molecule_cif(tmp_path):
    assert detect(ASSETS / "7ztl_protein.cif.gz") is DOMAINS["pocket"]
    assert detect(ASSETS / "1s3v_protein.pdb") is DOMAINS["pocket"]
    assert detect(ASSETS / "LuxC.faa") is DOMAINS["protein"]
    small = tmp_path / "nacl.cif"
    small.write_text("data_NaCl\n_cell_length_a 5.64\nloop_\n_atom_site_label\n_atom_site_fract_x\nNa1 0.0\n")
    assert not DOMAINS["pocket"].claims(small)


def test_antibody_csv(tmp_path):
    table = tmp_path / "ab.csv"
    table.write_text("id,heavy,light\nab1,EVQLVESGGGLVQ,DIQMTQSPSSLSA\n")
    records, lines, _ = _tokenize(tmp_path, [table], domain="protein")
    assert records[0]["text"] == "<AntibodyS>EVQLVESGGGLVQ<AntibodyE><AntibodyS>DIQMTQSPSSLSA<AntibodyE>"
    assert records[0]["id"] == "ab1"


def test_structure_datasets_registered():
    from logos.data import datasets as data

    pb = data.DATASETS["posebusters-complexes"]
    assert (pb.package, pb.version) == ("posebusters", "0.6.5")
    names = ["posebusters/datasets/pdb/1s3v/1s3v_ligand.sdf", "posebusters/datasets/pdb/1s3v/1s3v_ligands.sdf",
             "posebusters/datasets/pdb/1s3v/1s3v_protein_one_lig_removed.pdb", "posebusters/__init__.py"]
    assert [f for _, f, _ in pb.files(names)] == ["1s3v_ligand.sdf", "1s3v_protein.pdb"]
    ds = data.DATASETS["dockstring-targets"]
    assert (ds.package, ds.version) == ("dockstring", "0.3.4")
    assert data.DATASETS["pyhmmer-proteins"].version == "0.12.3"
    # A real PDBQT receptor line (dockstring ABL1): AutoDock types become elements, chain A is set.
    pdbqt = (b"ATOM      1  N   ASP     1      37.433  20.702  -4.362  1.00  0.00    -0.411 N \n"
             b"ATOM      2  HN2 ASP     1      38.016  21.412  -3.919  1.00  0.00     0.151 HD\n"
             b"ATOM      3  CA  ASP     1      37.801  19.271  -4.257  1.00  0.00     0.161 C \n")
    st = gemmi.read_pdb_string(data.pdbqt_to_pdb(pdbqt).decode())
    assert [(a.name, a.element.name) for a in st[0]["A"][0]] == [("N", "N"), ("HN2", "H"), ("CA", "C")]


_THREE_TO_ONE = {"ALA": "A", "ARG": "R", "ASN": "N", "ASP": "D", "CYS": "C", "GLN": "Q", "GLU": "E", "GLY": "G",
                 "HIS": "H", "ILE": "I", "LEU": "L", "LYS": "K", "MET": "M", "PHE": "F", "PRO": "P", "SER": "S",
                 "THR": "T", "TRP": "W", "TYR": "Y", "VAL": "V"}


def _pdb_atoms(lines: list[str]) -> list[dict]:
    """ATOM/HETATM records by their PDB column positions (plain text; no gemmi, no logos)."""
    return [{"record": l[:6].strip(), "name": l[12:16].strip(), "altloc": l[16].strip(), "resname": l[17:20].strip(),
             "chain": l[21], "number": int(l[22:26]), "icode": l[26].strip(), "occ": float(l[54:60]),
             "xyz": (float(l[30:38]), float(l[38:46]), float(l[46:54]))}
            for l in lines if l.startswith(("ATOM  ", "HETATM"))]


def _kept(st, chain: str, number: int):
    (res,) = [r for c in st.chains if c.name == chain for r in c.residues if r.number == number]
    return res


def test_altloc_keeps_highest_occupancy(tmp_path):
    """1IA1 as deposited (posebusters conftest) has A/B altlocs. Hand-checked from its ATOM records:

    - LYS B 150: CG, CD, CE, NZ are altloc A at occupancy 0.65 and altloc B at 0.35: A must be kept.
    - SER A 98: OG is altloc A and B, both 0.50: a tie, which the documented rule breaks by the first letter, A.
    - every other altloc pair in the file is 0.50/0.50, so the kept atoms are exactly those without an
      altloc plus altloc A, one atom per name.
    - the same file with LYS B 150's occupancies swapped (A 0.35, B 0.65): B must be kept.
    """
    path = ASSETS / "1ia1_altloc.pdb.gz"
    lines = gzip.open(path, "rt").read().splitlines(keepends=True)
    raw = _pdb_atoms(lines)
    st = structure.read_structure(path)
    # The premise, from the records: LYS B 150 is the only residue whose altloc occupancies are not 0.50.
    assert {(a["chain"], a["number"]) for a in raw if a["altloc"] and a["occ"] != 0.5} == {("B", 150)}
    assert {a["altloc"] for a in raw} == {"", "A", "B"}

    def expected(chain, number, altloc):
        return [(a["name"], a["xyz"]) for a in raw if (a["chain"], a["number"]) == (chain, number)
                and a["record"] == "ATOM" and a["altloc"] in ("", altloc)]

    def matches(res, want) -> bool:
        return res.atoms == [n for n, _ in want] and np.allclose(res.coords, [x for _, x in want], atol=1e-6)

    lys = _kept(st, "B", 150)
    assert lys.name == "LYS" and lys.atoms == ["N", "CA", "C", "O", "CB", "CG", "CD", "CE", "NZ"]
    assert np.allclose(lys.coords[5], [7.274, 28.534, 2.474])  # CG A (B is at 6.623 30.308 2.056)
    assert matches(lys, expected("B", 150, "A"))
    ser = _kept(st, "A", 98)
    assert ser.atoms == ["N", "CA", "C", "O", "CB", "OG"]
    assert np.allclose(ser.coords[5], [31.523, 6.381, 24.171])  # OG A (B is at 33.477 6.305 23.954)

    # The whole file: every protein residue keeps its no-altloc atoms plus altloc A, in file order.
    n_checked = 0
    for chain in st.chains:
        for res in chain.residues:
            assert matches(res, expected(chain.name, res.number, "A")), (chain.name, res.number)
            n_checked += 1
    # The sequences are the ATOM residues in file order, each once (alternate conformers are not residues).
    for chain in st.chains:
        order = dict.fromkeys((a["number"], a["icode"], a["resname"]) for a in raw
                              if a["record"] == "ATOM" and a["chain"] == chain.name)
        assert chain.sequence == "".join(_THREE_TO_ONE[name] for _, _, name in order)
    assert [c.name for c in st.chains] == ["A", "B"]
    assert n_checked == len({(a["chain"], a["number"], a["icode"]) for a in raw if a["record"] == "ATOM"})
    # HETATM groups in the file: PO4 A 201, NDP A 193, PO4 B 202, NDP B 195; phosphate is never a ligand.
    assert [r.name for r in st.ligand_residues] == ["NDP", "NDP"]

    # Swap LYS B 150's occupancies (columns 55-60): now altloc B has the higher occupancy and must win.
    swapped = tmp_path / "1ia1_swapped.pdb"
    swap = {"0.65": "0.35", "0.35": "0.65"}
    swapped.write_text("".join(l[:54] + swap[l[54:60].strip()].rjust(6) + l[60:]
                               if l.startswith("ATOM  ") and l[21] == "B" and int(l[22:26]) == 150 and l[16] != " "
                               else l for l in lines))
    lys_b = _kept(structure.read_structure(swapped), "B", 150)
    assert lys_b.atoms == ["N", "CA", "C", "O", "CB", "CG", "CD", "CE", "NZ"]
    assert matches(lys_b, expected("B", 150, "B"))
    assert np.allclose(lys_b.coords[5], [6.623, 30.308, 2.056])  # CG B


def test_generated_text_errors_are_one_line(tmp_path):
    """Grammatical but impossible texts (as a model may generate) are rejected with a reason, not a traceback."""
    records = [{"text": "<ProteinS><c+3>ACDEFG<ProteinE>", "id": "early-contact"},
               {"text": "<ProteinS>AC<c+9>DEFG<ProteinE>", "id": "past-end"},
               {"text": "<ProteinS>A<PocketS>C<a40><PocketE>DE<ProteinE><MoleculeS>CCO<MoleculeE>", "id": "atom"},
               {"text": "<ProteinS>A<PocketS>C<a1><PocketE>DE<ProteinE><MoleculeS>CCO<MoleculeE>", "id": "ok"}]
    inp = tmp_path / "gen.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in records))
    lines: list[str] = []
    result = detokenize_file(inp, tmp_path / "gen.pocket.csv", progress=False, echo=lines.append)
    assert result.errors == 3 and result.objects == 1
    assert "before the chain's first residue" in lines[0] and "past the chain end" in lines[1]
    assert "<a40> but the ligand has 3 heavy atoms" in lines[2]


@pytest.mark.parametrize("entry", ["1A8O", "1LCD", "2XHE"])
def test_deposited_pdb_and_mmcif_give_the_same_text(tmp_path, entry):
    """Independent PDB and mmCIF files of one deposited entry (biopython test data) encode identically."""
    for flags in (("--contacts",), ("--seqres",)):
        a, la, _ = _tokenize(tmp_path, [ASSETS / f"{entry}.pdb.gz"], *flags, name="a.jsonl")
        b, lb, _ = _tokenize(tmp_path, [ASSETS / f"{entry}.cif.gz"], *flags, name="b.jsonl")
        assert not la and not lb and len(a) == len(b) == 1
        assert a[0]["text"] == b[0]["text"]
        assert a[0]["meta"]["chains"] == b[0]["meta"]["chains"]


def test_modified_residues_models_and_nucleic_acids(tmp_path):
    (rec,), _, _ = _tokenize(tmp_path, [ASSETS / "1A8O.pdb.gz"], name="a.jsonl")
    assert rec["text"].startswith("<ProteinS>MDIRQ")  # MSE 151 -> M
    assert rec["meta"]["chains"][0]["names"]["0"] == "MSE"
    # 1LCD: NMR with 3 models and DNA chains: one protein chain, from the first model only.
    (rec,), _, _ = _tokenize(tmp_path, [ASSETS / "1LCD.pdb.gz"], name="b.jsonl")
    raw = gemmi.read_structure(str(ASSETS / "1LCD.pdb.gz"))
    assert len(raw) == 3
    (chain,) = protein.parse_chains(rec["text"])
    first = [r for r in raw[0][rec["meta"]["chains"][0]["id"]] if r.het_flag == "A"]
    assert chain.sequence == gemmi.one_letter_code([r.name for r in first])
    assert len(rec["meta"]["chains"]) == 1


def test_seqres_places_unmodelled_residues(tmp_path):
    path = ASSETS / "2XHE.pdb.gz"
    (plain,), _, _ = _tokenize(tmp_path, [path], name="a.jsonl")
    (full,), _, _ = _tokenize(tmp_path, [path], "--seqres", name="b.jsonl")
    st = gemmi.read_structure(str(path))
    st.setup_entities()
    plain_chains, full_chains = protein.parse_chains(plain["text"]), protein.parse_chains(full["text"])
    assert len(plain_chains) == len(full_chains) == len(full["meta"]["chains"]) == 2  # 2XHE: two protein chains
    for c, (p, f) in enumerate(zip(plain_chains, full_chains)):
        ent = st.get_entity_of(st[0][full["meta"]["chains"][c]["id"]].get_polymer())
        assert len(f.sequence) == len(ent.full_sequence) > len(p.sequence)
        numbers = full["meta"]["chains"][c]["numbers"]
        modelled = "".join(letter for letter, n in zip(f.sequence, numbers) if n is not None)
        assert modelled == p.sequence  # the modelled residues, in order, are the plain sequence
        assert [n for n in numbers if n is not None] == plain["meta"]["chains"][c]["numbers"]


def test_three_di_matches_mini3di_on_biopython_chain():
    """Our 3Di (gemmi coordinates) equals mini3di's own encoder run on the Biopython parse of the chain."""
    import mini3di
    from Bio.PDB import PDBParser

    path = ASSETS / "1s3v_protein.pdb"
    (chain,) = structure.read_structure(path).chains
    bio_chain = PDBParser(QUIET=True).get_structure("x", str(path))[0][chain.name]
    enc = mini3di.Encoder()
    assert structure.three_di(chain) == enc.build_sequence(enc.encode_chain(bio_chain)).lower()


def test_partial_hetero_ligand_keeps_its_atoms_and_says_what_is_missing(tmp_path):
    """A hetero ligand with unmodelled atoms is written as modelled; meta lists the CCD atoms it lacks."""
    lines = gzip.open(ASSETS / "7ztl_protein.pdb.gz", "rt").read().splitlines(keepends=True)
    # Drop JWG's N1 (not a CCD leaving atom; the model already lacks the leaving atom O5, which is not listed).
    cut = tmp_path / "7ztl_partial.pdb"
    cut.write_text("".join(l for l in lines if not (l.startswith("HETATM") and l[17:20] == "JWG"
                                                    and l[12:16].strip() == "N1")))
    records, lines_out, _ = _tokenize(tmp_path, [cut])
    assert not lines_out and [r["meta"]["ligand"]["name"] for r in records] == ["ADP", "JWG"]
    lig = records[1]["meta"]["ligand"]
    assert lig["bond_orders"] == "ccd" and lig["unmodelled_atoms"] == ["N1"] and "N1" not in lig["atoms"]


def test_mol2_ligand_pocket_equals_gemmi(tmp_path):
    path, lig = ASSETS / "5ze6_protein.pdb.gz", ASSETS / "5ze6_ligand.mol2"
    (rec,), lines, _ = _tokenize(tmp_path, [path], "--ligand", str(lig))
    assert not lines
    mol = Chem.MolFromMol2File(str(lig))
    names = [a.GetProp("_TriposAtomName") for a in mol.GetAtoms()]
    decoded, obj = _decoded_pocket(tmp_path, rec)
    expected = _gemmi_pocket(path, mol.GetConformer().GetPositions())
    assert len(expected) >= 10 and any(expected.values())  # 27 pocket residues
    assert set(decoded) == set(expected)
    meta_names = rec["meta"]["ligand"]["atoms"]
    _smiles_order(mol, obj["ligand"][0], lambda k: names.index(meta_names[k]))
    for key, atoms in decoded.items():
        assert {names.index(meta_names[a]) for a in atoms} == expected[key]


def test_cli_reports_bad_files_in_one_line_each(tmp_path):
    """The real command: exit status 1, one stderr line per bad file (file: reason), good records written."""
    import subprocess
    import sys

    files = _write_broken_inputs(tmp_path)
    out = tmp_path / "cli.jsonl"
    cmd = [sys.executable, "-m", "logos.cli", "tokenize", "-q", "--domain", "protein", str(files["truncated"]),
           str(files["fake_gzip"]), str(ASSETS / "1A8O.cif.gz"), "-o", str(out)]
    env = dict(__import__("os").environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    errors = [l for l in proc.stderr.splitlines() if not l.startswith("tokenize:")]
    assert len(errors) == 2 and errors[0].startswith(str(files["truncated"]) + ": ")
    assert len(out.read_text().splitlines()) == 2  # header + the 1A8O record
    detok = subprocess.run([sys.executable, "-m", "logos.cli", "detokenize", "-q", str(out), "-o",
                            str(tmp_path / "cli.fasta")], capture_output=True, text=True, env=env, timeout=60)
    assert detok.returncode == 0 and (tmp_path / "cli.fasta").read_text().startswith(">1A8O|A\nMDIRQ")


def test_hemes_are_written_with_dative_bonds_and_the_bound_ligand_too(tmp_path):
    """Haemoglobin 1G9V: each HEM is written with its Fe coordination as dative bonds (heme b's formula);
    the crystal ligand from its SDF is written and checked against gemmi."""
    from rdkit.Chem.rdMolDescriptors import CalcMolFormula

    path = ASSETS / "1g9v_protein.pdb.gz"
    records, lines, _ = _tokenize(tmp_path, [path], name="a.jsonl")
    assert not lines and [r["meta"]["ligand"]["name"] for r in records] == ["HEM"] * 4
    for r in records:
        smiles = molecules_in_text(r["text"])[-1]
        assert "->" in smiles or "<-" in smiles
        assert CalcMolFormula(Chem.MolFromSmiles(smiles)) == "C34H32FeN4O4"
    (rec,), lines, _ = _tokenize(tmp_path, [path], "--ligand", str(ASSETS / "1g9v_ligand.sdf"), name="b.jsonl")
    assert not lines and len(rec["meta"]["chains"]) == 4
    sdf = Chem.MolFromMolFile(str(ASSETS / "1g9v_ligand.sdf"))
    decoded, _ = _decoded_pocket(tmp_path, rec)
    expected = _gemmi_pocket(path, sdf.GetConformer().GetPositions())
    assert len(expected) >= 10 and set(decoded) == set(expected)  # 15 pocket residues


def test_antibody_flag_on_fasta(tmp_path):
    records, _, _ = _tokenize(tmp_path, [ASSETS / "LuxC.faa"], "--antibody")
    expected = [str(r.seq) for r in SeqIO.parse(ASSETS / "LuxC.faa", "fasta")]
    assert [r["text"] for r in records] == [f"<AntibodyS>{seq}<AntibodyE>" for seq in expected]
    out, _ = _detokenize(tmp_path, records[:1], ".fasta")
    assert [str(r.seq) for r in SeqIO.parse(out, "fasta")] == expected[:1]


def test_answers_whose_chains_do_not_read_back_are_left_out_of_the_marked_fasta(tmp_path):
    """Unconstrained binding-site sampling can write a closing tag without its chain: that answer is left out of
    ``OUT.marked.fasta`` (reading it back is a one-line error), the others are written."""
    from logos.domains.protein import parse_chains
    from logos.generate.pipeline import Sample
    from logos.tasks.answers import write_marked_fasta
    from logos.util.records import RecordError

    good = Sample("p1", "", "<ProteinS>MKTA<ProteinE><Search><ProteinS>MK<PocketS>T<PocketE>A<ProteinE>", -1.0, "done")
    bad = Sample("p1", "", "<ProteinS>MKTA<ProteinE><Search>MK<ProteinE>TA", -2.0, "done")
    with pytest.raises(RecordError, match="closes no open chain"):
        parse_chains(bad.text)
    write_marked_fasta([bad, good], tmp_path / "x.pocket.csv")
    assert (tmp_path / "x.marked.fasta").read_text() == ">p1#2|chain1 logprob=-1.000\nMKtA\n"
