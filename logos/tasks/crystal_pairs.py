"""Crystal structure prediction pairs: composition (and optionally space group) -> the crystal, in grammar v2.

Sources: CIF files (every ``data_`` block), pymatgen JSON, or a CDVAE-style CSV (``material_id``,
``cif`` columns; Perov-5, Carbon-24, MP-20 as distributed). Each crystal is encoded canonically
(:func:`logos.science.materials.text.encode_crystal`, composition header on); the prompt is the text up to
and including the composition header (``<CrystalS>Cl4Na4``), or up to the ``<sgN>`` tag with
``with_space_group``, and the completion is the rest. The group key is the reduced formula plus
space group, so polymorph duplicates of one entry stay on one side of the split.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Iterator

from logos.util.records import RecordError, open_text

__all__ = ["csp_records", "split_crystal_text"]

_SG = re.compile(r"<sg\d+>")


def split_crystal_text(text: str, with_space_group: bool) -> tuple[str, str]:
    """(prompt, completion) of a v2 crystal text with its composition header."""
    m = _SG.search(text)
    if m is None or m.start() <= len("<CrystalS>"):
        raise RecordError("no composition header before the space group")
    cut = m.end() if with_space_group else m.start()
    return text[:cut], text[cut:]


def _crystals(path: Path) -> Iterator[tuple[str, str]]:
    """(id, CIF text) of every crystal in a CSV with a ``cif`` column, or of every block of a CIF file."""
    name = path.name.lower()
    if ".csv" in name:
        csv.field_size_limit(1 << 26)
        with open_text(path) as fh:
            for n, row in enumerate(csv.DictReader(fh), 2):
                yield row.get("material_id") or f"line{n}", row.get("cif") or ""
    else:
        from logos.science.materials.crystal import read_crystal_file

        for item in read_crystal_file(path):
            yield item.id or item.source, item.payload


def csp_records(path: Path, options, errors) -> Iterator[dict]:
    from logos.science.materials.crystal import read_cif_block
    from logos.science.materials.text import encode_crystal

    for ident, cif in _crystals(Path(path)):
        try:
            text = encode_crystal(read_cif_block(cif), composition=True)
            prompt, completion = split_crystal_text(text, options.with_space_group)
        except (RecordError, ValueError) as e:
            errors.add(f"{path}:{ident}", str(e))
            continue
        sg = _SG.search(text).group(0)
        yield {"id": str(ident), "prompt": prompt, "completion": completion, "domain": "csp",
               "group": prompt.removeprefix("<CrystalS>") + sg}
