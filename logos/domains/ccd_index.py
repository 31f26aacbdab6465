"""The chemical component dictionary as a prebuilt SQLite index: one lookup per ligand code, ~ms per process.

biotite ships the CCD as one 63 MB BinaryCIF file (``structure/info/components.bcif``); reading it
costs ~1.5-3 s in every process that meets a hetero ligand, which dominated ``logos tokenize`` on
small batches of complexes and every isolated worker restart. The first process that needs the
CCD converts it once (~20 s on 2 cores) into ``$LOGOS_CACHE/ccd/biotite-VERSION-vN.sqlite``: one row
per component holding what the ligand encoder uses of its heavy atoms (names, elements, formal
charges, leaving flags, bonds with biotite's ``BondType`` codes) as zlib-compressed JSON. Later processes open the database
read-only and fetch only the codes they meet. The file is written to a temporary name and renamed
into place, so concurrent workers never read a half-built index; JSON, not pickle, so the cache
holds no code.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import sqlite3
import tempfile
import zlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from logos.util.records import RecordError

__all__ = ["Component", "component", "index_path", "build_index"]

FORMAT = 1  # bump when the row layout changes

# (value_order, pdbx_aromatic_flag) of ``chem_comp_bond`` -> biotite.structure.BondType; others: 0 (ANY).
_BOND_CODES = {("SING", "N"): 1, ("DOUB", "N"): 2, ("TRIP", "N"): 3, ("QUAD", "N"): 4,
               ("SING", "Y"): 5, ("DOUB", "Y"): 6, ("TRIP", "Y"): 7, ("AROM", "Y"): 9}


@dataclass(frozen=True)
class Component:
    """One CCD entry's heavy atoms (hydrogens left out) in the dictionary's order, and their bonds as
    (atom index, atom index, biotite BondType code)."""

    name: str
    atom_names: tuple[str, ...]
    elements: tuple[str, ...]  # upper case, as in the CCD ("FE", "C")
    charges: tuple[int, ...]
    leaving: frozenset[str]  # atoms lost when the component bonds covalently
    bonds: tuple[tuple[int, int, int], ...]


def _biotite_version() -> str:
    try:
        return metadata.version("biotite")
    except metadata.PackageNotFoundError:
        raise RecordError("ligand bond orders need biotite==1.6.0 (the CCD); it is not installed") from None


def index_path() -> Path:
    from logos.util.files import cache_dir
    return cache_dir() / "ccd" / f"biotite-{_biotite_version()}-v{FORMAT}.sqlite"


def _rows():
    """(code, JSON) per component, read from biotite's BinaryCIF in one pass over its columns."""
    from biotite.structure.info.ccd import get_ccd

    ccd = get_ccd()
    atoms, bonds = ccd["chem_comp_atom"], ccd["chem_comp_bond"]
    a_comp = atoms["comp_id"].as_array(str)
    a_name = atoms["atom_id"].as_array(str)
    a_elem = atoms["type_symbol"].as_array(str)
    a_charge = atoms["charge"].as_array(int, 0)
    a_leave = atoms["pdbx_leaving_atom_flag"].as_array(str)
    b_comp = bonds["comp_id"].as_array(str)
    b_1, b_2 = bonds["atom_id_1"].as_array(str), bonds["atom_id_2"].as_array(str)
    b_order, b_arom = bonds["value_order"].as_array(str), bonds["pdbx_aromatic_flag"].as_array(str)

    by_comp: dict[str, list[int]] = {}
    for k, code in enumerate(b_comp.tolist()):
        by_comp.setdefault(code, []).append(k)
    codes = a_comp.tolist()
    start = 0
    while start < len(codes):  # the atom table is grouped by component
        code, end = codes[start], start
        while end < len(codes) and codes[end] == code:
            end += 1
        heavy = [k for k in range(start, end) if str(a_elem[k]).upper() not in ("H", "D")]
        names = [str(a_name[k]) for k in heavy]
        index = {n: i for i, n in enumerate(names)}
        bond_rows = []
        for k in by_comp.get(code, ()):
            i, j = index.get(str(b_1[k])), index.get(str(b_2[k]))
            if i is not None and j is not None:
                bond_rows.append((i, j, _BOND_CODES.get((str(b_order[k]).upper(), str(b_arom[k]).upper()), 0)))
        data = json.dumps({
            "atoms": names, "elements": [str(a_elem[k]).upper() for k in heavy],
            "charges": [int(a_charge[k]) for k in heavy],
            "leaving": [str(a_name[k]) for k in heavy if str(a_leave[k]).upper() == "Y"],
            "bonds": bond_rows}, separators=(",", ":"))
        yield code, zlib.compress(data.encode(), 6)
        start = end


def build_index(path: Path | None = None) -> Path:
    """Write the index (atomically); returns its path."""
    path = Path(path or index_path())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        con = sqlite3.connect(tmp)
        con.execute("CREATE TABLE component (code TEXT PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID")
        con.executemany("INSERT OR REPLACE INTO component VALUES (?, ?)", _rows())
        con.commit()
        con.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


_CONNECTIONS: dict[int, sqlite3.Connection] = {}  # per process: a SQLite connection must not cross a fork


def _connection() -> sqlite3.Connection:
    con = _CONNECTIONS.get(os.getpid())
    if con is None:
        _CONNECTIONS.clear()  # a parent's connection, inherited through fork: never used here
        con = _CONNECTIONS[os.getpid()] = _open()
    return con


def _open() -> sqlite3.Connection:
    path = index_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_suffix(".lock"), "w") as lock:  # one builder; the other workers wait for it
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                build_index(path)
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)


@functools.lru_cache(maxsize=None)
def component(code: str) -> Component | None:
    """The CCD entry of a ligand code, or None when the dictionary has no such component."""
    row = _connection().execute("SELECT data FROM component WHERE code = ?", (code,)).fetchone()
    if row is None:
        return None
    d = json.loads(zlib.decompress(row[0]))
    return Component(code, tuple(d["atoms"]), tuple(d["elements"]), tuple(d["charges"]), frozenset(d["leaving"]),
                     tuple(map(tuple, d["bonds"])))
