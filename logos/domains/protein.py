"""Proteins: FASTA, PDB and mmCIF chains <-> ``<ProteinS>sequence<ProteinE>`` spans, with optional contacts and 3Di.

Records. A FASTA file gives one record per sequence. A structure read with ``--domain protein``
gives one record per structure: one span per protein chain, in file order (the structure reading
rules - first model, highest-occupancy altloc, modified residues to their parent letter, ignored
hetero groups - are in :mod:`logos.domains.structure`). Structures are detected as the ``pocket`` domain
by default, which writes the complex form when a ligand is present (see
:mod:`logos.domains.pocket`).

Optional structure tokens (structures only):

- ``--contacts``: residue-residue contacts (Cb-Cb, Ca for glycine, ``< --contact-distance`` 8.0 A,
  sequence separation >= 6) written right after residue i as forward offsets ``<c+K>`` (j = i+K,
  same chain; K <= 1023, larger offsets are refused, never dropped).
- ``--structure-tokens 3di``: Foldseek's 3Di state per residue (``mini3di``), as a PARALLEL span
  ``<StructureS>...<StructureE>`` right after the chain span (see grammar/logos.lark for why not
  interleaved).
- ``--seqres``: a chain's sequence is its full SEQRES (entity) sequence rather than its modelled
  residues; unmodelled residues carry no pocket marks, contacts or valid 3Di state, and their
  author number is ``null`` in ``meta``. A chain without SEQRES is an error with this flag.
- ``--antibody``: every chain goes in an ``<AntibodyS>`` span. A CSV with ``heavy``/``light``
  columns (``--domain protein``) gives one record per row, heavy chain first.

``meta`` keeps what the text cannot: per chain its id, author residue numbers, insertion codes and
the CCD names of residues whose letter does not identify them (modified residues, X), so that
pocket tables and contact maps map back to the original numbering.

Detokenizers: ``.fasta``/``.fa``/``.faa`` (one entry per chain), ``.contacts.csv`` (contact pairs
with author numbering when ``meta`` is present, else 1-based positions) and ``.3di.fasta``.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from logos.domains.base import CsvWriter, Domain, DomainOptions, TextWriter, option
from logos.language.grammar import split_symbols
from logos.util.records import RecordError, WorkItem, open_text, plain_name

NAME = "protein"
FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fas")
STRUCTURE_SUFFIXES = (".pdb", ".ent", ".cif", ".mmcif")
MAX_OFFSET = 1023
_THREE = {"A": "ALA", "R": "ARG", "N": "ASN", "D": "ASP", "C": "CYS", "Q": "GLN", "E": "GLU", "G": "GLY",
          "H": "HIS", "I": "ILE", "L": "LEU", "K": "LYS", "M": "MET", "F": "PHE", "P": "PRO", "S": "SER",
          "T": "THR", "W": "TRP", "Y": "TYR", "V": "VAL", "U": "SEC", "O": "PYL", "X": "UNK"}

__all__ = ["ProteinDomain", "ProteinOptions", "ParsedChain", "parse_chains", "chains_text", "chain_meta",
           "residue_table", "structure_stem"]


# ---------------------------------------------------------------- options
@dataclass(frozen=True)
class ProteinOptions(DomainOptions):
    """Options of the protein encoder (the pocket encoder extends them)."""

    contacts: bool = option(False, "structures: write residue-residue contacts <c+K> (Cb-Cb, Ca for Gly; "
                                   "separation >= 6)")
    contact_distance: float = option(8.0, "residue-residue contact distance for --contacts (default 8.0)",
                                     metavar="A")
    min_separation: int = 6
    """Smallest sequence separation of a residue-residue contact (fixed; not a flag)."""
    structure_tokens: str | None = option(None, "structures: add a parallel 3Di span per chain", choices=("3di",))
    antibody: bool = option(False, "write every chain as an <AntibodyS> span")
    seqres: bool = option(False, "structures: write each chain's full SEQRES sequence (unmodelled residues "
                                 "included, author number null in meta) instead of the modelled residues only")


def _name(path: Path) -> str:
    return plain_name(path)


def is_structure(path: Path) -> bool:
    return _name(path).endswith(STRUCTURE_SUFFIXES)


def structure_stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz",) + STRUCTURE_SUFFIXES + FASTA_SUFFIXES:
        if name.lower().endswith(suffix):
            name = name[: -len(suffix)]
    return name


def _read_fasta(path: Path) -> Iterator[WorkItem]:
    from Bio import SeqIO

    with open_text(path) as fh:
        n = 0
        try:
            for n, rec in enumerate(SeqIO.parse(fh, "fasta"), 1):
                yield WorkItem(f"{path}:{n}", str(rec.seq), id=rec.id or None)
        except ValueError as e:  # Biopython: text before the first '>' header, ...
            yield WorkItem(f"{path}:{n + 1}", None, extra={"error": f"not FASTA: {str(e).split('. ')[0]}"})
            return
        if n == 0:
            yield WorkItem(str(path), None, extra={"error": "no FASTA records (expected '>' header lines)"})


def _read_antibody_csv(path: Path) -> Iterator[WorkItem]:
    with open_text(path) as fh:
        reader = csv.DictReader(fh)
        cols = {c.lower().strip(): c for c in reader.fieldnames or []}
        heavy = next((cols[c] for c in ("heavy", "heavy_chain", "vh", "h") if c in cols), None)
        light = next((cols[c] for c in ("light", "light_chain", "vl", "l") if c in cols), None)
        ident = next((cols[c] for c in ("id", "name") if c in cols), None)
        if heavy is None and light is None:
            yield WorkItem(str(path), None, extra={"error": "antibody CSV needs a 'heavy' and/or 'light' column"})
            return
        for n, row in enumerate(reader, 1):
            seqs = [row.get(c, "") or "" for c in (heavy, light) if c]
            yield WorkItem(f"{path}:{n + 1}", [s for s in seqs if s.strip()], id=row.get(ident) if ident else None,
                           extra={"antibody": True})


# ---------------------------------------------------------------- encoding
def clean_sequence(seq: str) -> str:
    s = "".join(seq.split()).upper().rstrip("*")
    if not s:
        raise RecordError("empty sequence")
    bad = sorted({c for c in s if not ("A" <= c <= "Z")})
    if bad:
        raise RecordError(f"sequence has characters that are not residue letters: {''.join(bad)[:20]!r}")
    return s


def chain_meta(chain) -> dict:
    """Author numbering of one structure chain: id, numbers, insertion codes, non-obvious residue names."""
    meta = {"id": chain.name, "numbers": [r.number for r in chain.residues]}
    icodes = {str(i): r.icode for i, r in enumerate(chain.residues) if r.icode}
    names = {str(i): r.name for i, r in enumerate(chain.residues) if _THREE.get(r.letter) != r.name}
    if icodes:
        meta["icodes"] = icodes
    if names:
        meta["names"] = names
    return meta


def chains_text(chains, opts: ProteinOptions, pockets: dict | None = None, atoms: bool = True) -> str:
    """Grammar text of structure chains; ``pockets`` maps (chain, residue) -> contacted ligand atoms."""
    from logos.domains import structure

    pockets = pockets or {}
    tag = ("<AntibodyS>", "<AntibodyE>") if opts.antibody else ("<ProteinS>", "<ProteinE>")
    out = []
    for c, chain in enumerate(chains):
        after: dict[int, list[int]] = {}
        if opts.contacts:
            for i, j in structure.residue_contacts(chain, opts.contact_distance, opts.min_separation):
                if j - i > MAX_OFFSET:
                    raise RecordError(f"chain {chain.name}: contact {i + 1}-{j + 1} is {j - i} residues apart; "
                                      f"<c+K> tokens stop at {MAX_OFFSET}")
                after.setdefault(i, []).append(j - i)
        parts = [tag[0]]
        if not after and not any(key[0] == c for key in pockets):  # plain chain: its sequence
            parts.append(chain.sequence)
        for i, res in enumerate(chain.residues) if len(parts) == 1 else ():
            if (c, i) in pockets:
                marks = "".join(f"<a{k}>" for k in pockets[(c, i)]) if atoms else ""
                parts.append(f"<PocketS>{res.letter}{marks}<PocketE>")
            else:
                parts.append(res.letter)
            parts.extend(f"<c+{k}>" for k in after.get(i, ()))
        parts.append(tag[1])
        if opts.structure_tokens == "3di":
            parts.append("<StructureS>" + structure.three_di(chain) + "<StructureE>")
        out.append("".join(parts))
    return "".join(out)


# ---------------------------------------------------------------- parsing grammar text back
@dataclass
class ParsedChain:
    """One chain span read back from grammar text."""

    kind: str  # "protein" or "antibody"
    sequence: str = ""
    pockets: dict[int, list[int]] = field(default_factory=dict)  # 0-based position -> ligand atoms
    contacts: list[tuple[int, int]] = field(default_factory=list)  # 0-based (i, j), i < j
    fold: str | None = None


def parse_chains(text: str) -> list[ParsedChain]:
    """The chain spans of a record. For ``<Search>``/``<Trans>`` records: those of the output side."""
    for op in ("<Search>", "<Trans>"):
        if op in text:
            text = text.split(op, 1)[1]
    pieces = split_symbols(text)
    chains: list[ParsedChain] = []
    cur: ParsedChain | None = None
    in_pocket = in_fold = False
    for p in pieces:
        if p in ("<ProteinS>", "<AntibodyS>"):
            cur = ParsedChain("antibody" if p == "<AntibodyS>" else "protein")
        elif p in ("<ProteinE>", "<AntibodyE>"):
            if cur is None:
                raise RecordError(f"{p} closes no open chain")
            chains.append(cur)
            cur = None
        elif p == "<PocketS>":
            in_pocket = True
        elif p == "<PocketE>":
            in_pocket = False
        elif p == "<StructureS>":
            in_fold = True
        elif p == "<StructureE>":
            in_fold = False
        elif in_fold:
            if not chains:
                raise RecordError("a 3Di span before any chain")
            chains[-1].fold = p
        elif cur is None:
            continue  # molecule spans and their SMILES are not chain content
        elif p.startswith("<a") and p[2:-1].isdigit():
            cur.pockets[len(cur.sequence) - 1].append(int(p[2:-1]))
        elif p.startswith("<c+"):
            i = len(cur.sequence) - 1
            if i < 0:
                raise RecordError(f"contact token {p} before the chain's first residue")
            cur.contacts.append((i, i + int(p[3:-1])))
        elif in_pocket:
            cur.pockets[len(cur.sequence)] = []
            cur.sequence += p
        elif not p.startswith("<"):
            cur.sequence += p
    for ch in chains:
        for i, j in ch.contacts:
            if j >= len(ch.sequence):
                raise RecordError(f"contact <c+{j - i}> after residue {i + 1} points past the chain end "
                                  f"({len(ch.sequence)} residues)")
        if ch.fold is not None and len(ch.fold) != len(ch.sequence):
            raise RecordError(f"3Di span has {len(ch.fold)} states for {len(ch.sequence)} residues")
    return chains


def _chain_meta(record: dict, c: int) -> dict:
    chains = (record.get("meta") or {}).get("chains") or []
    return chains[c] if c < len(chains) else {}


def residue_table(record: dict, c: int, i: int, letter: str) -> tuple[str, int, str, str]:
    """(chain id, author residue number, insertion code, residue name) of position i of chain c."""
    meta = _chain_meta(record, c)
    chain_id = meta.get("id") or chr(ord("A") + c % 26)
    numbers = meta.get("numbers") or []
    number = numbers[i] if i < len(numbers) else i + 1
    icode = (meta.get("icodes") or {}).get(str(i), "")
    name = (meta.get("names") or {}).get(str(i)) or _THREE.get(letter, "UNK")
    return chain_id, number, icode, name


def _record_chains(record: dict) -> list[ParsedChain]:
    chains = parse_chains(record["text"])
    if not chains:
        raise RecordError("record holds no protein or antibody span")
    return chains


# ---------------------------------------------------------------- detokenizers
def _chain_id(record: dict, c: int) -> str:
    return _chain_meta(record, c).get("id") or chr(ord("A") + c % 26)


class FastaWriter(TextWriter):
    """``.fasta``: one entry per chain span, ``>id|chain``."""

    suffixes = (".fasta", ".fa", ".faa")

    def write(self, record: dict) -> int:
        chains = _record_chains(record)
        for c, ch in enumerate(chains):
            self.fh.write(f">{self.ident(record)}|{_chain_id(record, c)}\n")
            for k in range(0, len(ch.sequence), 80):
                self.fh.write(ch.sequence[k:k + 80] + "\n")
        return len(chains)


class ContactsCsvWriter(CsvWriter):
    """``.contacts.csv``: one row per residue-residue contact decoded from ``<c+K>`` tokens."""

    suffixes = (".contacts.csv",)
    columns = ("id", "chain", "i", "j", "res_i", "icode_i", "name_i", "res_j", "icode_j", "name_j")

    def rows(self, record: dict) -> list[tuple]:
        rows = []
        for c, ch in enumerate(_record_chains(record)):
            for i, j in ch.contacts:
                ci, ni, ii, mi = residue_table(record, c, i, ch.sequence[i])
                _, nj, ij, mj = residue_table(record, c, j, ch.sequence[j])
                rows.append((self.ident(record), ci, i + 1, j + 1, ni, ii, mi, nj, ij, mj))
        return rows


class ThreeDiWriter(TextWriter):
    """``.3di.fasta``: the 3Di string of each chain that has a ``<StructureS>`` span."""

    suffixes = (".3di.fasta", ".3di")

    def write(self, record: dict) -> int:
        chains = [(c, ch) for c, ch in enumerate(_record_chains(record)) if ch.fold is not None]
        if not chains:
            raise RecordError("record holds no <StructureS> 3Di span")
        for c, ch in chains:
            self.fh.write(f">{self.ident(record)}|{_chain_id(record, c)}\n{ch.fold}\n")
        return len(chains)


def structure_record(st, opts: ProteinOptions, source: str, ident: str | None, domain: str = NAME) -> dict:
    """The record of a structure's plain chains (no ligand marks)."""
    meta = {**st.meta, "chains": [chain_meta(c) for c in st.chains]}
    return {"text": chains_text(st.chains, opts), "domain": domain, "source": source, "id": ident, "meta": meta}


class ProteinDomain(Domain):
    """FASTA sequences, antibody CSVs and (with ``--domain protein``) the chains of PDB/mmCIF structures."""

    name = NAME
    options_type = ProteinOptions
    writers = (FastaWriter, ContactsCsvWriter, ThreeDiWriter)
    help_title = "proteins (FASTA, PDB, mmCIF)"

    def claims(self, path: Path) -> bool:
        return _name(path).endswith(FASTA_SUFFIXES)

    def read(self, path: Path, opts: ProteinOptions) -> Iterator[WorkItem]:
        if is_structure(path):
            yield WorkItem(str(path), str(path), id=structure_stem(path), extra={"structure": True})
        elif _name(path).endswith(".csv"):
            yield from _read_antibody_csv(path)
        else:
            yield from _read_fasta(path)

    def count(self, path: Path) -> int:
        if is_structure(path):
            return 1
        with open_text(path) as fh:
            if _name(path).endswith(".csv"):
                return max(1, sum(1 for _ in fh) - 1)
            return max(1, sum(1 for line in fh if line.startswith(">")))

    def encode(self, item: WorkItem, opts: ProteinOptions) -> list[dict]:
        if item.extra.get("structure"):
            from logos.domains import structure

            st = structure.read_structure(Path(item.payload), seqres=opts.seqres)
            return [structure_record(st, opts, item.source, item.id)]
        if item.extra.get("antibody"):
            seqs = [clean_sequence(s) for s in item.payload]
            if not seqs:
                raise RecordError("no heavy or light chain sequence")
            text = "".join(f"<AntibodyS>{s}<AntibodyE>" for s in seqs)
        else:
            tag = "Antibody" if opts.antibody else "Protein"
            text = f"<{tag}S>{clean_sequence(item.payload)}<{tag}E>"
        rec = {"text": text, "domain": NAME, "source": item.source}
        if item.id:
            rec["id"] = item.id
        return [rec]
