"""Reading a task's samples back: the canonical answer equal samples merge on, and extra output files."""

from __future__ import annotations

from pathlib import Path

from logos.util.records import RecordError

__all__ = ["reaction_answer", "write_marked_fasta"]


def reaction_answer(text: str, side: str) -> str | None:
    """The canonical ``reactants`` or ``products`` set of a reaction sample (``.``-joined, sorted), None if invalid."""
    from logos.domains.reaction import reaction_from_text
    from logos.science.chemistry import canonical_smiles, parse_smiles

    try:
        reactants, _, products = reaction_from_text(text)
        molecules = products if side == "products" else reactants
        return ".".join(sorted(canonical_smiles(parse_smiles(s)) for s in molecules)) or None
    except RecordError:
        return None


def write_marked_fasta(samples, out: Path) -> None:
    """``OUT.marked.fasta``: each binding-site answer with its pocket residues in lower case (an answer whose chains do
    not read back, which only unconstrained sampling writes, is left out)."""
    from logos.domains.protein import parse_chains

    path = out.with_name(out.name.split(".")[0] + ".marked.fasta")
    rank: dict[str, int] = {}
    with open(path, "w", encoding="utf-8") as fh:
        for s in samples:
            rank[s.input_id] = rank.get(s.input_id, 0) + 1
            if s.status != "done":
                continue
            try:
                chains = parse_chains(s.text)
            except RecordError:
                continue
            for c, chain in enumerate(chains):
                seq = "".join(a.lower() if i in chain.pockets else a for i, a in enumerate(chain.sequence))
                fh.write(f">{s.input_id}#{rank[s.input_id]}|chain{c + 1} logprob={s.logprob:.3f}\n{seq}\n")
