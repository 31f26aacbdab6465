"""BENCHMARKS.md sections that benchmark scripts own: the text between a script's two markers, replaced in place."""

from __future__ import annotations

from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


def write_section(text: str, begin: str, end: str, heading: str = "") -> None:
    """Replace what stands from ``begin`` to ``end`` in BENCHMARKS.md with ``text`` (which holds both markers), or
    append it, under ``heading`` when given, if the file has no such section yet."""
    doc = BENCHMARKS.read_text()
    if begin in doc:
        doc = doc[:doc.index(begin)] + text + doc[doc.index(end) + len(end):]
    else:
        doc = doc.rstrip("\n") + "\n\n" + (f"{heading}\n\n" if heading else "") + text + "\n"
    BENCHMARKS.write_text(doc)
