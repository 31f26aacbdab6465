"""What the decoding constraints cost and whether every row ends: before and after, side by side in one run.

Per task and model, the same prompts are sampled constrained (grammar + row constraint: chemistry of
molecule spans, crystal composition, copied sequence) and unconstrained, and the run reports

- samples/s both ways and their ratio;
- the grammar mask in microseconds per step (all rows) and the row constraint in microseconds per
  row per step (mean over every row-step, and the worst step: the largest per-row mean of one step);
- rows resampled per row asked, rows that ended, and what was written (molecules: RDKit-valid;
  crystals: read by pymatgen and gemmi, spglib's group against the declared one, shortest distance).

Each measurement runs in its own process on a source tree: the working tree, and with
``--before REF`` also the tree of a git ref (exported to a temporary folder), so a change and what
it replaced are measured in the same run on the same machine. With ``--write`` the tables replace
the marked section of BENCHMARKS.md.

    PYTHONPATH=. .venv/bin/python benchmarks/constraint_bench.py --before main --write
    PYTHONPATH=. .venv/bin/python benchmarks/constraint_bench.py --models tiny,random --n 64
    PYTHONPATH=. .venv/bin/python benchmarks/constraint_bench.py --models 100m --n 32   # long
    PYTHONPATH=. .venv/bin/python benchmarks/constraint_bench.py --before main --rounds 4   # a busy machine: medians
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARK = "constraints"
GUIDE = ('Models: `tiny` the shipped model (checkpoints/logos-tiny, or `--tiny DIR`); `random` a randomly initialised tiny Llama (hidden 64, 2 layers) with the LOGOS tokenizer, whatever it writes must still end; `100m` a randomly initialised ~100M Llama (hidden 768, 12 layers). `before` is the tree of the git ref given, `after` the working tree; each runs as it installs: where the setup.py of a tree compiles modules (the decoding state machine), they are built in place first. Row constraint: chemistry (molecules), copied sequence (binding-site search), composition (crystals), timed around every call the sampler makes (in a tree with the row policy, `decoding/policy.py`: every decision of the row policies, their draws included), including the checks once a row has ended (RDKit parsing each molecule; pymatgen, gemmi and spglib reading each crystal back), which count in the mean and in no step; the grammar mask is timed separately. Worst step: the largest per-row mean of one step. Steps yielded: steps in which a row wrote nothing because its constraint had spent its work for the step, its own and what the other rows of the step left (it drew again in the next; not counted as row-steps); a step after one in which no row wrote a token needs no forward pass. Tokens taken back: a row at a dead end (nothing accepted, no planned ending) takes back its last token and draws again there. Resampled per row asked: rows that did not end validly and were drawn again (at most 4 times each).')

# model -> [(task, samples, budget, inputs)]: the shipped model writes molecules; random models test endings
PLANS = {
    "tiny": [("molecule", None, 64, None)],
    "100m": [("molecule", None, 64, None)],
    "random": [("molecule", None, 64, None), ("pocket", 2, 0, "fasta"), ("crystal", 8, 0, "composition")],
}


# ---------------------------------------------------------------- one measurement (child process)
def _random_checkpoint(work: Path, hidden: int, layers: int, intermediate: int, heads: int, kv: int) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = work / f"random-{hidden}x{layers}"
    if path.exists():
        return path
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=2432, hidden_size=hidden, intermediate_size=intermediate,
                                 num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                                 bos_token_id=1, eos_token_id=2, pad_token_id=3)).save_pretrained(path)
    for f in (REPO / "tokenizers" / "default").iterdir():
        shutil.copy2(f, path / f.name)
    return path


def checkpoint_for(model: str, work: Path, tiny: str | None = None) -> Path:
    if model == "tiny":
        return Path(tiny) if tiny else REPO / "checkpoints" / "logos-tiny"
    if model == "random":  # the tests' randomly initialised tiny Llama
        return _random_checkpoint(work, 64, 2, 128, 4, 2)
    return _random_checkpoint(work, 768, 12, 3072, 12, 12)  # ~100M with the LOGOS vocabulary


def _inputs(kind: str | None, work: Path) -> Path | None:
    if kind == "fasta":
        path = work / "search.fasta"
        path.write_text(">p1\nMKTAYIAKQRQISFVKSHFSRQ\n")
        return path
    if kind == "composition":
        path = work / "compositions.txt"
        path.write_text("Cl4Na4 225\nO3SrTi 221\nC8 -\nO6Ti2 -\n")
        return path
    return None


class Timer:
    """Time spent in the row constraint's methods, per (step, row); a step starts at each grammar mask."""

    def __init__(self):
        self.step = -1
        self.cells: dict[tuple[int, int], float] = {}

    def wrap(self, cls, names, boundary: bool = False):
        for name in names:
            fn = getattr(cls, name, None)
            if fn is None:
                continue

            def timed(obj, *args, _fn=fn, **kw):
                if boundary:
                    self.step += 1
                    return _fn(obj, *args, **kw)
                t = time.perf_counter()
                try:
                    return _fn(obj, *args, **kw)
                finally:
                    row = args[0] if args and isinstance(args[0], int) else -1
                    key = (self.step, row)
                    self.cells[key] = self.cells.get(key, 0.0) + time.perf_counter() - t
            setattr(cls, name, timed)


def _crystal_checks(cif_dir: Path) -> dict:
    """Written CIFs: read by pymatgen and gemmi, spglib's group (symprec 0.01) against the declared one, and
    the shortest interatomic distance."""
    import re
    import warnings

    import gemmi
    from pymatgen.core import Structure
    from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

    out = {"cifs": 0, "pymatgen": 0, "gemmi": 0, "group_same": 0, "supergroup": 0, "group_other": 0, "too_close": 0}
    for path in sorted(cif_dir.glob("*.cif")) if cif_dir.is_dir() else []:
        out["cifs"] += 1
        text = path.read_text()
        declared = re.search(r"_symmetry_Int_Tables_number\s+(\d+)|_space_group_IT_number\s+(\d+)", text)
        declared = int(next(g for g in declared.groups() if g)) if declared else None
        try:
            doc = gemmi.cif.read(str(path))
            small = gemmi.make_small_structure_from_block(doc.sole_block())
            out["gemmi"] += len(small.get_all_unit_cell_sites()) > 0
        except Exception:  # noqa: BLE001 - any failure is a reader refusing the file
            pass
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                s = Structure.from_file(str(path))
        except Exception:  # noqa: BLE001
            continue
        out["pymatgen"] += 1
        if len(s) > 1:
            import numpy as np
            d = s.distance_matrix + np.eye(len(s)) * 1e9
            out["too_close"] += float(d.min()) < 0.5
        try:
            found = SpacegroupAnalyzer(s, symprec=0.01).get_space_group_number()
        except Exception:  # noqa: BLE001
            found = None
        if found == declared:
            out["group_same"] += 1
        elif declared and _declared_ops_hold(path, s):
            out["supergroup"] += 1
        else:
            out["group_other"] += 1
    return out


def _declared_ops_hold(path: Path, s) -> bool:
    """Whether every symmetry operation the CIF declares maps the cell's atoms onto atoms of the same species: the
    group spglib finds is then a supergroup of the declared one."""
    import gemmi
    import numpy as np

    block = gemmi.cif.read(str(path)).sole_block()
    ops = list(block.find_values("_space_group_symop_operation_xyz")) or \
        list(block.find_values("_symmetry_equiv_pos_as_xyz"))
    frac = s.frac_coords % 1.0
    kinds = np.array([hash(site.species_string) for site in s])
    for text in ops:
        op = gemmi.Op(gemmi.cif.as_string(text))
        moved = np.array([op.apply_to_xyz(list(map(float, f))) for f in frac])
        delta = moved[:, None, :] - frac[None, :, :]
        delta -= np.round(delta)
        dist = np.linalg.norm(delta @ s.lattice.matrix, axis=-1)
        dist[kinds[:, None] != kinds[None, :]] = np.inf
        if not (dist.min(axis=1) <= 0.05).all():
            return False
    return bool(ops)


def measure(spec: dict) -> dict:
    """One constrained or unconstrained run of ``spec`` in this process (the tree on PYTHONPATH)."""
    import torch

    torch.set_num_threads(1)
    from logos.generate import GenerateOptions, Sampling, generate
    from logos.decoding import constraints as C
    work = Path(spec["work"])
    import networkx  # noqa: F401 - imports and RDKit's periodic table outside the timed calls
    from rdkit import Chem
    Chem.MolFromSmiles("c1ccccc1O")
    timer = Timer()
    from logos.decoding.sampler import StepStats
    if spec["constrained"] and not hasattr(StepStats(), "worst_step_row_seconds"):  # a tree whose sampler does not
        timer.wrap(C.GrammarRows, ["mask"], boundary=True)                          # time its row constraints
        rows = [C.ChemistryRows]
        try:
            from logos.decoding.composition import CompositionRows
            rows.append(CompositionRows)
        except ImportError:
            pass
        for extra in ("RowConstraints",):  # the shared row-constraint front (if the tree has one)
            if hasattr(C, extra):
                rows = [getattr(C, extra)]
        for cls in rows:
            timer.wrap(cls, ["check", "advance", "closing", "stuck", "allowed", "prepare"])
    suffix = {"molecule": ".smi", "pocket": ".fasta", "crystal": ".cif"}[spec["task"]]
    out = work / (f"{spec['tree_name']}_{spec['model']}_{spec['task']}_{int(spec['constrained'])}_seed{spec['seed']}"
                  f"{suffix}")  # (a round of its own: a crystal's CIF folder holds only its round's)
    import dataclasses
    extra = {}
    row_work = {}
    if spec.get("row_work") and "row_work" in {f.name for f in dataclasses.fields(Sampling)}:
        row_work["row_work"] = spec["row_work"]
    if spec.get("whole_draws") is not None and "whole_draws" in {f.name for f in dataclasses.fields(GenerateOptions)}:
        extra["whole_draws"] = spec["whole_draws"]  # (a tree without the option keeps its own behaviour)
    if spec["inputs"] == "composition" and "prompts" in {f.name for f in dataclasses.fields(GenerateOptions)}:
        from logos.tasks.prompts import PromptOptions  # the inputs are cell compositions (a tree without the option
        extra["prompts"] = PromptOptions(cell_composition=True)  # reads every formula so)
    options = GenerateOptions(task=spec["task"], n=spec["n"], batch_size=16, seed=spec["seed"],
                              constrained=spec["constrained"], resamples=spec["resamples"],
                              sampling=Sampling(max_new_tokens=spec["budget"], **row_work), **extra)
    warm = GenerateOptions(task=spec["task"], n=1, batch_size=1, seed=spec["seed"] + 1, resamples=0,
                           constrained=spec["constrained"], sampling=Sampling(max_new_tokens=4),
                           **{k: v for k, v in extra.items() if k == "prompts"})
    generate(Path(spec["checkpoint"]), work / f"warm{suffix}", warm, inputs=_inputs(spec["inputs"], work),
             progress=False)  # grammar compile, imports: not part of the figures
    timer.cells.clear()
    timer.step = -1
    start = time.perf_counter()
    result = generate(Path(spec["checkpoint"]), out, options, inputs=_inputs(spec["inputs"], work), progress=False)
    seconds = time.perf_counter() - start
    stats = result.stats
    per_step: dict[int, list[float]] = {}
    for (step, _row), t in timer.cells.items():
        per_step.setdefault(step, []).append(t)
    row_steps = getattr(stats, "row_steps", 0) or result.tokens
    constraint = sum(timer.cells.values())
    own = hasattr(stats, "worst_step_row_seconds")  # the sampler times its row constraints itself
    res = {"samples_s": len(result.samples) / seconds, "seconds": seconds, "samples": len(result.samples),
           "done": sum(s.status == "done" for s in result.samples), "written": result.written,
           "resampled": result.resampled, "redraws": result.redraws, "tokens": result.tokens,
           "steps": stats.steps, "row_steps": row_steps, "yields": getattr(stats, "yields", 0),
           "idle_steps": getattr(stats, "idle_steps", 0), "undos": getattr(stats, "undos", 0),
           "mask_us_step": 1e6 * stats.mask_seconds / max(stats.steps, 1),
           "constraint_us_row_step": 1e6 * (stats.check_seconds if own else constraint) / max(row_steps, 1),
           "worst_step_us_row": 1e6 * (stats.worst_step_row_seconds if own else
                                       max((sum(v) / len(v) for v in per_step.values()), default=0.0)),
           "statuses": {}}
    for s in result.samples:
        res["statuses"][s.status] = res["statuses"].get(s.status, 0) + 1
    if spec["task"] == "molecule":
        from rdkit import Chem, rdBase
        from logos.science.chemistry import molecules_in_text

        valid = 0
        with rdBase.BlockLogs():
            for s in result.samples:
                if s.written:
                    mols = molecules_in_text(s.text)
                    valid += bool(mols) and Chem.MolFromSmiles(mols[0]) is not None
        res["rdkit_valid"] = valid
    if spec["task"] == "crystal":
        res["crystal"] = _crystal_checks(out.with_suffix(""))
    if spec["task"] == "pocket":
        import re
        want = "MKTAYIAKQRQISFVKSHFSRQ"
        res["copied"] = sum(s.status == "done" and re.sub(r"<[^>]+>", "", s.text.split("<Search>")[1]) == want
                            for s in result.samples)
    return res


# ---------------------------------------------------------------- orchestration
def _export(ref: str, work: Path) -> Path:
    tree = work / f"tree-{ref.replace('/', '_')}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return _built(tree)


def _built(tree: Path) -> Path:
    """``tree`` with its compiled modules built in place where its setup.py builds any (as its install would)."""
    if "build_ext" in (tree / "setup.py").read_text():
        subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree, check=True,
                       capture_output=True)
    return tree


def _child(tree: Path, spec: dict, timeout: float) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--measure", json.dumps(spec)]
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=str(tree))
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout:.0f} s"}
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(p.stdout.strip().splitlines()[-1])


SUMMED = ("samples", "done", "written", "resampled", "redraws", "tokens", "steps", "row_steps", "yields", "idle_steps",
          "undos", "rdkit_valid", "copied")


def _merged(runs: list[dict]) -> dict:
    """The rounds of one measurement as one: the counts summed, the rates (samples/s, microseconds) their medians."""
    import statistics

    if len(runs) == 1 or any("error" in r for r in runs):
        return next((r for r in runs if "error" in r), runs[0])
    out = {}
    for key, value in runs[0].items():
        values = [r[key] for r in runs]
        if key in SUMMED:
            out[key] = sum(values)
        elif key == "crystal":
            out[key] = {k: sum(v[k] for v in values) for k in value}
        elif isinstance(value, (int, float)):
            out[key] = statistics.median(values)
    return out


def _fmt(r: dict, key: str, digits: int = 1) -> str:
    return "-" if "error" in r or key not in r else f"{r[key]:,.{digits}f}"


def _row(tree: str, model: str, task: str, c: dict, u: dict) -> str:
    if "error" in c:
        return f"| {tree} | {model} | {task} | {c['error']} | | | | | | |"
    ratio = f" ({c['samples_s'] / u['samples_s']:.2f}x)" if "samples_s" in u else ""
    ended = f"{c['done']}/{c['samples']}"
    extra = []
    if c.get("yields"):
        extra.append(f"{c['yields']:,} steps yielded" + (f" ({c['idle_steps']:,} steps without a forward pass)"
                                                          if c.get("idle_steps") else ""))
    if c.get("undos"):
        extra.append(f"{c['undos']:,} tokens taken back")
    if "rdkit_valid" in c:
        extra.append(f"RDKit-valid {c['rdkit_valid']}/{c['written']}")
    if "copied" in c:
        extra.append(f"copied {c['copied']}/{c['samples']}")
    if "crystal" in c:
        k = c["crystal"]
        extra.append(f"CIFs {k['cifs']}: pymatgen {k['pymatgen']}, gemmi {k['gemmi']}; spglib: declared group "
                     f"{k['group_same']}, a supergroup {k['supergroup']}, other {k['group_other']}; atoms < 0.5 Å apart "
                     f"in {k['too_close']}")
    return (f"| {tree} | {model} | {task} | {c['samples_s']:.2f} / {_fmt(u, 'samples_s', 2)}{ratio} | "
            f"{c['mask_us_step']:,.0f} | {c['constraint_us_row_step']:,.0f} | {c['worst_step_us_row']:,.0f} | "
            f"{ended} | {c['resampled'] / max(c['samples'], 1):.2f} | {'; '.join(extra)} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--before", help="also measure this git ref's tree (e.g. main)")
    ap.add_argument("--models", default="tiny,random", help="tiny (shipped), random (random tiny), 100m (random ~100M)")
    ap.add_argument("--n", type=int, default=128, help="molecule samples per run, shipped model")
    ap.add_argument("--tiny", help="the shipped model's checkpoint (default checkpoints/logos-tiny)")
    ap.add_argument("--n-random", type=int, default=64, help="molecule samples per run, random tiny model")
    ap.add_argument("--n-100m", type=int, default=16, help="molecule samples per run, random ~100M model")
    ap.add_argument("--tasks", default="molecule,pocket,crystal", help="tasks to measure (of each model's plan)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resamples", type=int, default=4)
    ap.add_argument("--whole-draws", type=int, help="molecule redraws when the model would not end the record "
                                                    "(default: the tree's; 0 keeps the first finished molecule)")
    ap.add_argument("--row-work", type=int, default=0, help="constraint work units per row and step before a row "
                    "yields (0: each tree's default)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds per task, the trees alternating within each (round r "
                    "samples with seed + r): medians of the rates, sums of the counts")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per measurement")
    ap.add_argument("--write", action="store_true", help="rewrite the marked section of BENCHMARKS.md")
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(json.loads(args.measure))))
        return
    work = Path(tempfile.mkdtemp(prefix="constraint_bench_"))
    trees = [("after", _built(REPO))] + ([(f"before ({args.before})", _export(args.before, work))] if args.before else [])
    started = time.time()
    print(f"load average: {os.getloadavg()}", file=sys.stderr)
    header = ("| tree | model | task | samples/s constrained / unconstrained | grammar mask µs/step | "
              "row constraint µs/row/step | worst step µs/row | rows ended | resampled per row asked | written |\n"
              "|---|---|---|---:|---:|---:|---:|---|---:|---|")
    lines = [header]
    print(header, flush=True)
    for model in args.models.split(","):
        checkpoint = None
        for task, n, budget, inputs in PLANS[model]:
            if task not in args.tasks.split(","):
                continue
            runs: dict[str, dict[bool, list[dict]]] = {name: {True: [], False: []} for name, _ in trees}
            for r in range(args.rounds):
                for tree_name, tree in trees:
                    for constrained in (True, False):
                        if checkpoint is None:
                            checkpoint = str(checkpoint_for(model, work, args.tiny))
                        per_model = {"tiny": args.n, "random": args.n_random, "100m": args.n_100m}[model]
                        spec = {"task": task, "n": n or per_model, "budget": budget, "inputs": inputs, "model": model,
                                "checkpoint": checkpoint, "constrained": constrained, "seed": args.seed + r,
                                "resamples": args.resamples, "work": str(work), "tree_name": tree_name.split()[0],
                                "whole_draws": args.whole_draws, "row_work": args.row_work}
                        if task != "molecule" and not constrained:
                            runs[tree_name][False].append({"error": "not measured"})
                            continue
                        runs[tree_name][constrained].append(_child(tree, spec, args.timeout))
                        print("  " + json.dumps(runs[tree_name][constrained][-1]), file=sys.stderr, flush=True)
            for tree_name, _ in trees:
                line = _row(tree_name, model, task, _merged(runs[tree_name][True]), _merged(runs[tree_name][False]))
                lines.append(line)
                print(line, flush=True)
    if args.write:
        cmd = "PYTHONPATH=. .venv/bin/python benchmarks/constraint_bench.py " + " ".join(
            a for a in sys.argv[1:] if a != "--write") + " --write"
        body = (f"<!-- {MARK} -->\n### Decoding constraints: cost per row per step, rows that end\n\n"
                f"Written by `benchmarks/constraint_bench.py` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
                f" ({time.time() - started:.0f} s); batch 16, one torch thread, temperature 1; every measurement in"
                f" its own process after a one-sample warm-up (grammar compile, imports)"
                + (f"; {args.rounds} rounds, the trees alternating within each (round r: seed {args.seed} + r): "
                   "samples/s and microseconds are the medians of the rounds, the counts their sums"
                   if args.rounds > 1 else "") + f".\n\n```\n{cmd}\n```\n\n"
                + GUIDE + "\n\n" + "\n".join(lines) +
                f"\n<!-- /{MARK} -->")
        path = REPO / "BENCHMARKS.md"
        text = path.read_text()
        start, end = f"<!-- {MARK} -->", f"<!-- /{MARK} -->"
        if start in text and end in text:
            text = text[: text.index(start)] + body + text[text.index(end) + len(end):]
        else:
            text = text.rstrip("\n") + "\n\n" + body + "\n"
        path.write_text(text)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
