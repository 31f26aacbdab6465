"""The public Python API's file functions: encode files to grammar text, decode it back, validate, load a model.

With ``logos.generate.run`` and ``logos.evaluate.run`` (the jobs' own packages) these are the library
calls behind the ``logos`` subcommands, with the same defaults::

    import logos

    logos.encode(["molecules.smi"], "molecules.jsonl")              # logos tokenize
    logos.decode("molecules.jsonl", "molecules.sdf")                 # logos detokenize
    logos.validate("<MoleculeS>CC(=O)O<MoleculeE>")                  # GrammarError when it does not parse
    result = logos.generate.run("samples.smi", task="molecule", n=8)  # the shipped checkpoint by default
    metrics = logos.evaluate.run("molecule", "samples.smi", "report/")

Everything is imported on first use, so ``import logos`` costs nothing.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["encode", "decode", "validate", "load_model"]


def encode(inputs: list[str | Path] | str | Path, output: str | Path, domain: str | None = None, workers: int = 1,
           **flags):
    """Tokenize files (SMILES, SDF, reactions, FASTA, PDB/mmCIF, CIF, MOF CIF) into a JSONL of grammar records.

    ``flags`` are the encoders' options by field name (``retro=True``, ``contacts=True``, ...); returns the
    run's summary (records, rejected inputs, seconds)."""
    from logos.data.encode import tokenize_files
    from logos.domains import encoder_options

    paths = [Path(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    return tokenize_files(paths, Path(output), encoder_options(flags), domain=domain, workers=workers, progress=False)


def decode(records: str | Path, output: str | Path, **writer_options):
    """Detokenize a JSONL of grammar records into the files the output's suffix names (``.smi``, ``.sdf``,
    ``.rsmi``, ``.fasta``, ``.pocket.csv``, ``.cif``, ``.json``, ...)."""
    from logos.data.decode import detokenize_file
    from logos.domains.base import WriterOptions

    return detokenize_file(Path(records), Path(output), WriterOptions(**writer_options), progress=False)


def validate(text: str) -> None:
    """Check ``text`` against the LOGOS grammar; :class:`logos.language.grammar.GrammarError` says where it fails."""
    from logos.language.grammar import validate as _validate

    _validate(text)


def load_model(checkpoint: str | Path | None = None, device: str = "cpu"):
    """(model, tokenizer, run info) of an exported checkpoint (default: the shipped one); safetensors only."""
    from logos.generate import load_checkpoint
    from logos.util.resources import DEFAULT_CHECKPOINT, resolve

    return load_checkpoint(resolve(checkpoint or DEFAULT_CHECKPOINT), device)
