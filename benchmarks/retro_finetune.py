"""USPTO-50k retrosynthesis finetune: learning curves by CPU-minutes, test top-k, decoding choices; BENCHMARKS.md.

Reads finetune runs made with ``finetune/retro.yaml`` (one per arm, e.g. from ``checkpoints/logos-tiny`` and
from a random model of the same shape and tokenizer, ``benchmarks/scratch_init.py``), and:

1. draws validation top-1 (``task_metrics.csv``, scored by the trainer) and training loss against the CPU
   minutes the run had spent at that step (``metrics.csv``'s ``cpu_s``): ``benchmarks/figures/retro_finetune.png``;
2. scores each run's ``best/`` (selected by validation top-1) on the test split with the user's commands'
   code: ``logos generate --task retro -n SAMPLES`` on the test products (ids = row numbers), then
   ``logos evaluate --task retro`` (top-1/3/5/10 with Wilson 95% intervals, invalid rate); the report lands in
   ``RUN/test_stepSTEP_ITEMS/`` (STEP: the training step of ``best/``) and is reused on a rerun with the same
   checkpoint and settings unless ``--rescore``; the table lists every such report of a run, so a run that
   trained on keeps the scores of its earlier best; ``--last`` also scores the run's last export (``hf/``) where
   it is not ``best/`` (a selection by 200 products moves one product at a time);
3. with ``--decoding N``: on N seeded validation products and the first run's ``best/``, sampling ``-n 10``
   at temperature 1 and 0.7 (retro's default), each also sampling 20 and keeping the 10 most likely distinct
   answers, timed side by side;
4. rewrites its section of BENCHMARKS.md (``--no-write``: print it only).

    PYTHONPATH=. python benchmarks/retro_finetune.py --run pretrained=runs/retro-pretrained \\
        --run scratch=runs/retro-scratch --test raw_test.csv.xz --valid raw_valid.csv.xz --decoding 200
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIGURE = REPO / "benchmarks" / "figures" / "retro_finetune.png"
BEGIN, END = "<!-- retro finetune -->", "<!-- /retro finetune -->"
KS = (1, 3, 5, 10)


def curve(run: Path) -> list[dict]:
    """Per scored step: step, CPU minutes, validation top-1, training loss at that step, and the step the trainer
    had kept as best/ by then."""
    train = {int(r["step"]): r for r in csv.DictReader(open(run / "metrics.csv")) if r.get("loss")}
    out = []
    for r in csv.DictReader(open(run / "task_metrics.csv")):
        step = int(r["step"])
        near = train.get(step) or train[max(s for s in train if s <= step)]
        out.append({"step": step, "cpu_min": float(near["cpu_s"]) / 60, "top1": float(r["value"]),
                    "loss": float(near["loss"]), "items": int(r["items"]), "best_step": int(r["best_step"])})
    return out


def losses(run: Path) -> list[tuple[float, float]]:
    return [(float(r["cpu_s"]) / 60, float(r["loss"])) for r in csv.DictReader(open(run / "metrics.csv")) if r.get("loss")]


def plot(runs: dict[str, Path], curves: dict[str, list[dict]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for name, run in runs.items():
        c = curves[name]
        a.plot([p["cpu_min"] for p in c], [100 * p["top1"] for p in c], "o-", label=name)
        x, y = zip(*losses(run))
        b.plot(x, y, label=name)
    a.set(xlabel="CPU minutes of finetuning", ylabel="top-1 (%)", title="USPTO-50k validation top-1 (held-out products)")
    b.set(xlabel="CPU minutes of finetuning", ylabel="training loss", title="training loss", yscale="log")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    FIGURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(FIGURE, dpi=110)


def subset(reference: Path, work: Path, items: int, seed: int) -> tuple[Path, Path, int]:
    """(reference CSV, products file, n): a seeded subset of the reference's rows when 0 < items < all, written
    as a CSV of its own so its row numbers are the ids, and its products one per line with that id."""
    from logos.evaluate.reactions import read_reference
    from logos.evaluate.reference import open_any

    if items:
        with open_any(reference) as fh:
            header, *rows = list(csv.reader(fh))
        if items < len(rows):
            keep = sorted(random.Random(seed).sample(range(len(rows)), items))
            reference = work / "reference.csv"
            with open(reference, "w", newline="") as fh:
                csv.writer(fh).writerows([header] + [rows[i] for i in keep])
    reactions = read_reference(reference)
    products = work / "products.smi"
    products.write_text("".join(f"{r.product} {r.id}\n" for r in reactions))
    return reference, products, len(reactions)


def checkpoint_step(checkpoint: Path) -> int:
    """The training step a checkpoint was exported at."""
    return int(json.loads((checkpoint / "logos_run.json").read_text())["step"])


def logos(*args, ok: tuple[int, ...] = (0,)) -> None:
    code = subprocess.run([sys.executable, "-m", "logos.cli", *map(str, args)], cwd=REPO).returncode
    if code not in ok:
        raise SystemExit(f"retro_finetune: logos {args[0]} exited with status {code}")


def score(checkpoint: Path, reference: Path, work: Path, samples: int, items: int, seed: int,
          temperature: float = 1.0, keep: int = 0, rescore: bool = False) -> dict:
    """Generate answers for the reference's products and score them; a report made with the same settings is
    reused unless ``rescore``."""
    report = work / "metrics.json"
    step = checkpoint_step(checkpoint)
    if report.exists() and not rescore:
        done = json.loads(report.read_text())
        asked = {"samples": samples, "temperature": temperature, "keep": keep, "asked_items": items, "step": step}
        if all(done.get(k) == v for k, v in asked.items()):
            return done
    work.mkdir(parents=True, exist_ok=True)
    reference, products, n = subset(reference, work, items, seed)
    t = time.perf_counter()
    logos("generate", "--checkpoint", checkpoint, "--task", "retro", "--input", products,
          "-n", samples, "--batch-size", 64, "--seed", seed, "--temperature", temperature, "-o", work / "routes.rsmi",
          ok=(0, 1))  # 1: some samples failed their checks (logged), the others are written
    seconds = time.perf_counter() - t
    predictions = work / "routes.samples.jsonl"
    if keep:  # the `keep` most likely distinct answers of each product (the file is ranked per input)
        lines = [json.loads(line) for line in open(predictions)]
        predictions = work / f"routes.top{keep}.jsonl"
        predictions.write_text("".join(json.dumps(r) + "\n" for r in lines if int(r["rank"]) <= keep))
    logos("evaluate", "--task", "retro", "--predictions", predictions, "--references", reference,
          "-o", work / "report")
    doc = json.loads((work / "report" / "metrics.json").read_text())
    m = doc["metrics"]
    ci = {r["metric"]: (r["low"], r["high"]) for r in doc["tables"]["95% intervals (Wilson)"]}
    out = {"checkpoint": str(checkpoint), "step": step, "items": n, "asked_items": items, "samples": samples, "temperature": temperature,
           "keep": keep,
           "seconds": round(seconds, 1), "invalid@1": m["invalid@1"], "answered": m["answered"],
           **{f"top-{k}": m[f"top-{k}"] for k in KS}, "ci95": ci}
    report.write_text(json.dumps(out, indent=1))
    return out


def pct(v: float) -> str:
    return f"{100 * v:.1f}"


def test_reports(run: Path, samples: int, temperature: float) -> list[dict]:
    """The run's test reports at these sampling settings, one per scored checkpoint and item count, by step."""
    found = [json.loads(p.read_text()) for p in run.glob("test_step*/metrics.json")]
    return sorted((r for r in found if r["samples"] == samples and r["temperature"] == temperature and not r["keep"]),
                  key=lambda r: (r["step"], r["items"]))


def start_of(run: Path) -> str:
    """Where a finetune run started: its recipe's ``train.init_from`` (the folder name)."""
    import yaml

    return Path(yaml.safe_load((run / "recipe.yaml").read_text())["train"]["init_from"]).name


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", action="append", required=True, help="NAME=RUN_DIR (a logos finetune out_dir)")
    ap.add_argument("--test", type=Path, required=True, help="USPTO-50k raw_test.csv(.xz)")
    ap.add_argument("--valid", type=Path, help="raw_valid.csv(.xz), for --decoding")
    ap.add_argument("--items", type=int, default=0, help="test products scored (0: all)")
    ap.add_argument("--arm-items", action="append", default=[], metavar="NAME=N",
                    help="a seeded N test products for one arm instead of --items (a cheaper look at a weak arm)")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the test scoring")
    ap.add_argument("--decoding", type=int, default=0, help="validation products for the decoding comparison")
    ap.add_argument("--last", action="store_true", help="also score each run's last export where it is not best/")
    ap.add_argument("--rescore", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()

    runs = {name: Path(d) for name, d in (r.split("=", 1) for r in args.run)}
    curves = {name: curve(run) for name, run in runs.items()}
    plot(runs, curves)
    budget = min(c[-1]["cpu_min"] for c in curves.values())
    arm_items = {name: int(n) for name, n in (a.split("=", 1) for a in args.arm_items)}
    for name, run in runs.items():
        print(f"retro_finetune: scoring {name}'s best/ on the test split", file=sys.stderr)
        items = arm_items.get(name, args.items)
        picks = {checkpoint_step(run / "best"): run / "best"}
        if args.last:
            picks.setdefault(checkpoint_step(run / "hf"), run / "hf")
        for step, ckpt in picks.items():
            score(ckpt, args.test, run / f"test_step{step}_{items or 'all'}", args.samples, items, 0,
                  temperature=args.temperature, rescore=args.rescore)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    lines = [BEGIN, "### Retrosynthesis, USPTO-50k: finetuned from logos-tiny against from scratch", "",
             f"Measured at {commit}. Training split `train.csv.xz` (39,919 reactions), model selection by top-1 on "
             "200 held-out validation products (`raw_valid.csv.xz`, 5 samples each, scored by the trainer every 500 "
             "steps), test on `raw_test.csv.xz` (reaction class unknown to the model), "
             f"{args.samples} samples per product at temperature {args.temperature:g}, equal canonical answers merged "
             "and ranked by likelihood. "
             "Every arm: the same recipe and shape (5.0M parameters), started from "
             + "; ".join(f"{name}: `{start_of(run)}`" for name, run in runs.items())
             + ". CPU minutes: the finetune process's CPU time, validation scoring included; the arms ran side by "
             "side, one thread each. Test scores of the checkpoint each run selected, at the step it was selected; "
             "a seeded subset where the items are fewer than 5,001.", "",
             "| arm | steps | CPU min | best val top-1 (step) | val top-1 at "
             f"{budget:.0f} CPU min | training loss at the end |", "|---|---:|---:|---|---:|---:|"]
    for name, c in curves.items():
        best = next(p for p in c if p["step"] == c[-1]["best_step"])  # the trainer's choice
        at = max((p for p in c if p["cpu_min"] <= budget + 1e-9), key=lambda p: p["top1"])
        lines.append(f"| {name} | {c[-1]['step']:,} | {c[-1]['cpu_min']:.0f} | {pct(best['top1'])} ({best['step']:,}) "
                     f"| {pct(at['top1'])} | {c[-1]['loss']:.3f} |")
    lines += ["", "| arm | checkpoint step | CPU min | test items | top-1 | top-3 | top-5 | top-10 | invalid@1 |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, run in runs.items():
        cpu = {p["step"]: p["cpu_min"] for p in curves[name]}
        for t in test_reports(run, args.samples, args.temperature):
            cells = [f"{pct(t[f'top-{k}'])} ({pct(t['ci95'][f'top-{k}'][0])}-{pct(t['ci95'][f'top-{k}'][1])})"
                     for k in KS]
            lines.append(f"| {name} | {t['step']:,} | {cpu.get(t['step'], float('nan')):.0f} | {t['items']:,} | "
                         + " | ".join(cells) + f" | {pct(t['invalid@1'])} |")
    steps = sorted({p["step"] for c in curves.values() for p in c})
    lines += ["", f"![validation top-1 and loss against CPU minutes](benchmarks/figures/{FIGURE.name})", "",
              "Validation top-1 (%) by training step, with the CPU minutes spent by then:", "",
              "| arm | " + " | ".join(f"{s:,}" for s in steps) + " |", "|---|" + "---:|" * len(steps)]
    for name, c in curves.items():
        at = {p["step"]: p for p in c}
        lines.append(f"| {name} | " + " | ".join(f"{pct(at[s]['top1'])} ({at[s]['cpu_min']:.0f} min)" if s in at
                                                 else "" for s in steps) + " |")

    if args.decoding:
        if not args.valid:
            ap.error("--decoding needs --valid")
        first = next(iter(runs.values()))
        configs = [("sample 10 at temperature 1", dict(samples=10)),
                   ("sample 20 at temperature 1, keep the 10 most likely distinct", dict(samples=20, keep=10)),
                   ("sample 10 at temperature 0.7 (retro's default)", dict(samples=10, temperature=0.7)),
                   ("sample 20 at temperature 0.7, keep 10", dict(samples=20, temperature=0.7, keep=10))]
        lines += ["", f"Decoding on {args.decoding} seeded validation products, `{first.name}`'s best/, one after "
                  "another on the same machine:", "",
                  "| decoding | seconds | top-1 | top-3 | top-5 | top-10 |", "|---|---:|---:|---:|---:|---:|"]
        for i, (label, cfg) in enumerate(configs):
            d = score(first / "best", args.valid, first / f"decoding_{i}", items=args.decoding, seed=1,
                      rescore=args.rescore, **cfg)
            lines.append(f"| {label} | {d['seconds']:.0f} | " + " | ".join(pct(d[f"top-{k}"]) for k in KS) + " |")
    lines += ["", "Commands:", "", "```",
              "logos finetune --config finetune/retro.yaml --set \"finetune.sources=[train.csv.xz]\" \\",
              "    --set \"finetune.val_sources=[raw_valid.csv.xz]\" --set train.out_dir=runs/retro-pretrained",
              "python benchmarks/scratch_init.py checkpoints/logos-tiny runs/scratch-init",
              "logos finetune --config finetune/retro.yaml ... --set train.init_from=runs/scratch-init "
              "--set train.out_dir=runs/retro-scratch",
              "git archive 37a4b54^ checkpoints/tiny-moses | tar -x -C runs   # the earlier molecule-only model",
              "logos finetune --config finetune/retro.yaml ... --set train.init_from=runs/checkpoints/tiny-moses "
              "--set train.out_dir=runs/retro-moses --set train.max_steps=2000",
              "python benchmarks/retro_finetune.py --run pretrained=runs/retro-pretrained --run scratch=runs/retro-scratch \\",
              "    --run molecule-only=runs/retro-moses --test raw_test.csv.xz --items 1000 --last \\",
              "    --valid raw_valid.csv.xz --decoding 100", "```", END]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        from sections import write_section

        write_section(text, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
