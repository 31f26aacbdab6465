"""The model half of ``make demo``: every ``logos generate`` task on one checkpoint, each step's metrics, one HTML page.

Steps (inputs from ``tests/assets/``, written to ``OUT/inputs/``): molecules (unconditional); retrosynthesis
and forward prediction on USPTO-50k validation reactions (the recorded answers are the reference);
proteins; antibodies; binding-site search on a PDB complex (its ligand's pocket is the reference);
ligands for the predicted pocket; crystals (unconditional, and structure prediction from the
reduced formulas of Perov-5 validation structures, which are the reference: the model chooses each cell's
number of formula units and its space group); MOFs. Each step runs
through the Python API (``logos.generate.generate``: one process, the model loaded per step),
writes ``OUT/generated/STEP.*``, is scored by ``logos.evaluate`` into ``OUT/eval/NAME/`` and
shown on ``OUT/index.html`` (:mod:`logos.report.page`). A summary table ends the run.

``--samples N`` / ``--inputs K`` shrink every step (a quick check: ``--samples 1 --inputs 1``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ASSETS = ROOT / "tests" / "assets"


@dataclass
class Plan:
    name: str
    task: str
    title: str
    output: str  # under generated/
    n: int
    input: str | None = None  # under inputs/ (or a path relative to the repository)
    reference: str | None = None
    temperature: float | None = None  # None: the task's


def plans(samples: int | None, k: int, pocket_structure: Path) -> list[Plan]:
    def n(default: int) -> int:
        return samples if samples is not None else default

    return [
        Plan("molecule", "molecule", "Molecules, unconditional", "molecule.smi", n(100), temperature=0.8),
        Plan("retro", "retro", f"Retrosynthesis of {k} USPTO-50k products", "retro.rsmi", n(10), "inputs/products.smi",
             "inputs/reactions.rsmi"),
        Plan("forward", "forward", f"Forward prediction for {k} USPTO-50k reactant sets", "forward.rsmi", n(5),
             "inputs/reactants.smi", "inputs/reactions.rsmi"),
        Plan("protein", "protein", "Proteins, unconditional", "protein.fasta", n(8)),
        Plan("antibody", "antibody", "Antibody chains, unconditional", "antibody.fasta", n(4)),
        Plan("pocket", "pocket", f"Binding-site search on {pocket_structure.name}", "pocket.pocket.csv", n(4),
             f"inputs/{pocket_structure.name}", f"inputs/{pocket_structure.name}"),
        Plan("ligand", "ligand", "Ligands for the rank-1 predicted pocket", "ligand.sdf", n(8),
             "inputs/pocket_rank1.jsonl", f"inputs/{pocket_structure.name}"),
        Plan("crystal", "crystal", "Crystals, unconditional", "crystal.cif", n(16), None, "inputs/crystal_reference"),
        Plan("csp", "crystal", f"Crystal structure prediction from {k} Perov-5 formulas (reduced: the model chooses "
             "the cell)", "csp.cif", n(10), "inputs/formulas.txt", "inputs/perov5_val.csv"),
        Plan("mof", "mof", "Metal–organic frameworks, unconditional", "mof.json", n(8)),
    ]


def write_inputs(out: Path, k: int, pocket_structure: Path) -> None:
    """The conditional tasks' inputs (and their references) from tests/assets, canonical and without atom maps."""
    from logos.science.chemistry import canonical_set

    inputs = out / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(ASSETS / "reactions" / "uspto50k_val_120.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            reactants, _, product = row["reactants>reagents>production"].split(">")
            r, p = canonical_set(reactants), canonical_set(product)
            if r and p and "." not in p:
                rows.append((r, p, f"{row['id']}_c{row['class']}"))
            if len(rows) == k:
                break
    (inputs / "reactions.rsmi").write_text("".join(f"{r}>>{p} {i}\n" for r, p, i in rows))
    (inputs / "products.smi").write_text("".join(f"{p} {i}\n" for r, p, i in rows))
    (inputs / "reactants.smi").write_text("".join(f"{r} {i}\n" for r, p, i in rows))
    shutil.copy(pocket_structure, inputs / pocket_structure.name)
    ligand = pocket_structure.with_name(pocket_structure.name.split("_protein")[0] + "_ligand.sdf")
    if ligand.exists():
        shutil.copy(ligand, inputs / ligand.name)  # the reference pocket: residues within 5 A of this ligand
    with open(ASSETS / "crystal" / "perov5_val_4.csv", newline="") as fh:
        perov = list(csv.DictReader(fh))[:k]
    with open(inputs / "perov5_val.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(perov[0]))
        writer.writeheader()
        writer.writerows(perov)
    # reduced formulas (CuCdN3), no space group: the model chooses the number of formula units and the group
    (inputs / "formulas.txt").write_text("formula group id\n" + "".join(f"{r['formula']} - {r['material_id']}\n"
                                                                        for r in perov))
    ref = inputs / "crystal_reference"
    ref.mkdir(exist_ok=True)
    for cif in sorted((ASSETS / "crystal").glob("mp_dielectric_*.cif")):
        shutil.copy(cif, ref / cif.name)


def evaluate_step(out: Path, plan: Plan, step) -> None:
    """The step's metrics through logos.evaluate (the same code as ``logos evaluate``), into ``out/eval/NAME/``."""
    import logos.evaluate as ev
    from logos.evaluate import proteins
    from logos.evaluate.report import Report, write_report

    gen = out / "generated" / plan.output
    samples = out / step.samples
    ref = out / plan.reference if plan.reference else None
    jobs: list[tuple[str, str, Path, Path | None]] = {  # (name, evaluate task, predictions, reference)
        "molecule": [("molecule", "molecule", gen, ASSETS / "moses_500.smi")],
        "retro": [("retro", "retro", samples, ref)],
        "forward": [("forward", "forward", samples, ref)],
        "pocket": [("pocket", "pocket", gen, ref)],
        "ligand": [("ligand", "ligand", gen, ref)],
        "crystal": [("crystal", "crystal", samples, ref)],
        "csp": [("csp", "csp", samples, ref), ("csp validity", "crystal", samples, None)],
        "mof": [("mof", "mof", samples, None)],
    }.get(plan.name, [])
    for name, task, predictions, reference in jobs:
        folder = out / "eval" / name.replace(" ", "_")
        if reference is None and task == "crystal":  # the folder's own validity, no reference set
            from logos.evaluate import crystals

            doc = write_report(Report("crystal", crystals.SCHEMA_VERSION,
                                      crystals.evaluate(crystals.read_items(samples)), crystals.DEFINITIONS), folder)
        else:
            doc = ev.run(task, predictions, folder, references=reference, options=_options(task))
        step.metrics[name] = doc["metrics"]
        step.reports[name] = f"eval/{folder.name}/report.md"
        step.scored[name] = predictions.relative_to(out).as_posix()
    if plan.task in ("protein", "antibody"):  # no reference set: the sequences' own statistics
        folder = out / "eval" / plan.name
        doc = write_report(Report(plan.name, proteins.SCHEMA_VERSION, proteins.evaluate(proteins.read_sequences(gen)),
                                  proteins.DEFINITIONS), folder)
        step.metrics[plan.name] = doc["metrics"]
        step.reports[plan.name] = f"eval/{plan.name}/report.md"


def _options(task: str):
    """Evaluation options: crystals are also relaxed with the CHGNet potential when it is installed (logos[stability],
    part of [dev]), on a small budget (DEMO_RELAX_STEPS, DEMO_RELAX_SECONDS per structure; DEMO_RELAX_STEPS=0: off)."""
    import importlib.util

    from logos.evaluate import EvaluateOptions
    from logos.evaluate.stability import RelaxOptions

    steps = int(os.environ.get("DEMO_RELAX_STEPS", "100"))
    if task not in ("crystal", "csp") or steps <= 0 or importlib.util.find_spec("chgnet") is None:
        return EvaluateOptions()
    relax = RelaxOptions(steps=steps, seconds=float(os.environ.get("DEMO_RELAX_SECONDS", "20")))
    return EvaluateOptions(stability=True, relax=relax, workers=2)


def valid_share(plan: Plan, step) -> float | None:
    """The step's share of valid samples by its field's own check (None where the task has no such check)."""
    m = step.metrics
    if plan.name in ("molecule", "ligand", "crystal"):
        return m.get(plan.name, {}).get("validity")
    if plan.name == "csp":
        return m.get("csp validity", {}).get("validity")
    if plan.name == "mof":
        return m.get("mof", {}).get("valid")
    if plan.name in ("retro", "forward"):
        bad = m.get(plan.name, {}).get("invalid_all")
        return None if bad is None else 1 - bad
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", default="checkpoints/logos-tiny")
    ap.add_argument("--out", default="demo_out")
    ap.add_argument("--samples", type=int, default=None, help="samples per step (default: each step's own)")
    ap.add_argument("--inputs", type=int, default=4, help="inputs per conditional task (reactions, formulas)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)

    from transformers.utils import logging as hf_logging

    from logos.report.page import Step, write_page
    from logos.generate import GenerateOptions, Sampling, generate

    hf_logging.disable_progress_bar()  # transformers' "Loading weights" bar, once per step: noise here

    t_start = time.perf_counter()
    out = Path(args.out)
    checkpoint = Path(args.checkpoint)
    if not (checkpoint / "config.json").exists():
        print(f"demo: {checkpoint} is not a checkpoint directory", file=sys.stderr)
        return 2
    for sub in ("generated", "eval"):
        shutil.rmtree(out / sub, ignore_errors=True)
    pocket_structure = ASSETS / "protein" / "1s3v_protein.pdb"
    write_inputs(out, args.inputs, pocket_structure)
    steps_plan = plans(args.samples, args.inputs, pocket_structure)
    steps: list[Step] = []
    for i, plan in enumerate(steps_plan, 1):
        output = out / "generated" / plan.output
        samples = output.with_name(output.name.split(".")[0] + ".samples.jsonl")
        step = Step(plan.name, plan.task, plan.title, f"generated/{plan.output}",
                    samples.relative_to(out).as_posix(), plan.input, plan.reference, asked=plan.n)
        steps.append(step)
        cmd = (f"logos generate --checkpoint {checkpoint} --task {plan.task} -n {plan.n}"
               + (f" --input {out / plan.input}" if plan.input else "") + f" -o {output}"
               + (f" --temperature {plan.temperature}" if plan.temperature is not None else ""))
        print(f"[{i}/{len(steps_plan)}] {plan.name}: {cmd}", flush=True)
        if plan.name == "ligand":  # the rank-1 answer of the pocket step, as the ligand prompt
            pocket = [json.loads(line) for line in (out / "generated" / "pocket.samples.jsonl").open()] \
                if (out / "generated" / "pocket.samples.jsonl").exists() else []
            (out / plan.input).write_text("".join(json.dumps({"id": r["id"], "text": r["text"].split("<Search>")[-1]})
                                                  + "\n" for r in pocket if r.get("rank") == 1 and r.get("written")))
        t0 = time.perf_counter()
        try:
            options = GenerateOptions(task=plan.task, n=plan.n, seed=args.seed,
                                      sampling=Sampling(temperature=plan.temperature))
            result = generate(checkpoint, output, options, inputs=out / plan.input if plan.input else None,
                              progress=False if args.quiet else True)
            step.generated, step.written = len(result.samples), result.written
        except Exception as e:  # one failed task is a row of the summary, not the end of the demo
            step.error = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        step.seconds = time.perf_counter() - t0
        if not step.error:
            try:
                evaluate_step(out, plan, step)
            except Exception as e:
                print(f"      metrics failed: {type(e).__name__}: {e}", file=sys.stderr)
        step.valid = valid_share(plan, step)
        headline = ", ".join(f"{k} {v:.3g}" for name, m in step.metrics.items() for k, v in list(m.items())[:4]
                             if isinstance(v, float))
        print(f"      {step.generated} samples, {step.written} written, {step.seconds:.1f} s"
              + (f"; {headline}" if headline else "") + (f"; FAILED: {step.error}" if step.error else ""), flush=True)

    print("[page] writing the report page", flush=True)
    t0 = time.perf_counter()
    page = write_page(out, steps, checkpoint, title="LOGOS demo",
                      subtitle=f"checkpoint {checkpoint.as_posix()} · every generation task · seed {args.seed}")
    print(f"      {page} ({page.stat().st_size / 1024:.0f} KiB, {time.perf_counter() - t0:.1f} s)")

    print()
    header = f"{'task':<10} {'samples':>8} {'written':>8} {'valid':>7} {'seconds':>8}"
    print(header)
    print("-" * len(header))
    for s in steps:
        valid = "-" if s.valid is None else f"{100 * s.valid:.0f}%"
        status = f"  FAILED: {s.error}" if s.error else ""
        print(f"{s.name:<10} {s.generated:>8} {s.written:>8} {valid:>7} {s.seconds:>8.1f}{status}")
    print(f"model steps took {time.perf_counter() - t_start:.0f} s; open {page} in a browser (no server needed)")
    return 1 if any(s.error for s in steps) else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
