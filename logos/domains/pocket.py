"""Binding pockets: PDB/mmCIF protein-ligand complexes -> complex, ligand-first, site-search or transformation text.

Records: ONE RECORD PER LIGAND. A structure with two copies of a ligand (or a cofactor and an
inhibitor) gives one record each: the ``<aK>`` contact tokens index the atoms of exactly one
``<MoleculeS>`` span, so one ligand per record keeps them unambiguous, and every bound ligand is
its own training example. Every record carries all protein chains of the structure (the sequence
context), with the pockets of *that* ligand marked. A structure with no qualifying ligand gives
one plain-chains record (domain ``protein``).

Ligands come from ``--ligand FILE`` (SDF or MOL2, every molecule in it is posed against every
structure input; RDKit reads the bond orders from the file; ``--ligand auto`` pairs each
``X_protein.pdb`` with the ``X_ligand.sdf`` beside it) or, by default, from the structure's
own hetero groups (:mod:`logos.domains.structure`: at least 6 heavy atoms, not water/ion/buffer/glycan;
bond orders and charges from the PDB Chemical Component Dictionary, a ``--ligand-smiles`` template,
or with ``--perceive-bonds`` from geometry, as :mod:`logos.domains.ccd` explains; the record's
``meta.ligand.bond_orders`` says which, and ``dropped_atoms``/``unmodelled_atoms`` what a covalent
or partial ligand lost).

Pocket marks. A residue with any heavy atom within ``--pocket-cutoff`` (5.0 A) of any ligand heavy
atom is written ``<PocketS>K<aI><aJ><PocketE>``: ``<aI>`` lists the ligand heavy atoms within
``--contact-cutoff`` (4.0 A) of that residue, I being the atom's position in the written SMILES
(RDKit's ``_smilesAtomOutputOrder`` of the canonical isomeric SMILES, i.e. the atom index of the
molecule RDKit parses back from that SMILES), ascending. Ligands above 256 heavy atoms cannot be
indexed and are refused. Metal coordination (hemes, metal cofactors) is written with dative bonds
(``->``), which the grammar's SMILES allows.

Forms (``--form``): ``complex`` (marked chains, then the ligand), ``ligand-first`` (ligand, then
marked chains: pocket-from-ligand tasks), ``search`` (plain chains ``<Search>`` chains with pocket
marks, no atom tokens: binding-site identification) and ``trans`` (plain chains and ligand
``<Trans>`` marked chains and ligand).

``meta``: the structure name, per chain its id / author numbers / insertion codes / non-standard
residue names (as in :mod:`logos.domains.protein`), the ligand (CCD name, chain, author number,
its atom names in SMILES order: CCD/PDB atom names for hetero groups, MOL2 atom names, or for SDF
element + 1-based heavy-atom index in the file with hydrogens skipped) and the cut-offs used.

Detokenizers: ``.pocket.csv`` and ``.pocket.json`` (chain, author residue number, insertion code,
residue name, contacted ligand atoms); the ligand as ``.sdf`` is written by the molecule domain's
SDF writer (2D, or 3D with ``--3d``), which reads every molecule span of a record.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rdkit import Chem

from logos.domains import ccd, protein, structure
from logos.domains.base import CsvWriter, Domain, JsonArrayWriter, option
from logos.science.chemistry import CLOSE as MOL_CLOSE, OPEN as MOL_OPEN, molecules_in_text, parse_molblock
from logos.util.records import InputError, RecordError, WorkItem, open_text, plain_name

NAME = "pocket"
FORMS = ("complex", "ligand-first", "search", "trans")
MAX_LIGAND_ATOMS = 256

__all__ = ["PocketDomain", "PocketOptions", "encode_structure", "ligand_span", "pocket_rows"]


@dataclass(frozen=True)
class PocketOptions(protein.ProteinOptions):
    """Options of the complex encoder: the protein options plus the ligand, cut-offs and record form."""

    ligand: str | None = option(None, "ligand pose(s), SDF or MOL2, posed against every structure; 'auto': "
                                      "X_ligand.sdf next to each X_protein.pdb (default: the structure's own "
                                      "hetero groups)", metavar="LIG.sdf")
    pocket_cutoff: float = option(5.0, "residue in the pocket: any heavy atom within this distance of the ligand "
                                       "(default 5.0)", metavar="A")
    contact_cutoff: float = option(4.0, "ligand atom <aK> in contact with a pocket residue within this distance "
                                        "(default 4.0)", metavar="A")
    form: str = option("complex", "record form for structures with a ligand", choices=FORMS)
    ligand_smiles: str | None = option(None, "bond-order templates for hetero ligands (codes not in the CCD, e.g. a "
                                             "predicted complex's LIG1): CODE=SMILES[,CODE=SMILES] or an SDF file "
                                             "titled by code", metavar="CODE=SMILES")
    perceive_bonds: bool = option(False, "ligands with no CCD entry and no template: perceive bond orders from "
                                         "geometry (RDKit rdDetermineBonds; flagged in meta)")

    def __post_init__(self):
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")
        if self.pocket_cutoff <= 0 or self.contact_cutoff <= 0:
            raise ValueError("pocket_cutoff and contact_cutoff must be positive")


# ---------------------------------------------------------------- reading
def _paired_ligand(path: Path, stem: str) -> Path:
    """``--ligand auto``: X_protein.pdb -> X_ligand.sdf (or X.sdf / .mol2) in the same folder."""
    stems = [stem.replace("_protein", "_ligand"), stem] if "_protein" in stem else [stem + "_ligand", stem]
    for s in stems:
        for suffix in (".sdf", ".sdf.gz", ".mol2", ".mol2.gz"):
            if (path.parent / (s + suffix)).exists():
                return path.parent / (s + suffix)
    raise InputError(f"--ligand auto: no {stems[0]}.sdf or .mol2 next to the structure")


def _ligand_blocks(path: Path) -> Iterator[str]:
    mol2 = plain_name(path).endswith(".mol2")
    with open_text(path) as fh:
        text = fh.read()
    if mol2:
        parts = text.split("@<TRIPOS>MOLECULE")
        blocks = ["@<TRIPOS>MOLECULE" + p for p in parts[1:]]
    else:
        # The text after "$$$$" starts with that line's newline; the next line is the title.
        blocks = [b[1:] if b.startswith("\n") else b for b in text.split("$$$$") if b.strip()]
    if not blocks:
        raise InputError(f"{path.name}: no ligand records")
    yield from blocks


# ---------------------------------------------------------------- encoding
def _file_ligand(payload: dict) -> ccd.Ligand:
    if payload["mol2"]:
        mol = Chem.MolFromMol2Block(payload["block"], sanitize=True, removeHs=True)
        if mol is None:
            raise RecordError(f"ligand {payload['label']}: RDKit cannot read or sanitize the MOL2 record")
    else:
        try:
            mol = parse_molblock(payload["block"])
        except RecordError as e:
            raise RecordError(f"ligand {payload['label']}: {e}") from None
    return ccd.ligand_from_mol(mol, payload["label"])


def _hetero_ligand(st: structure.Structure, k: int, opts: PocketOptions | None = None) -> ccd.Ligand:
    opts = opts or PocketOptions()
    res, chain = st.ligand_residues[k], st.ligand_chains[k]
    icode = res.seqid.icode.strip()
    label = f"{res.name} {chain}/{res.seqid.num}{icode}"
    template = ccd.templates(opts.ligand_smiles).get(res.name)
    # errors name the ligand; the record source names its residue
    mol, names, how = ccd.ccd_mol(res, template=template, perceive=opts.perceive_bonds)
    return ccd.Ligand(mol, label, names, {"name": res.name, "chain": chain, "number": res.seqid.num,
                                          "icode": icode, **how})


def ligand_span(lig: ccd.Ligand) -> tuple[str, list[int]]:
    """The ligand's molecule span and, per molecule atom index, its position in the written SMILES."""
    if lig.mol.GetNumAtoms() > MAX_LIGAND_ATOMS:
        raise RecordError(f"ligand {lig.label}: {lig.mol.GetNumAtoms()} heavy atoms; <aK> tokens stop at "
                          f"{MAX_LIGAND_ATOMS}")
    mol = Chem.Mol(lig.mol)
    smiles = Chem.MolToSmiles(mol, isomericSmiles=True)  # metal coordination as dative bonds (N->Fe)
    order = [int(i) for i in mol.GetProp("_smilesAtomOutputOrder").strip("[],").split(",") if i != ""]
    rank = [0] * len(order)
    for k, i in enumerate(order):
        rank[i] = k
    return MOL_OPEN + smiles + MOL_CLOSE, rank


def encode_structure(st: structure.Structure, lig: ccd.Ligand, opts: PocketOptions) -> tuple[str, dict]:
    """Grammar text and meta of one structure-ligand pair in ``opts.form``."""
    span, rank = ligand_span(lig)
    raw = structure.pocket_contacts(st, lig.coords, opts.pocket_cutoff, opts.contact_cutoff)
    if not raw:
        raise RecordError(f"ligand {lig.label}: no protein heavy atom within {opts.pocket_cutoff} A "
                          "(is it posed against this protein?)")
    pockets = {key: sorted(rank[a] for a in atoms) for key, atoms in raw.items()}
    marked = protein.chains_text(st.chains, opts, pockets)
    form = opts.form
    if form == "complex":
        text = marked + span
    elif form == "ligand-first":
        text = span + marked
    elif form == "search":
        text = protein.chains_text(st.chains, opts) + "<Search>" + protein.chains_text(st.chains, opts, pockets, atoms=False)
    elif form == "trans":
        text = protein.chains_text(st.chains, opts) + span + "<Trans>" + marked + span
    else:
        raise RecordError(f"unknown form {form!r}")
    order = sorted(range(len(rank)), key=rank.__getitem__)
    ligand_meta = dict(lig.meta, label=lig.label, atoms=[lig.atom_names[i] for i in order] if lig.atom_names else [])
    meta = {**st.meta, "chains": [protein.chain_meta(c) for c in st.chains], "ligand": ligand_meta,
            "pocket_cutoff": opts.pocket_cutoff, "contact_cutoff": opts.contact_cutoff, "form": form}
    return text, meta


def encode_item(item: WorkItem, opts: PocketOptions) -> list[dict]:
    """Records of one structure: one per ligand (its own hetero groups, or the poses of ``--ligand``)."""
    payload = item.payload
    st = structure.read_structure(Path(payload["structure"]), seqres=opts.seqres)
    if "block" in payload:
        text, meta = encode_structure(st, _file_ligand(payload), opts)
        return [{"text": text, "domain": NAME, "source": item.source, "id": item.id, "meta": meta}]
    out: list[dict] = []
    for k in range(len(st.ligand_residues)):
        res = st.ligand_residues[k]
        where = f"{res.name} {st.ligand_chains[k]}/{res.seqid.num}{res.seqid.icode.strip()}"
        source = f"{item.source}:{where}"
        try:
            text, meta = encode_structure(st, _hetero_ligand(st, k, opts), opts)
        except RecordError as e:
            # One bad ligand is reported on its own line; the structure's other ligands are still written.
            out.append({"error": str(e), "source": source})
            continue
        ident = f"{item.id}_{res.name}_{st.ligand_chains[k]}{res.seqid.num}{res.seqid.icode.strip()}"
        out.append({"text": text, "domain": NAME, "source": source, "id": ident, "meta": meta})
    if not st.ligand_residues:
        out.append(protein.structure_record(st, opts, item.source, item.id))
    return out


# ---------------------------------------------------------------- detokenizers
def pocket_rows(record: dict) -> list[dict]:
    """One dict per pocket residue of a record: chain, author number, icode, name, contacted atoms."""
    chains = protein.parse_chains(record["text"])
    if not any(ch.pockets for ch in chains):
        raise RecordError("record holds no pocket marks")
    atom_names = ((record.get("meta") or {}).get("ligand") or {}).get("atoms") or []
    ligands = molecules_in_text(record["text"]) if MOL_OPEN in record["text"] else []
    if ligands:
        n_atoms = Chem.MolFromSmiles(ligands[-1]).GetNumAtoms() if Chem.MolFromSmiles(ligands[-1]) else None
        top = max((a for ch in chains for atoms in ch.pockets.values() for a in atoms), default=-1)
        if n_atoms is None:
            raise RecordError(f"ligand SMILES {ligands[-1][:60]!r} cannot be parsed")
        if top >= n_atoms:
            raise RecordError(f"contact token <a{top}> but the ligand has {n_atoms} heavy atoms")
    rows = []
    for c, ch in enumerate(chains):
        for i, atoms in sorted(ch.pockets.items()):
            chain_id, number, icode, name = protein.residue_table(record, c, i, ch.sequence[i])
            row = {"chain": chain_id, "number": number, "icode": icode, "name": name, "letter": ch.sequence[i],
                   "position": i + 1, "atoms": atoms}
            if atom_names:
                row["atom_names"] = [atom_names[a] if a < len(atom_names) else "?" for a in atoms]
            rows.append(row)
    return rows


class PocketCsvWriter(CsvWriter):
    """``.pocket.csv``: one row per pocket residue (author numbering when the record has ``meta``)."""

    suffixes = (".pocket.csv",)
    columns = ("id", "chain", "res_num", "icode", "res_name", "letter", "position", "ligand_atoms",
               "ligand_atom_names", "ligand_smiles")

    def rows(self, record: dict) -> list[tuple]:
        smiles = ".".join(molecules_in_text(record["text"])) if MOL_OPEN in record["text"] else ""
        return [(self.ident(record), r["chain"], r["number"], r["icode"], r["name"], r["letter"], r["position"],
                 " ".join(map(str, r["atoms"])), " ".join(r.get("atom_names", [])), smiles)
                for r in pocket_rows(record)]


class PocketJsonWriter(JsonArrayWriter):
    """``.pocket.json``: a JSON array, one object per record: id, ligand SMILES, pocket residues."""

    suffixes = (".pocket.json",)

    def item(self, record: dict) -> tuple[dict, int]:
        rows = pocket_rows(record)
        ligands = molecules_in_text(record["text"]) if MOL_OPEN in record["text"] else []
        return {"id": self.ident(record), "ligand": ligands, "residues": rows}, len(rows)


class PocketDomain(Domain):
    """PDB/mmCIF structures: complexes with pocket marks and ligand-contact tokens (plain chains without a ligand)."""

    name = NAME
    options_type = PocketOptions
    writers = (PocketCsvWriter, PocketJsonWriter)
    help_title = "binding pockets and protein-ligand complexes (PDB, mmCIF + ligand)"

    def claims(self, path: Path) -> bool:
        name = plain_name(path)
        if name.endswith((".cif", ".mmcif")):
            return structure.is_mmcif_text(path)  # small-molecule crystal CIFs belong to another domain
        return name.endswith((".pdb", ".ent"))

    def read(self, path: Path, opts: PocketOptions) -> Iterator[WorkItem]:
        stem = protein.structure_stem(path)
        if not opts.ligand:
            yield WorkItem(str(path), {"structure": str(path)}, id=stem)
            return
        lig = Path(opts.ligand) if opts.ligand != "auto" else _paired_ligand(path, stem)
        mol2 = plain_name(lig).endswith(".mol2")
        for n, block in enumerate(_ligand_blocks(lig), 1):
            yield WorkItem(f"{path}:{lig.name}#{n}", {"structure": str(path), "block": block, "mol2": mol2,
                                                       "label": f"{lig.name}#{n}"}, id=f"{stem}_{lig.stem}_{n}")

    def encode(self, item: WorkItem, opts: PocketOptions) -> list[dict]:
        return encode_item(item, opts)
