"""Crystal and MOF benchmark: round trip on Materials Project crystals, MOF split rate, throughput.

(a) Round trip: every (or a seeded sample of) matbench_dielectric structure is tokenized, detokenized
    to a CIF, read back with pymatgen (and gemmi), and compared with pymatgen's ``StructureMatcher``
    (default tolerances); the space group of input and output (``SpacegroupAnalyzer``, default
    symprec 0.01) must agree. CoRE MOF: share of a seeded sample split cleanly. Failures with
    reasons go to ``--failures`` (JSONL).
    Every decoded crystal is also expanded to its unit cell and spglib (symprec 0.01) must find the
    declared space group; a different group is counted (and listed in the failures file as
    ``"set": "space-group-check"``), with whether atoms of the cell coincide.
(t) Tokens per crystal (``--parts tokens``) with ``tokenizers/default``: the text the encoder of the
    checkout on ``PYTHONPATH`` writes, so running it on the main checkout (v1) and on this one (v2,
    with and without the composition header) measures both on the same structures.
(b) Throughput on the same CIF files, in one run (``--parts speed``): ``tokenize_files`` in-process
    (``workers=0``: encoders and JSON lines) and with one isolated worker, against a bare gemmi read +
    unit-cell expansion + one spglib dataset call; ``--repeats`` rounds alternate the order, medians and
    the spread of per-round time ratios are printed. Target: in-process <= 1.3x bare.

    python benchmarks/crystal_bench.py --mp-sample 0 --mof-sample 500 --speed-files 500
    PYTHONPATH=/path/to/checkout python benchmarks/crystal_bench.py --parts tokens
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import signal
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import gemmi
import numpy as np
import spglib

from logos.data import datasets as data
from logos import materials as C
from logos.science.materials.crystal import position_groups
from logos.util.records import RecordError


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _init():
    warnings.filterwarnings("ignore")
    signal.signal(signal.SIGALRM, _alarm)


def _declared_group_check(crystal) -> str:
    """'' when spglib (symprec 0.01) finds the declared group in the decoded cell, else what it found."""
    cell = C.unit_cell(crystal)
    frac = np.array([s.frac for s in cell.sites]) % 1.0
    kinds: dict = {}
    types = [kinds.setdefault((s.element, round(s.occ, 3)), len(kinds) + 1) for s in cell.sites]
    ds = spglib.get_symmetry_dataset((cell.matrix(), frac, types), symprec=0.01)
    found = int(ds.number) if ds is not None else 0
    if found == crystal.space_group:
        return ""
    groups = position_groups(frac, cell.matrix(), 0.01)
    coincide = len(groups) < len(frac)
    return f"declared {crystal.space_group}, spglib finds {found}" + (" (atoms coincide)" if coincide else "")


def _roundtrip(args):
    """(key, pymatgen dict) or (path, None) -> (key, ok, reason, space-group check)."""
    key, obj = args
    from pymatgen.analysis.structure_matcher import StructureMatcher
    from pymatgen.core import Structure
    from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

    signal.alarm(60)
    try:
        if obj is None:  # a file: CIF (gemmi reader) or pymatgen JSON
            item = next(iter(C.read_crystal_file(Path(key))))
            crystal = C.load(item)
            s_in = Structure.from_file(key) if key.endswith(".cif") else Structure.from_dict(item.payload)
        else:
            crystal, s_in = C.crystal_from_dict(obj), Structure.from_dict(obj)
        s_in.remove_oxidation_states()  # the grammar writes elements; compare elements
        text = C.encode_crystal(crystal)
        decoded = C.decode_text(text)
        sg_check = _declared_group_check(decoded)
        cif = C.crystal_to_cif(decoded, key)
        s_out = Structure.from_str(cif, fmt="cif")
        small = gemmi.make_small_structure_from_block(gemmi.cif.read_string(cif).sole_block())
        small.setup_cell_images()
        # gemmi lists each species of a disordered site, pymatgen one site: count positions
        positions = {tuple(np.round(np.array(a.fract.tolist()) % 1.0, 3) % 1.0) for a in small.get_all_unit_cell_sites()}
        if len(positions) != len(s_out):
            return key, False, sg_check, f"gemmi reads {len(positions)} positions, pymatgen {len(s_out)}"
        if not StructureMatcher().fit(s_in, s_out):
            return key, False, sg_check, f"StructureMatcher: not the same structure ({text[:120]})"
        sg_in = SpacegroupAnalyzer(s_in).get_space_group_number()
        sg_out = SpacegroupAnalyzer(s_out).get_space_group_number()
        if sg_in != sg_out:
            return key, False, sg_check, f"space group {sg_in} -> {sg_out}"
        return key, True, sg_check, ""
    except _Timeout:
        return key, False, "", "timeout (60 s)"
    except RecordError as e:
        return key, False, "", f"rejected: {e}"
    except Exception as e:
        return key, False, "", f"error {type(e).__name__}: {e}"
    finally:
        signal.alarm(0)


_TOKENIZER = None


def _tokens(args):
    """(key, pymatgen dict, composition header?) -> (key, tokens of the text, or -1 when not encoded)."""
    global _TOKENIZER
    key, obj, composition = args
    if _TOKENIZER is None:
        from logos.language.tokenizer import load_tokenizer
        _TOKENIZER = load_tokenizer(Path(__file__).resolve().parent.parent / "tokenizers" / "default")
    try:
        kwargs = {} if composition is None else {"composition": composition}
        text = C.encode_crystal(C.crystal_from_dict(obj), **kwargs)
    except Exception:
        return key, -1
    return key, len(_TOKENIZER.encode(text, add_special_tokens=False))


def _mof(args):
    name, text = args
    signal.alarm(60)
    try:
        node, linkers = C.split_framework(C.read_cif_block(text))
        return name, True, node + " | " + " ".join(linkers)
    except _Timeout:
        return name, False, "timeout (60 s)"
    except RecordError as e:
        return name, False, str(e)
    except Exception as e:
        return name, False, f"error {type(e).__name__}: {e}"
    finally:
        signal.alarm(0)


def _category(reason: str) -> str:
    for key in ("overlapping", "no organic linker", "bond orders", "polymeric", "holds no metal",
                "no metal", "partially occupied", "timeout", "StructureMatcher", "space group", "gemmi reads",
                "spglib", "rejected", "error"):
        if key in reason:
            return key
    return reason[:40]


def _bare(paths: list[Path]) -> int:
    n = 0
    for p in paths:
        doc = gemmi.cif.read(str(p))
        small = gemmi.make_small_structure_from_block(doc.sole_block())
        small.setup_cell_images()
        sites = small.get_all_unit_cell_sites()
        lattice = np.array(small.cell.orth.mat.tolist()).T
        frac = np.array([s.fract.tolist() for s in sites])
        numbers = [s.element.atomic_number for s in sites]
        spglib.get_symmetry_dataset((lattice, frac, numbers), symprec=0.01)
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mp-sample", type=int, default=0, help="seeded sample of MP structures (0 = all 4,764)")
    ap.add_argument("--mof-sample", type=int, default=500, help="seeded sample of CoRE MOF frameworks")
    ap.add_argument("--speed-files", type=int, default=500, help="CIF files for the throughput rows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds of the throughput part")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--failures", default="crystal_bench_failures.jsonl")
    ap.add_argument("--parts", default="mp,mof,speed", help="comma-separated parts to run: mp, tokens, mof, speed")
    ap.add_argument("--extra", nargs="*", default=[], metavar="FILE",
                    help="more crystal files (CIF, pymatgen JSON) not shipped with the project, e.g. minerals")
    args = ap.parse_args(argv)
    ctx = mp.get_context("fork")

    parts = set(args.parts.split(","))
    # the failures file belongs to the round-trip parts; a throughput-only run leaves it alone
    fails = open(args.failures, "w", encoding="utf-8") if parts & {"mp", "mof"} or args.extra else None
    # (a) MP round trip
    table = json.loads(data.fetch("mp-dielectric").read_text())["structure"]
    keys = [] if "mp" not in parts else sorted(table, key=lambda k: int(k.rsplit("-", 1)[-1]))
    if args.mp_sample and args.mp_sample < len(keys):
        keys = sorted(random.Random(args.seed).sample(keys, args.mp_sample), key=lambda k: int(k.rsplit("-", 1)[-1]))
    t = time.perf_counter()
    with ctx.Pool(args.workers, initializer=_init) as pool:
        results = pool.map(_roundtrip, [(k, table[k]) for k in keys], chunksize=16)
    ok = sum(r[1] for r in results) if keys else 0
    cats: dict[str, int] = {}
    sg_off = [(key, check) for key, _, check, _ in results if check]
    for key, good, _, reason in results:
        if not good:
            cats[_category(reason)] = cats.get(_category(reason), 0) + 1
            fails.write(json.dumps({"set": "mp-dielectric", "id": key, "reason": reason}) + "\n")
    for key, check in sg_off:
        fails.write(json.dumps({"set": "space-group-check", "id": key, "reason": check}) + "\n")
    if keys:
        print(f"MP round trip: {ok}/{len(results)} = {100 * ok / len(results):.2f}% "
              f"({'all' if len(keys) == len(table) else f'seeded sample, seed {args.seed}'}; "
              f"{time.perf_counter() - t:.0f} s); failures: {cats}", flush=True)
        decoded = sum(1 for r in results if not r[3].startswith(("rejected", "error", "timeout")))
        print(f"declared space group found by spglib (symprec 0.01) in the decoded cell: "
              f"{decoded - len(sg_off)}/{decoded}; other: {len(sg_off)} "
              f"({sum('coincide' in c for _, c in sg_off)} with coinciding atoms): {sg_off[:10]}", flush=True)

    if "tokens" in parts:
        import inspect
        variants = [True, False] if "composition" in inspect.signature(C.encode_crystal).parameters else [None]
        all_keys = sorted(table, key=lambda k: int(k.rsplit("-", 1)[-1]))
        for variant in variants:
            with ctx.Pool(args.workers, initializer=_init) as pool:
                counts = [n for _, n in pool.map(_tokens, [(k, table[k], variant) for k in all_keys], chunksize=32)]
            good = [n for n in counts if n >= 0]
            label = {None: "encoder without a composition option (v1)", True: "with composition header",
                     False: "without composition header"}[variant]
            print(f"tokens per crystal ({label}), tokenizers/default, {len(good)}/{len(counts)} encoded: "
                  f"mean {np.mean(good):.1f}, median {np.median(good):.0f}, p90 {np.percentile(good, 90):.0f}, "
                  f"max {max(good)}, total {sum(good)}", flush=True)

    if args.extra:
        with ctx.Pool(args.workers, initializer=_init) as pool:
            results = pool.map(_roundtrip, [(str(p), None) for p in args.extra])
        ok = sum(r[1] for r in results)
        for key, good, _, reason in results:
            if not good:
                fails.write(json.dumps({"set": "extra", "id": key, "reason": reason}) + "\n")
        print(f"extra crystals round trip: {ok}/{len(results)}; failures: "
              f"{[(Path(k).name, r) for k, g, _, r in results if not g]}", flush=True)

    # (a) CoRE MOF split
    if "mof" in parts:
        blocks = list(C.cif_blocks(data.fetch("core-mof")))
        sample = random.Random(args.seed).sample(blocks, min(args.mof_sample, len(blocks)))
        t = time.perf_counter()
        with ctx.Pool(args.workers, initializer=_init) as pool:
            results = pool.map(_mof, sample, chunksize=4)
        ok = sum(r[1] for r in results)
        cats = {}
        for name, good, reason in results:
            if not good:
                cats[_category(reason)] = cats.get(_category(reason), 0) + 1
                fails.write(json.dumps({"set": "core-mof", "id": name, "reason": reason}) + "\n")
        print(f"CoRE MOF split cleanly: {ok}/{len(results)} = {100 * ok / len(results):.1f}% "
              f"(seeded sample of {len(blocks)}, seed {args.seed}; {time.perf_counter() - t:.0f} s); "
              f"failures: {cats}", flush=True)
    if fails is not None:
        fails.close()
    if "speed" not in parts:
        return 0

    # (b) throughput on the same CIF files
    from pymatgen.core import Structure
    from pymatgen.io.cif import CifWriter

    from logos.data.encode import tokenize_files

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        all_keys = sorted(table, key=lambda k: int(k.rsplit("-", 1)[-1]))
        pick = random.Random(args.seed).sample(all_keys, min(args.speed_files, len(all_keys)))
        paths = []
        for k in pick:
            p = folder / f"{k}.cif"
            p.write_text(str(CifWriter(Structure.from_dict(table[k]), symprec=0.1)))
            paths.append(p)
        times: dict[str, list[float]] = {"bare": [], "inproc": [], "isolated": []}
        errors = 0
        for r in range(args.repeats):
            for side in (("bare", "inproc", "isolated") if r % 2 == 0 else ("isolated", "inproc", "bare")):
                t = time.perf_counter()
                if side == "bare":
                    _bare(paths)
                else:
                    result = tokenize_files(paths, folder / "out.jsonl", None, workers=0 if side == "inproc" else 1,
                                            progress=False, echo=lambda line: None)
                    errors = result.errors
                times[side].append(time.perf_counter() - t)
        n = len(paths)

        def ratio(side: str) -> str:
            rs = [a / b for a, b in zip(times[side], times["bare"])]
            return f"**{statistics.median(rs):.2f}x** ({min(rs):.2f}-{max(rs):.2f})"

        print(f"throughput on {n} MP CIF files (symmetrized by pymatgen CifWriter, symprec 0.1; {errors} rejected), "
              f"{args.repeats} alternating rounds: median rates, median per-round time ratio (min-max)")
        print("| bare gemmi read + spglib dataset (crystals/s) | logos encoders in-process (crystals/s) "
              "| in-process / bare time | logos with an isolated worker (crystals/s) | isolated / bare time |")
        print("|---:|---:|---:|---:|---:|")
        rate = {k: n / statistics.median(v) for k, v in times.items()}
        print(f"| {rate['bare']:,.1f} | {rate['inproc']:,.1f} | {ratio('inproc')} | {rate['isolated']:,.1f} "
              f"| {ratio('isolated')} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
