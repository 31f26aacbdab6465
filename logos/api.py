"""The public Python API: encode files to grammar text, decode it back, validate, load a model, generate, evaluate.

Each function is the library call behind one ``logos`` subcommand, with the same defaults::

    import logos

    logos.encode(["molecules.smi"], "molecules.jsonl")          # logos tokenize
    logos.decode("molecules.jsonl", "molecules.sdf")             # logos detokenize
    logos.validate("<MoleculeS>CC(=O)O<MoleculeE>")              # raises logos.GrammarError when it does not parse
    result = logos.generate("samples.smi", task="molecule", n=8)  # the shipped checkpoint by default
    metrics = logos.evaluate("molecule", "samples.smi", "report/")

Everything is imported on first use, so ``import logos`` costs nothing.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["encode", "decode", "validate", "load_model", "generate", "evaluate"]


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


def generate(output: str | Path, task: str = "molecule", n: int = 100, inputs: str | Path | None = None,
             checkpoint: str | Path | None = None, seed: int = 0, temperature: float = 1.0, max_new_tokens: int = 0,
             batch_size: int = 16, constrained: bool = True, device: str = "cpu"):
    """Sample ``task`` (see :data:`logos.tasks.TASKS`) from a checkpoint under the grammar and domain constraints
    and write the files ``output`` names plus ``OUTPUT.samples.jsonl``; returns the run's result."""
    from logos.generate import GenerateOptions, Sampling
    from logos.generate import generate as _generate
    from logos.util.resources import DEFAULT_CHECKPOINT, resolve

    options = GenerateOptions(task=task, n=n, batch_size=batch_size, seed=seed, constrained=constrained,
                              device=device, sampling=Sampling(temperature=temperature, max_new_tokens=max_new_tokens))
    return _generate(resolve(checkpoint or DEFAULT_CHECKPOINT), Path(output), options,
                     inputs=Path(inputs) if inputs else None, progress=False)


def evaluate(task: str, predictions: str | Path, output: str | Path, references: str | Path | None = None,
             train: str | Path | None = None) -> dict:
    """The field's metrics of ``predictions`` for ``task``, written to ``output/metrics.json`` and ``report.md``;
    returns metrics.json's content."""
    from logos.evaluate import run

    return run(task, Path(predictions), Path(output), references=references, train=train)

