"""Train/validation/test assignment by group key: related records (augmented variants, the forward and
retro forms of a reaction, the chains and ligands of one structure) always land in the same split.

Group keys (:func:`group_key`), unless a record names its own ``group`` (finetuning pairs do):

- molecule: its Bemis-Murcko scaffold (scaffold split; acyclic molecules by their own canonical
  SMILES), so every randomized-SMILES variant of a molecule, and every molecule sharing its
  scaffold, stays together;
- reaction: its sorted reactant and product sets, read from the text (forward and retro forms of
  one reaction give the same key);
- anything else: the structure it came from (``meta.structure``), else its ``id``, else its source
  file.

:func:`split_of` maps a key to a split by a seeded hash, so the assignment is a pure function of
(seed, key): independent of file order, worker count and how often the corpus is rebuilt.
Used by ``logos corpus build`` and by ``logos pack`` when it holds out validation rows itself.
"""

from __future__ import annotations

import functools
import hashlib

from logos.language.grammar import split_symbols

__all__ = ["group_key", "split_of"]


@functools.lru_cache(maxsize=65536)
def _scaffold_key(smiles: str) -> str:
    from rdkit import Chem
    from rdkit.Chem.Scaffolds import MurckoScaffold

    mol = Chem.MolFromSmiles(smiles)
    if mol is None:
        return "smiles:" + smiles
    scaffold = MurckoScaffold.MurckoScaffoldSmiles(mol=mol)
    return "scaffold:" + (scaffold or Chem.MolToSmiles(mol))


def group_key(record: dict) -> str:
    """What must stay in one split: the record's own ``group``, else scaffold, reaction, or source structure."""
    if record.get("group") is not None:
        return f"group:{record['group']}"
    domain = record.get("domain")
    text = record["text"]
    if domain == "molecule":
        pieces = split_symbols(text)
        return _scaffold_key(pieces[1] if len(pieces) > 1 else text)
    if domain == "reaction":
        from logos.domains.reaction import reaction_from_text
        from logos.util.records import RecordError

        try:
            reactants, _, products = reaction_from_text(text)
        except RecordError:
            return "text:" + text
        canon = [sorted(_canonical(s) for s in side) for side in (reactants, products)]
        return "reaction:" + ".".join(canon[0]) + ">>" + ".".join(canon[1])
    meta = record.get("meta") or {}
    structure = meta.get("structure") or record.get("id") or record.get("source", "").rsplit(":", 1)[0]
    return f"structure:{structure}"


@functools.lru_cache(maxsize=65536)
def _canonical(smiles: str) -> str:
    """Canonical SMILES when RDKit reads it (randomized reaction SMILES group with their canonical form)."""
    from logos.science.chemistry import canonical

    return canonical(smiles) or smiles


def split_of(key: str, seed: int, validation: float, test: float = 0.0) -> str:
    """``train``, ``validation`` or ``test`` for a group key: a seeded hash against the two fractions."""
    u = int.from_bytes(hashlib.blake2b(f"{seed}:{key}".encode(), digest_size=8).digest(), "big") / 2**64
    return "test" if u < test else "validation" if u < test + validation else "train"
