"""Macromolecular structure reading shared by the protein and pocket encoders: chains, altlocs, SEQRES, contacts, 3Di.

What is read from a PDB/mmCIF file (gzipped or not), and how:

- **Model**: the first model only. Hydrogens (and deuteriums) are removed first.
- **Alternate locations**: per residue, the altloc with the highest mean occupancy is kept (ties:
  the first letter); atoms without an altloc are always kept. Microheterogeneity (two residue
  names at one position) keeps the first residue of that position.
- **Protein chains**: per chain, its ATOM-record residues plus HETATM amino acids peptide-bonded
  to a neighbour (modified residues), when mostly amino acids, in file order; nucleic-acid chains
  are skipped. (Entity annotations are not used: PDB files without them split the same way.)
  A chain's sequence is its *modelled* residues in order; gaps are filled from SEQRES only with
  ``seqres=True`` (``--seqres``). Standard residues map to their one-letter code; modified residues map to their parent
  (gemmi's residue table, which follows the CCD: MSE->M, SEP->S, TPO->T, PTR->Y, CSO->C, ...;
  SEC->U, PYL->O); anything else is ``X``.
- **Ignored hetero groups** (:data:`IGNORED`): water, monoatomic and small inorganic ions,
  crystallisation additives/buffers/cryoprotectants (GOL, EDO, PEG, MES, HEPES, ...) and glycan
  sugars (NAG, MAN, ...). A hetero group is a *ligand* when it is not in that list, is not part of
  a polymer and has at least :data:`MIN_LIGAND_ATOMS` heavy atoms. Its bond orders come from the
  chemical component dictionary (:mod:`logos.domains.ccd`).
- **Distances**: heavy atoms only; a residue is *in the pocket* when any of its heavy atoms is
  within ``pocket_cutoff`` of any ligand heavy atom (``<=``), and ligand atom K is *in contact*
  with a residue when it is within ``contact_cutoff`` of any of the residue's heavy atoms.
  Residue-residue contacts use Cb (Ca for glycine or a residue without Cb) below ``cutoff`` with
  sequence separation >= ``min_separation``, within one chain.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

import gemmi
import numpy as np

from logos.util.records import InputError, RecordError, open_text, plain_name, read_text_bytes

__all__ = [
    "IGNORED", "MIN_LIGAND_ATOMS", "Residue", "Chain", "Structure",
    "read_structure", "pocket_contacts", "residue_contacts", "three_di", "is_mmcif_text",
]

MIN_LIGAND_ATOMS = 6

# Hetero groups that are never ligands: solvent, ions, additives, buffers, cryoprotectants, glycans.
IGNORED = frozenset("""
HOH WAT DOD H2O DIS SOL
NA K LI RB CS MG CA SR BA ZN MN FE FE2 CO NI CU CU1 CD HG PT AU AG PB AL GA IN TL YB SM GD EU
CL BR IOD F NH4 OH
SO4 SUL PO4 PI 2HP NO3 CO3 BCT SCN CYN AZI ACY ACT ACE FMT MOH EOH IPA DMS DMF BU3 BUD
GOL EDO PEG PGE PG4 1PE P6G 2PE 7PE P33 PE4 PE8 12P 15P MPD MRD PGO PGR TRS EPE MES MPO CPS
HEZ CIT FLC TAR TLA MLI MLA SIN SUC MAL BME DTT DTV IMD AMM BTB BIS B3P NHE CXS TAM
LDA BOG SDS DDQ C8E OLC MYR PLM STE LMT HTG UNL UNX UNK
NAG NDG MAN BMA GLC BGC GAL GLA FUC FUL XYP XYS SIA NGA A2G FUC
""".split())

_PARENTS = {"SEC": "U", "PYL": "O", "MSE": "M", "UNK": "X"}


@dataclass
class Residue:
    """One modelled protein residue: its letter, CCD name, author numbering; heavy atoms read on demand."""

    letter: str
    name: str
    number: int
    icode: str
    # Hydrogens already removed; valid while the Structure lives. None: a SEQRES residue that is not
    # modelled (--seqres), which has no atoms and no author number.
    res: gemmi.Residue | None = field(repr=False)

    @functools.cached_property
    def atoms(self) -> list[str]:
        return [a.name for a in self.res] if self.res is not None else []

    @functools.cached_property
    def coords(self) -> np.ndarray:  # (n_atoms, 3)
        if self.res is None:
            return np.zeros((0, 3))
        return np.array([a.pos.tolist() for a in self.res], dtype=float).reshape(-1, 3)

    def coord(self, atom: str) -> np.ndarray | None:
        if self.res is None:
            return None
        a = self.res.find_atom(atom, "*")
        return None if a is None else np.array(a.pos.tolist())


@dataclass
class Chain:
    name: str
    residues: list[Residue]

    @property
    def sequence(self) -> str:
        return "".join(r.letter for r in self.residues)



@dataclass
class Structure:
    gemmi_structure: gemmi.Structure = field(repr=False)  # owns the residues below
    name: str
    chains: list[Chain]
    ligand_residues: list[gemmi.Residue]
    ligand_chains: list[str]
    models: int = 1  # models in the file (NMR ensembles: several); the first one is read

    @property
    def meta(self) -> dict:
        """What a record says about the structure as read: its name and, for an ensemble, the model used."""
        out: dict = {"structure": self.name}
        if self.models > 1:
            out["model"] = f"1 of {self.models}"
        return out

    @property
    def n_residues(self) -> int:
        return sum(len(c.residues) for c in self.chains)


# ---------------------------------------------------------------- reading
def is_mmcif_text(path: Path) -> bool:
    """True when a CIF file holds a macromolecular ``_atom_site.`` table (not a small-molecule CIF)."""
    try:
        with open_text(path) as fh:
            for line in fh:
                if line.startswith("_atom_site."):
                    return True
                if line.startswith("_atom_site_"):  # small-molecule / crystal CIF (_atom_site_label)
                    return False
    except InputError:
        return False
    return False


# An atom record with an alternate-location mark (column 17). Anchored on the newline rather than with
# re.M's "^", so the regex engine jumps between newlines instead of trying every position.
_PDB_ALTLOC = re.compile(rb"\n(?:ATOM  |HETATM)[^\n]{10}[^ \r\n]")


def _read_gemmi(path: Path) -> tuple[gemmi.Structure, bool]:
    """The parsed structure and whether any atom has an alternate location."""
    # Bytes, not text: gemmi parses bytes, and decoding a whole structure file costs ~20% of gemmi's parse.
    data = read_text_bytes(path)  # InputError for binary / fake gzip, before gemmi sees it
    name = plain_name(path)
    try:
        if name.endswith((".cif", ".mmcif")):
            block = gemmi.cif.read_string(data).sole_block()
            st = gemmi.make_structure_from_block(block)
            has_altloc = bool(set(block.find_values("_atom_site.label_alt_id")) - {".", "?"})
        else:
            st = gemmi.read_pdb_string(data)
            has_altloc = _PDB_ALTLOC.search(b"\n" + data[:100]) is not None or _PDB_ALTLOC.search(data) is not None
    except (RuntimeError, ValueError) as e:
        raise RecordError(f"cannot parse structure: {' '.join(str(e).split())}") from None
    if len(st) == 0 or st[0].count_atom_sites() == 0:
        raise RecordError("no atoms in the structure (empty or truncated file)")
    if name.endswith((".pdb", ".ent")):
        # A PDB file that stops mid-record: the last line is an unterminated ATOM/HETATM record.
        end = len(data)
        while end and data[end - 1] in b"\r\n":
            end -= 1
        last = data[data.rfind(b"\n", 0, end) + 1:end].decode("latin-1")  # without copying the whole file
        if last.startswith(("ATOM", "HETATM")) and len(last.rstrip()) < 54:
            raise RecordError(f"truncated PDB file: last line is an incomplete atom record ({last[:30]!r})")
    return st, has_altloc


def _choose_altlocs(model: gemmi.Model) -> None:
    """Keep, per residue, the altloc with the highest mean occupancy; drop the others."""
    for chain in model:
        for res in chain:
            if not any(a.altloc != "\0" for a in res):
                continue
            occ: dict[str, list[float]] = {}
            for atom in res:
                if atom.altloc != "\0":
                    occ.setdefault(atom.altloc, []).append(atom.occ)
            if not occ:
                continue
            best = max(sorted(occ), key=lambda a: sum(occ[a]) / len(occ[a]))
            for i in range(len(res) - 1, -1, -1):
                if res[i].altloc not in ("\0", best):
                    del res[i]
            for atom in res:
                atom.altloc = "\0"


@functools.lru_cache(maxsize=4096)
def residue_letter(name: str) -> str:
    if name in _PARENTS:
        return _PARENTS[name]
    info = gemmi.find_tabulated_residue(name)
    if info is not None and info.is_amino_acid():
        code = info.one_letter_code.upper()
        if code.isalpha() and len(code) == 1:
            return code
    return "X"


@functools.lru_cache(maxsize=4096)
def _is_amino_acid(name: str) -> bool:
    info = gemmi.find_tabulated_residue(name)
    return name in _PARENTS or (info is not None and info.is_amino_acid())


def _peptide_linked(a: gemmi.Residue, b: gemmi.Residue) -> bool:
    c, n = a.find_atom("C", "*"), b.find_atom("N", "*")
    return c is not None and n is not None and c.pos.dist(n.pos) < 2.0


def _in_polymer(ch: list[gemmi.Residue], k: int) -> bool:
    """ATOM records, and HETATM amino acids (modified residues) peptide-bonded to a neighbour.

    Decided per residue from the records and geometry, not from entity annotations, so PDB files
    without SEQRES/entities and their mmCIF versions split chains the same way.
    """
    res = ch[k]
    if res.is_water():
        return False
    if res.het_flag == "A":  # ATOM record (a file without record types falls through to the geometry test)
        return True
    if not _is_amino_acid(res.name):
        return False
    return (k > 0 and _peptide_linked(ch[k - 1], res)) or (k + 1 < len(ch) and _peptide_linked(res, ch[k + 1]))



def read_structure(path: Path, seqres: bool = False) -> Structure:
    """The protein chains and candidate ligand residues of a PDB/mmCIF file (see module docstring).

    ``seqres``: each chain's sequence is its full SEQRES / entity sequence, the modelled residues
    placed by gemmi's alignment (``assign_label_seq_id``); unmodelled ones have no atoms.
    """
    path = Path(path)
    st, has_altloc = _read_gemmi(path)
    st.remove_hydrogens()
    model = st[0]
    if has_altloc:
        _choose_altlocs(model)
    chains: list[Chain] = []
    ligands: list[gemmi.Residue] = []
    lig_chains: list[str] = []
    for ch in model:
        chain_residues = list(ch)  # one pass of gemmi's iterator: indexing a gemmi.Chain costs more
        polymer = [k for k in range(len(chain_residues)) if _in_polymer(chain_residues, k)]
        names = [chain_residues[k].name for k in polymer]
        is_protein = bool(names) and sum(map(_is_amino_acid, names)) * 2 > len(names)
        residues: list[Residue] = []
        last = None
        for k, name in zip(polymer, names) if is_protein else ():
            res = chain_residues[k]
            seqid = res.seqid
            number, icode = seqid.num, seqid.icode
            if (number, icode) == last:  # microheterogeneity: keep the first residue name
                continue
            last = (number, icode)
            if len(res):
                residues.append(Residue(residue_letter(name), name, number, icode.strip(), res))
        if residues:
            if not any(r.res.find_atom("CA", "*") is not None for r in residues):
                raise RecordError(f"chain {ch.name}: no CA atoms (a protein chain needs its CA trace)")
            chains.append(Chain(ch.name, residues))
        in_polymer = set(polymer)
        for k, res in enumerate(chain_residues):
            if k in in_polymer or res.name in IGNORED or res.is_water():
                continue
            if sum(1 for a in res if a.element.name not in ("H", "D")) >= MIN_LIGAND_ATOMS:
                ligands.append(res)
                lig_chains.append(ch.name)
    if not chains:
        raise RecordError("no protein chain (no polymer of amino acids in the first model)")
    if seqres:
        st.setup_entities()
        st.assign_label_seq_id(False)  # PDB files: align to SEQRES; mmCIF: keep label_seq_id
        chains = [_with_seqres(st, model, c) for c in chains]
    return Structure(st, path.name, chains, ligands, lig_chains, models=len(st))


def _with_seqres(st: gemmi.Structure, model: gemmi.Model, chain: Chain) -> Chain:
    ent = st.get_entity_of(model[chain.name].get_polymer())
    if ent is None or not ent.full_sequence:
        raise RecordError(f"--seqres: chain {chain.name} has no SEQRES / entity sequence in the file")
    full = [gemmi.Entity.first_mon(item) for item in ent.full_sequence]
    placed: dict[int, Residue] = {}
    for r in chain.residues:
        pos = r.res.label_seq
        if pos is None or not 1 <= pos <= len(full) or pos in placed:
            raise RecordError(f"--seqres: chain {chain.name} residue {r.name} {r.number}{r.icode} "
                              "cannot be placed in its SEQRES")
        placed[pos] = r
    return Chain(chain.name, [placed.get(i) or Residue(residue_letter(n), n, None, "", None)
                              for i, n in enumerate(full, 1)])



# ---------------------------------------------------------------- contacts
def _protein_atoms(structure: Structure) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All protein heavy-atom coordinates, with (chain index, residue index) per atom."""
    xyz, ci, ri = [], [], []
    for c, chain in enumerate(structure.chains):
        for r, res in enumerate(chain.residues):
            xyz.append(res.coords)
            ci.append(np.full(len(res.coords), c))
            ri.append(np.full(len(res.coords), r))
    return np.concatenate(xyz), np.concatenate(ci), np.concatenate(ri)


def pocket_contacts(structure: Structure, ligand_xyz: np.ndarray, pocket_cutoff: float,
                    contact_cutoff: float) -> dict[tuple[int, int], list[int]]:
    """{(chain index, residue index): ligand atom indices within contact_cutoff} for pocket residues."""
    xyz, ci, ri = _protein_atoms(structure)
    pocket: dict[tuple[int, int], set[int]] = {}
    lo, hi = ligand_xyz.min(axis=0) - pocket_cutoff, ligand_xyz.max(axis=0) + pocket_cutoff
    near = np.nonzero(np.all((xyz >= lo) & (xyz <= hi), axis=1))[0]  # bounding-box prefilter
    if len(near):
        d = np.linalg.norm(xyz[near, None, :] - ligand_xyz[None, :, :], axis=2)  # (n_near, n_lig)
        for row in np.nonzero((d <= pocket_cutoff).any(axis=1))[0]:
            key = (int(ci[near[row]]), int(ri[near[row]]))
            atoms = pocket.setdefault(key, set())
            atoms.update(int(k) for k in np.nonzero(d[row] <= contact_cutoff)[0])
    return {k: sorted(v) for k, v in sorted(pocket.items())}


def _cb(res: Residue) -> np.ndarray | None:
    if res.letter != "G":
        cb = res.coord("CB")
        if cb is not None:
            return cb
    return res.coord("CA")


def residue_contacts(chain: Chain, cutoff: float = 8.0, min_separation: int = 6) -> list[tuple[int, int]]:
    """Pairs (i, j), i < j, 0-based positions in the chain, whose Cb (Ca for Gly) are below cutoff."""
    points = [(_i, p) for _i, r in enumerate(chain.residues) if (p := _cb(r)) is not None]
    if not points:
        return []
    idx = np.array([i for i, _ in points])
    xyz = np.array([p for _, p in points])
    sq = (xyz * xyz).sum(axis=1)
    d2 = sq[:, None] + sq[None, :] - 2.0 * (xyz @ xyz.T)  # squared distances, (n, n)
    near = d2 < cutoff * cutoff + 1e-3  # generous prefilter, then exact distances for the candidates
    a, b = np.nonzero(near & ((idx[None, :] - idx[:, None]) >= min_separation))
    keep = np.linalg.norm(xyz[a] - xyz[b], axis=1) < cutoff
    a, b = a[keep], b[keep]
    return sorted((int(idx[i]), int(idx[j])) for i, j in zip(a, b))


@functools.lru_cache(maxsize=1)
def _three_di_encoder():
    try:
        import mini3di
    except ImportError:  # pragma: no cover - optional flag
        raise RecordError("--structure-tokens 3di needs the mini3di package") from None
    return mini3di.Encoder()


def three_di(chain: Chain) -> str:
    """Foldseek 3Di states of a chain, one lower-case letter per residue (invalid positions: 'd')."""
    n = len(chain.residues)
    arrays = {a: np.full((n, 3), np.nan, dtype=np.float32) for a in ("CA", "CB", "N", "C")}
    for i, res in enumerate(chain.residues):
        for a, arr in arrays.items():
            p = res.coord(a)
            if p is not None:
                arr[i] = p
    enc = _three_di_encoder()
    states = enc.encode_atoms(arrays["CA"], arrays["CB"], arrays["N"], arrays["C"])
    return enc.build_sequence(states).lower()
