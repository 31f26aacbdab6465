"""The built-in engine against vLLM, side by side in one run: molecules, constrained and unconstrained.

For each model (the shipped tiny checkpoint; a randomly initialised ~100M Llama with the LOGOS
vocabulary, hidden 768, 14 layers) and each number of concurrent rows (16, 128: the built-in
engine's batch size, the number of requests vLLM schedules at once), both engines sample the same
task with the same seed, constrained (grammar + chemistry) and unconstrained, and the script
reports samples/s, tokens/s and the constraint's cost per row per step (built-in: the chemistry
checks, and the grammar masks per row; vLLM: the LOGOS logits processor, in its worker process;
vLLM's grammar masks are filled by its structured-output manager and not separated here). On the
tiny model it also compares what the two engines write (constrained): validity before
resampling, rows resampled, and a few property distributions of the molecules (heavy atoms,
rings, QED, logP: mean, and the two-sample Kolmogorov-Smirnov statistic between the engines).

Run in the vLLM venv (it holds both engines); it rewrites its section of BENCHMARKS.md:

    OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind .venv-vllm/bin/python benchmarks/vllm_bench.py
    .venv-vllm/bin/python benchmarks/vllm_bench.py --models tiny --rows 16 --n 32     # a short run
"""

import argparse
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
BEGIN, END = "<!-- vllm bench -->", "<!-- /vllm bench -->"


def _properties(texts):
    from rdkit import Chem
    from rdkit.Chem import QED, Crippen

    out = {"heavy atoms": [], "rings": [], "QED": [], "logP": []}
    for t in texts:
        m = re.fullmatch(r"<MoleculeS>([^<]+)<MoleculeE>", t)
        mol = Chem.MolFromSmiles(m.group(1)) if m else None
        if mol is None:
            continue
        out["heavy atoms"].append(mol.GetNumHeavyAtoms())
        out["rings"].append(mol.GetRingInfo().NumRings())
        out["QED"].append(QED.qed(mol))
        out["logP"].append(Crippen.MolLogP(mol))
    return out


def builtin_run(checkpoint, rows, n, constrained, budget, work, seed=0, whole_draws=16):
    from logos.generate import GenerateOptions, Sampling, generate

    options = GenerateOptions(task="molecule", n=n, batch_size=rows, seed=seed, constrained=constrained,
                              sampling=Sampling(max_new_tokens=budget), whole_draws=whole_draws)
    t = time.perf_counter()
    r = generate(checkpoint, work / f"b{rows}{int(constrained)}.smi", options, progress=False)
    seconds = time.perf_counter() - t
    row_steps = max(r.tokens, 1)
    return {"samples_s": len(r.samples) / seconds, "tokens_s": r.tokens / seconds,
            "us_row_step": 1e6 * r.stats.check_seconds / row_steps,
            "mask_us_row_step": 1e6 * r.stats.mask_seconds / row_steps,
            "resampled": r.resampled, "first_try": None, "texts": [s.text for s in r.samples if s.written]}


def vllm_run(llm, checkpoint, rows, n, constrained, budget, work, seed=0, whole_draws=16):
    from logos.generate import GenerateOptions, Sampling
    from logos.generate.vllm_engine import generate_vllm

    texts, toks, secs, us = [], 0, 0.0, []
    resampled = first = 0
    for start in range(0, n, rows):  # rows requests in flight at a time
        k = min(rows, n - start)
        options = GenerateOptions(task="molecule", n=k, seed=seed + start, constrained=constrained,
                                  sampling=Sampling(max_new_tokens=budget), whole_draws=whole_draws)
        t = time.perf_counter()
        r = generate_vllm(checkpoint, work / f"v{rows}{int(constrained)}.smi", options, llm=llm)
        secs += time.perf_counter() - t
        toks += r.tokens
        resampled += r.resampled
        first += r.engine.first_try_valid
        if r.engine.counts.policy.row_steps:
            us.append(1e6 * r.engine.counts.seconds / r.engine.counts.policy.row_steps)
        texts += [s.text for s in r.samples if s.written]
    return {"samples_s": n / secs, "tokens_s": toks / secs, "us_row_step": statistics.mean(us) if us else 0.0,
            "mask_us_row_step": None, "resampled": resampled, "first_try": first, "texts": texts}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "100m"], choices=["tiny", "100m"])
    ap.add_argument("--rows", nargs="+", type=int, default=[16, 128])
    ap.add_argument("--n", type=int, default=128, help="molecules per configuration (at least the rows)")
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--no-write", action="store_true", help="print the table, leave BENCHMARKS.md alone")
    args = ap.parse_args(argv)

    import torch
    from scipy.stats import ks_2samp

    from generate_bench import random_checkpoint
    from logos.generate.vllm_engine import EngineOptions, close_llm, make_llm

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    work = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    lines = ["| model | rows | engine | constrained samples/s | unconstrained samples/s | ratio | constrained "
             "tokens/s | unconstrained tokens/s | constraint us/row/step | valid before resampling | resampled |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    props = []
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for model in args.models:
        ck = REPO / "checkpoints" / "logos-tiny" if model == "tiny" else random_checkpoint(work, 768, 14)
        t = time.perf_counter()
        llm = make_llm(ck, EngineOptions(max_num_seqs=max(args.rows)), seed=0, max_len=args.budget + 32)
        load = time.perf_counter() - t
        try:  # warm-up: imports, grammar compiles and vLLM's first batches are not part of the figures
            for constrained in (True, False):
                builtin_run(ck, 2, 2, constrained, 8, work, seed=99)
                vllm_run(llm, ck, 2, 2, constrained, 8, work, seed=99)
            for rows in args.rows:
                n = max(args.n, rows)
                res = {}
                whole = 16 if model == "tiny" else 0  # a random model almost never ends the record after a molecule
                for engine in ("builtin", "vllm"):
                    for constrained in (True, False):
                        if engine == "builtin":
                            res[engine, constrained] = builtin_run(ck, rows, n, constrained, args.budget, work,
                                                                   whole_draws=whole)
                        else:
                            res[engine, constrained] = vllm_run(llm, ck, rows, n, constrained, args.budget, work,
                                                                whole_draws=whole)
                for engine in ("builtin", "vllm"):
                    c, u = res[engine, True], res[engine, False]
                    us = f"{c['us_row_step']:,.0f}"
                    if c["mask_us_row_step"] is not None:
                        us += f" (+ masks {c['mask_us_row_step']:,.0f})"
                    valid = f"{c['first_try']}/{n}" if c["first_try"] is not None else "-"
                    lines.append(f"| {model} | {rows} | {engine} | {c['samples_s']:.2f} | {u['samples_s']:.2f} | "
                                 f"{c['samples_s'] / u['samples_s']:.2f}x | {c['tokens_s']:,.0f} | "
                                 f"{u['tokens_s']:,.0f} | {us} | {valid} | {c['resampled']} |")
                    print(lines[-1], flush=True)
                if model == "tiny":
                    pb, pv = _properties(res["builtin", True]["texts"]), _properties(res["vllm", True]["texts"])
                    for key in pb:
                        if pb[key] and pv[key]:
                            props.append(f"| {rows} | {key} | {statistics.mean(pb[key]):.2f} | "
                                         f"{statistics.mean(pv[key]):.2f} | {ks_2samp(pb[key], pv[key]).statistic:.2f}"
                                         f" |")
        finally:
            close_llm(llm)
        lines.append(f"| {model} | | vllm load | {load:.0f} s | | | | | | | |")
    section = [BEGIN, "", f"Measured {started} on 2 CPU cores (one thread per engine), molecules, budget "
               f"{args.budget} tokens, {args.n} molecules per configuration, seed 0:", "", "```",
               "OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind .venv-vllm/bin/python benchmarks/vllm_bench.py "
               + " ".join(argv if argv is not None else sys.argv[1:]), "```", ""] + lines
    section += ["", "ratio: constrained / unconstrained samples/s of the same engine. constraint us/row/step: "
                "built-in, the chemistry checks per row and step (the time it waits for its grammar masks, which "
                "are computed during the forward pass, in parentheses); vLLM, the LOGOS logits processor (draws "
                "and chemistry checks, timed in vLLM's worker; vLLM's own grammar masks are not separated). Valid "
                "before resampling: finished vLLM samples that passed the front end's check on the first try. Both "
                "engines run the same row-constraint code. Molecules of the tiny model are whole records (a "
                "finished molecule is kept with the model's probability of the end of document after it, up to 16 "
                "draws); the random ~100M model keeps its first finished molecule (`whole_draws=0`): it almost "
                "never ends a record, so every sample would take all 16 draws. Its unconstrained rows rarely close a "
                "span and run to the budget, while constrained rows end by their planned endings: a ratio above 1 "
                "there says that, not that the constraint is free (its cost is the microseconds column)."]
    if props:
        section += ["", "Constrained molecules of the tiny model, built-in against vLLM (written molecules):", "",
                    "| rows | property | built-in mean | vLLM mean | KS statistic |",
                    "|---:|---|---:|---:|---:|"] + props
    section += ["", END]
    text = "\n".join(section)
    print(text)
    if not args.no_write:
        from sections import write_section

        write_section(text, BEGIN, END, "## Built-in engine against vLLM (CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
