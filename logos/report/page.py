"""One self-contained HTML page of a generation run's outputs: depictions, unit cells, pockets, loss curves, metrics.

:func:`write_page` reads the files that ``logos generate`` wrote for each step of a run (a list of
:class:`Step`, e.g. ``make demo``'s) and writes ``index.html`` beside them, which opens from disk
with no server and no network: every picture is an inline PNG data URI (RDKit depictions of
molecules, reactions, ligands and MOF linkers; matplotlib drawings of unit cells and loss curves),
the style sheet is inline, and links to the output files are relative. Each section is built on its
own: an output a library cannot read (a CIF pymatgen refuses, a SMILES RDKit refuses) is shown as
such with the reason, and a section that fails altogether says so instead of ending the page.

Sections, in order: the run's summary table; molecules (a grid, shown most likely first); reactions
(retrosynthesis and forward prediction drawn as reactions, with the recorded answer when known);
protein and antibody sequences; binding-site search (the sequence with predicted pocket residues
highlighted, against the ligand's true pocket when the structure has one); ligands; crystals (a
table of formula, space group, lattice and a picture of each unit cell); MOFs (node and linkers);
the training loss per domain from the checkpoint's ``metrics.csv``; the metrics of each step (the
``metrics.json`` that :func:`logos.evaluate.run` wrote); and every file under the folder.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import re
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from logos.util.files import write_atomic

__all__ = ["Step", "write_page", "molecule_png", "reaction_png", "cell_png", "loss_png", "marked_residues"]


@dataclass
class Step:
    """One generation step of a run, as the page shows it (paths relative to the page's folder)."""

    name: str  # unique within the run, e.g. "crystal" and "csp" are both --task crystal
    task: str  # the registry task (molecule, forward, retro, protein, antibody, pocket, ligand, crystal, mof)
    title: str  # one line for a reader
    output: str  # the file (or the CIF folder's .cif name) logos generate wrote
    samples: str  # OUTPUT.samples.jsonl
    input: str | None = None  # the --input file, if any
    reference: str | None = None  # what the metrics compare with (a path or a description)
    asked: int = 0  # samples asked (in all, or per input)
    generated: int = 0  # samples returned
    written: int = 0  # samples the domain writer wrote to a file
    valid: float | None = None  # share valid by the step's own metric (None: the task has none)
    seconds: float = 0.0
    error: str | None = None  # the step failed as a whole: why
    metrics: dict[str, dict] = field(default_factory=dict)  # evaluation name -> metrics.json's "metrics"
    reports: dict[str, str] = field(default_factory=dict)  # evaluation name -> report.md (relative)
    scored: dict[str, str] = field(default_factory=dict)  # evaluation name -> the file it scored, if not the output

    @property
    def written_share(self) -> float | None:
        return self.written / self.generated if self.generated else None


# --- pictures ---------------------------------------------------------------------------------------------------

def _uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _img(png: bytes | None, alt: str, missing: str, cls: str = "") -> str:
    """An inline picture, or ``missing`` in a red box when there is none."""
    if not png:
        return f'<div class="noimg">{html.escape(missing)}</div>'
    return f'<img class="{cls}" alt="{html.escape(alt, quote=True)}" src="{_uri(png)}">'


def molecule_png(smiles: str, size: tuple[int, int] = (236, 180)) -> bytes | None:
    """An RDKit depiction of ``smiles`` as PNG bytes, or None when RDKit cannot parse it."""
    from rdkit import Chem, RDLogger
    from rdkit.Chem.Draw import rdMolDraw2D

    RDLogger.DisableLog("rdApp.*")
    mol = Chem.MolFromSmiles(smiles) if smiles else None
    if mol is None:
        return None
    drawer = rdMolDraw2D.MolDraw2DCairo(*size)
    drawer.drawOptions().fixedBondLength = 24
    rdMolDraw2D.PrepareAndDrawMolecule(drawer, mol)
    drawer.FinishDrawing()
    return drawer.GetDrawingText()


def reaction_png(reactants: str, product: str, size: tuple[int, int] = (600, 180)) -> bytes | None:
    """An RDKit depiction of ``reactants >> product`` (dot-separated SMILES), or None when one side does not parse."""
    from rdkit import Chem, RDLogger
    from rdkit.Chem import rdChemReactions
    from rdkit.Chem.Draw import rdMolDraw2D

    RDLogger.DisableLog("rdApp.*")
    if not reactants or not product or any(Chem.MolFromSmiles(s) is None for s in (reactants, product)):
        return None
    rxn = rdChemReactions.ReactionFromSmarts(f"{reactants}>>{product}", useSmiles=True)
    drawer = rdMolDraw2D.MolDraw2DCairo(*size)
    drawer.drawOptions().padding = 0.02
    drawer.DrawReaction(rxn)
    drawer.FinishDrawing()
    return drawer.GetDrawingText()


def _figure_png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=fig.dpi)
    plt.close(fig)
    return buf.getvalue()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


_JMOL: dict[str, tuple[float, float, float]] | None = None


def element_color(symbol: str) -> tuple[float, float, float]:
    """Jmol's colour of an element (pymatgen's table), grey when unknown."""
    global _JMOL
    if _JMOL is None:
        try:
            import pymatgen.vis
            import yaml

            table = yaml.safe_load((Path(pymatgen.vis.__file__).parent / "ElementColorSchemes.yaml").read_text())
            _JMOL = {el: tuple(c / 255 for c in rgb) for el, rgb in table["Jmol"].items()}
        except (ImportError, OSError, KeyError):
            _JMOL = {}
    return _JMOL.get(symbol, (0.6, 0.6, 0.6))


def cell_png(structure, size_in: float = 2.0) -> bytes:
    """A matplotlib 3D drawing of a pymatgen ``Structure``'s unit cell: the cell box and its atoms by element.

    Atoms on a face, edge or corner are drawn at each of their periodic images inside the box."""
    import numpy as np

    plt = _pyplot()
    m = np.asarray(structure.lattice.matrix)
    fig = plt.figure(figsize=(size_in, size_in), dpi=90)
    ax = fig.add_subplot(projection="3d")
    corners = np.array([[i, j, k] for i in (0, 1) for j in (0, 1) for k in (0, 1)], dtype=float)
    for a in range(8):
        for b in range(a + 1, 8):
            if np.abs(corners[a] - corners[b]).sum() == 1:
                p = np.array([corners[a], corners[b]]) @ m
                ax.plot(p[:, 0], p[:, 1], p[:, 2], color="#444", lw=0.8)
    xyz, colors, labels = [], [], {}
    for site in structure:
        symbol = site.specie.symbol if hasattr(site.specie, "symbol") else str(site.specie)
        frac = np.mod(np.asarray(site.frac_coords, dtype=float), 1.0)
        frac[np.isclose(frac, 1.0, atol=1e-3)] = 0.0
        images = [frac]
        for axis in range(3):  # atoms on faces also sit on the opposite face
            images += [f + np.eye(3)[axis] for f in images if f[axis] < 1e-3]
        for f in images:
            xyz.append(f @ m)
            colors.append(element_color(symbol))
        labels[symbol] = element_color(symbol)
    if xyz:
        p = np.array(xyz)
        ax.scatter(p[:, 0], p[:, 1], p[:, 2], c=colors, s=70, edgecolors="#222", linewidths=0.5, depthshade=True)
    box = corners @ m
    span = (box.max(0) - box.min(0)).max() / 2
    centre = (box.max(0) + box.min(0)) / 2
    for setter, c in zip((ax.set_xlim, ax.set_ylim, ax.set_zlim), centre):
        setter(c - span, c + span)
    ax.set_box_aspect((1, 1, 1))
    ax.view_init(elev=18, azim=-60)
    ax.set_axis_off()
    handles = [plt.Line2D([], [], marker="o", ls="", color=c, markeredgecolor="#222", label=el)
               for el, c in labels.items()]
    ax.legend(handles=handles, loc="upper left", fontsize=7, frameon=False, handletextpad=0.1, borderpad=0)
    fig.subplots_adjust(0, 0, 1, 1)
    return _figure_png(fig)


DOMAINS = ("molecule", "reaction", "protein", "pocket", "crystal", "mof")


def read_metrics_csv(path: Path) -> dict[str, list[tuple[float, float]]]:
    """column -> [(step, value)] of a training ``metrics.csv``, blank cells skipped."""
    series: dict[str, list[tuple[float, float]]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                step = float(row["step"])
            except (KeyError, TypeError, ValueError):
                continue
            for key, value in row.items():
                if key == "step" or value in (None, ""):
                    continue
                try:
                    series.setdefault(key, []).append((step, float(value)))
                except ValueError:
                    pass
    return series


def loss_png(series: dict[str, list[tuple[float, float]]]) -> bytes | None:
    """Training and validation loss per domain (two panels, log scale), or None when there is no loss column."""
    plt = _pyplot()
    panels = (("training loss", "loss"), ("validation loss", "val_loss"))
    if not any(k in series for k in ("loss", "val_loss")) and not any(k.startswith("loss_") for k in series):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), dpi=90)
    colors = dict(zip(DOMAINS, plt.get_cmap("tab10").colors))
    for ax, (title, prefix) in zip(axes, panels):
        drawn = False
        for domain in DOMAINS:
            points = series.get(f"{prefix}_{domain}", [])
            if points:
                x, y = zip(*points)
                ax.plot(x, y, label=domain, color=colors[domain], lw=1.2,
                        marker="o" if prefix == "val_loss" else None, ms=3)
                drawn = True
        if series.get(prefix):
            x, y = zip(*series[prefix])
            ax.plot(x, y, label="all", color="black", lw=1.6, ls="--", marker="o" if prefix == "val_loss" else None,
                    ms=3)
            drawn = True
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats/token)")
        if drawn:
            ax.set_yscale("log")
            ax.legend(fontsize=8, ncol=2)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
        ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    return _figure_png(fig)


# --- reading outputs --------------------------------------------------------------------------------------------

def _samples(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "text" in rec:
                out.append(rec)
    return out


def _spans(text: str, tag: str) -> list[str]:
    return re.findall(rf"<{tag}S>(.*?)<{tag}E>", text, flags=re.S)


_MARK = re.compile(r"<PocketS>([A-Za-z])(?:<[^>]*>)*<PocketE>|(<[^>]*>)|([A-Za-z])")


def marked_residues(chain_text: str) -> tuple[str, set[int]]:
    """(sequence, 0-based positions marked as pocket) of a protein span body with ``<PocketS>X<PocketE>`` marks;
    other tokens inside the span (contacts, structure tokens) are skipped."""
    seq: list[str] = []
    marked: set[int] = set()
    for m in _MARK.finditer(chain_text):
        if m.group(1):
            marked.add(len(seq))
            seq.append(m.group(1))
        elif m.group(3):
            seq.append(m.group(3))
    return "".join(seq), marked


# --- HTML -------------------------------------------------------------------------------------------------------

CSS = """
body{font:14px/1.45 -apple-system,'Segoe UI',Helvetica,Arial,sans-serif;color:#1d2430;margin:0;background:#f4f6f9}
header{background:#1f3b5c;color:#fff;padding:22px 36px}
header h1{margin:0 0 4px;font-size:26px} header p{margin:2px 0;opacity:.9}
nav{background:#fff;border-bottom:1px solid #d9dee6;padding:8px 36px;position:sticky;top:0;z-index:2}
nav a{margin-right:14px;color:#1f5fa8;text-decoration:none;font-weight:600}
main{padding:8px 36px 40px;max-width:1400px}
section{background:#fff;border:1px solid #d9dee6;border-radius:8px;padding:14px 20px;margin:18px 0}
h2{margin:0 0 10px;font-size:20px;color:#1f3b5c} h3{font-size:15px;margin:14px 0 6px}
table{border-collapse:collapse;margin:6px 0 10px} th,td{border:1px solid #d9dee6;padding:4px 9px;text-align:left;
vertical-align:middle} th{background:#eef2f7} td.num{text-align:right;font-variant-numeric:tabular-nums}
.grid{display:flex;flex-wrap:wrap;gap:8px}
.card{border:1px solid #e1e5eb;border-radius:6px;padding:4px;width:246px;box-sizing:border-box;background:#fff}
.card img{display:block;width:236px;height:180px} .card .smi{font:11px monospace;word-break:break-all;color:#333}
.card .meta{font-size:12px;color:#667}
.rxns{display:flex;flex-wrap:wrap;gap:8px;margin-bottom:14px}
.rxn{border:1px solid #e1e5eb;border-radius:6px;padding:5px;width:612px;box-sizing:border-box}
.rxn img{display:block;width:600px;height:180px}
.rxn.recorded{background:#f3f6fa}
.seq{font:13px/1.7 monospace;word-break:break-all;background:#fafbfc;border:1px solid #e1e5eb;padding:8px;
border-radius:4px}
.seq .g{margin-right:6px} .seq .n{color:#99a;font-size:10px;margin-right:3px}
.both{background:#2e9d5a;color:#fff;border-radius:2px} .pred{background:#f0a13a;color:#fff;border-radius:2px}
.true{outline:2px solid #2f6fc0;border-radius:2px}
.bad{background:#fdecec;border:1px solid #f2b8b8;color:#8a1f1f;padding:6px 10px;border-radius:4px}
.noimg{width:240px;height:120px;display:flex;align-items:center;justify-content:center;background:#fdecec;
color:#8a1f1f;font-size:12px;text-align:center;border-radius:4px;padding:4px}
.ok{color:#2e7d32;font-weight:600} .no{color:#b23b3b;font-weight:600}
.files{columns:3;font:12px monospace} .files a{color:#1f5fa8}
pre.card-md{white-space:pre-wrap;font:12px/1.4 monospace;background:#fafbfc;border:1px solid #e1e5eb;padding:10px;
max-height:420px;overflow:auto}
img.cell{width:180px;height:180px} img.loss{max-width:100%}
.small{font-size:12px;color:#667}
"""


def _e(value) -> str:
    return html.escape(str(value))


def _num(value, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return f"{value:.{digits}f}" if abs(value) < 1e5 else f"{value:.3g}"
    return _e(value)


def _pct(value) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _link(rel: str, label: str | None = None) -> str:
    return f'<a href="{html.escape(rel, quote=True)}">{_e(label or rel)}</a>'


def _output_link(root: Path, rel: str) -> str:
    """A link to an output: the file, else the folder a ``.cif`` output became, else its name marked missing."""
    path = root / rel
    if path.exists():
        return _link(rel)
    if path.with_suffix("").is_dir():
        return _link(Path(rel).with_suffix("").as_posix() + "/")
    return f'{_e(rel)} <span class="no">(not written)</span>'


def _table(header: list[str], rows: list[list[str]], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td class="num">{c}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


class _Page:
    def __init__(self, root: Path, steps: list[Step]):
        self.root = root
        self.steps = steps
        self.sections: list[tuple[str, str, str]] = []  # (anchor, title, body)

    def step(self, *tasks: str) -> list[Step]:
        return [s for s in self.steps if s.task in tasks and not s.error]

    def add(self, anchor: str, title: str, build: Callable[[], str]) -> None:
        try:
            body = build()
        except Exception as e:  # a section that fails says so; the page goes on
            body = (f'<p class="bad">This section could not be drawn: {_e(type(e).__name__)}: {_e(e)}</p>'
                    f'<pre class="card-md">{_e(traceback.format_exc(limit=4))}</pre>')
        if body:
            self.sections.append((anchor, title, body))


def _summary(root: Path, steps: list[Step]) -> str:
    rows = []
    for s in steps:
        status = f'<span class="no">failed: {_e(s.error)}</span>' if s.error else ""
        rows.append([_e(s.name), _e(s.title) + (f"<br>{status}" if status else ""),
                     _output_link(root, s.input) if s.input else "–", _num(s.generated),
                     f"{s.written} ({_pct(s.written_share)})",
                     _pct(s.valid), f"{s.seconds:.1f}", _output_link(root, s.output)])
    return _table(["step", "what", "input", "samples", "written", "valid", "seconds", "output"], rows, {3, 4, 5, 6})


def _molecules(page: _Page) -> str:
    from logos.science.chemistry import canonical

    out = []
    for s in page.step("molecule"):
        # the file keeps generation order (an unbiased draw); the page shows the most likely molecules first
        recs = sorted(_samples(page.root / s.samples), key=lambda r: -(r.get("logprob") or float("-inf")))
        distinct: dict[str, list[dict]] = {}  # canonical SMILES (or the raw text) -> its samples, best first
        for r in recs:
            smi = ".".join(_spans(r["text"], "Molecule"))
            distinct.setdefault(canonical(smi) or smi or r["text"], []).append(r)
        cards = []
        for group in list(distinct.values())[:30]:
            r = group[0]
            smi = ".".join(_spans(r["text"], "Molecule"))
            times = f" · sampled {len(group)}×" if len(group) > 1 else ""
            cards.append(f'<div class="card">{_img(molecule_png(smi), smi, "RDKit cannot parse this SMILES")}'
                         f'<div class="smi">{_e(smi or r["text"][:120])}</div>'
                         f'<div class="meta">rank {r.get("rank")} · log p {_num(r.get("logprob"), 1)}{times}'
                         f'{"" if r.get("written") else " · <b>not written</b>"}</div></div>')
        out.append(f"<h3>{_e(s.title)}</h3><p class='small'>{len(cards)} of the {len(distinct)} distinct molecules "
                   f"among {len(recs)} samples, shown most likely first (the file keeps generation order); file: "
                   f"{_output_link(page.root, s.output)}</p>"
                   f"<div class='grid'>{''.join(cards)}</div>")
    return "".join(out)


def _reference_reactions(path: Path | None) -> dict[str, tuple[str, str]]:
    """id -> (reactants, product) of a ``.rsmi`` reference (``rxn id`` per line)."""
    out: dict[str, tuple[str, str]] = {}
    if path is None or not path.is_file():
        return out
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        fields = line.split()
        if fields and fields[0].count(">") == 2:
            r, _, p = fields[0].split(">")
            out[fields[1] if len(fields) > 1 else str(lineno)] = (r, p)
    return out


def _reactions(page: _Page) -> str:
    from logos.science.chemistry import canonical_set

    out = []
    for s in page.step("retro", "forward"):
        retro = s.task == "retro"
        truth = _reference_reactions(page.root / s.reference if s.reference else None)
        by_id: dict[str, list[dict]] = {}
        for r in _samples(page.root / s.samples):
            by_id.setdefault(r["id"], []).append(r)
        blocks = []
        for ident, recs in list(by_id.items())[:3]:
            recs = sorted(recs, key=lambda r: r.get("rank", 0))
            head = recs[0]["text"].split("<ReverseReact>" if retro else "<React>")[0]
            given = ".".join(_spans(head, "Molecule"))
            known = truth.get(ident)
            want = canonical_set(known[0] if retro else known[1]) if known else None
            rows = []
            for r in recs[:3]:
                after = r["text"].split("<ReverseReact>" if retro else "<React>", 1)[-1]
                answer = ".".join(_spans(after, "Molecule"))
                hit = want is not None and canonical_set(answer) == want
                png = reaction_png(answer, given) if retro else reaction_png(given, answer)
                mark = (' <span class="ok">= recorded answer</span>' if hit else "") if want else ""
                rows.append(f'<div class="rxn"><b>rank {r.get("rank")}</b> · log p {_num(r.get("logprob"), 1)}'
                            f'{mark}<br>{_img(png, answer, "RDKit cannot draw this reaction")}'
                            f'<div class="small">{_e(answer)}</div></div>')
            rec_line = ""
            if known:
                rec_line = ('<div class="rxn recorded"><b>recorded reaction</b> (USPTO)<br>'
                            + _img(reaction_png(*known), ">>".join(known), "RDKit cannot draw the recorded reaction")
                            + f'<div class="small">{_e(known[0] if retro else known[1])}</div></div>')
            what = "product" if retro else "reactants"
            blocks.append(f"<h3>{_e(ident)}: {what} <code>{_e(given)}</code></h3>"
                          f"<div class='rxns'>{rec_line}{''.join(rows)}</div>")
        note = ("Each prediction is drawn as the reaction it proposes: predicted reactants → the given product."
                if retro else "Each prediction is drawn as given reactants → predicted product.")
        shown = f"{len(blocks)} of {len(by_id)} inputs shown, the three most likely answers each. "
        out.append(f"<h3>{_e(s.title)}</h3><p class='small'>{shown}{note} File: "
                   f"{_output_link(page.root, s.output)}</p>" + "".join(blocks))
    return "".join(out)


def _wrap_sequence(seq: str, classes: dict[int, str] | None = None, start: int = 1) -> str:
    classes = classes or {}
    groups = []
    for g in range(0, len(seq), 10):
        chars = "".join(f'<span class="{classes[i]}">{_e(c)}</span>' if i in classes else _e(c)
                        for i, c in enumerate(seq[g:g + 10], g))
        groups.append(f'<span class="g"><span class="n">{g + start}</span>{chars}</span>')
    return f'<div class="seq">{"".join(groups)}</div>'


def _proteins(page: _Page) -> str:
    out = []
    for s in page.step("protein", "antibody"):
        recs = _samples(page.root / s.samples)[:3]
        items = []
        for r in recs:
            tag = "Antibody" if s.task == "antibody" else "Protein"
            for chain in _spans(r["text"], tag) or [r["text"]]:
                items.append(f"<p class='small'>rank {r.get('rank')} · {len(chain)} residues · log p "
                             f"{_num(r.get('logprob'), 1)}</p>{_wrap_sequence(chain)}")
        out.append(f"<h3>{_e(s.title)}</h3><p class='small'>{len(recs)} of {s.generated} shown; file: "
                   f"{_output_link(page.root, s.output)}</p>{''.join(items)}")
    return "".join(out)


def _true_pocket(structure_file: Path) -> dict[str, set[int]]:
    """chain name -> 0-based positions (in the chain's residue order) of the first ligand's true pocket."""
    from logos.domains.structure import read_structure
    from logos.evaluate.pockets import read_sites

    sites = read_sites(structure_file)
    if not sites or not sites[0].ligands:
        return {}
    pocket = sites[0].ligands[0][1]
    st = read_structure(structure_file)
    return {ch.name: {i for i, r in enumerate(ch.residues) if (ch.name, r.number, r.icode) in pocket}
            for ch in st.chains}


def _pockets(page: _Page) -> str:
    from logos.domains.structure import read_structure

    out = []
    for s in page.step("pocket"):
        recs = [r for r in _samples(page.root / s.samples) if r.get("rank") == 1][:2]
        structure_file = page.root / s.input if s.input else None
        true: dict[str, set[int]] = {}
        chains: list = []
        note = ""
        if structure_file is not None and structure_file.is_file():
            try:
                chains = read_structure(structure_file).chains
                true = _true_pocket(structure_file)
            except Exception as e:  # a structure gemmi refuses: predictions still shown
                note = f"<p class='bad'>reference pocket unavailable: {_e(e)}</p>"
        blocks = []
        for r in recs:
            marked_part = r["text"].split("<Search>", 1)[-1]
            for k, body in enumerate(_spans(marked_part, "Protein")):
                seq, predicted = marked_residues(body)
                chain = chains[k] if k < len(chains) else None
                truth = true.get(chain.name, set()) if chain is not None and len(chain.residues) == len(seq) else set()
                classes = {i: "both" if i in truth else "pred" for i in predicted}
                classes.update({i: "true" for i in truth - predicted})
                counts = f"{len(predicted)} residues predicted"
                if truth:
                    tp = len(predicted & truth)
                    counts += (f", {len(truth)} in the ligand's pocket (within 5 Å), {tp} both: precision "
                               f"{_pct(tp / len(predicted) if predicted else 0)}, recall {_pct(tp / len(truth))}")
                name = f"chain {chain.name}" if chain is not None else f"chain {k + 1}"
                blocks.append(f"<p><b>{_e(r['id'])}</b>, {name} ({len(seq)} residues; numbers are positions in the "
                              f"chain): {counts}</p>{_wrap_sequence(seq, classes)}")
        legend = ('<p class="small">Legend: <span class="both">&nbsp;X&nbsp;</span> predicted and in the true '
                  'pocket · <span class="pred">&nbsp;X&nbsp;</span> predicted only · '
                  '<span class="true">&nbsp;X&nbsp;</span> true pocket, not predicted.</p>')
        given = _output_link(page.root, s.input) if s.input else "–"
        out.append(f"<h3>{_e(s.title)}</h3><p class='small'>Input {given}; the rank-1 answer; file: "
                   f"{_output_link(page.root, s.output)}</p>{legend}{note}{''.join(blocks)}")
    return "".join(out)


def _ligands(page: _Page) -> str:
    out = []
    for s in page.step("ligand"):
        recs = _samples(page.root / s.samples)[:12]
        cards = []
        for r in recs:
            mols = _spans(r["text"].rsplit("<ProteinE>", 1)[-1], "Molecule")
            smi = mols[-1] if mols else ""
            cards.append(f'<div class="card">{_img(molecule_png(smi), smi, "RDKit cannot parse this SMILES")}'
                         f'<div class="smi">{_e(smi)}</div><div class="meta">{_e(r["id"])} · rank {r.get("rank")} · '
                         f'log p {_num(r.get("logprob"), 1)}</div></div>')
        given = _output_link(page.root, s.input) if s.input else "–"
        out.append(f"<h3>{_e(s.title)}</h3><p class='small'>Input: {given}; file: "
                   f"{_output_link(page.root, s.output)}</p><div class='grid'>{''.join(cards)}</div>")
    return "".join(out)


def _cif_files(root: Path, output: str) -> list[Path]:
    path = root / output
    folder = path.with_suffix("") if path.suffix == ".cif" else path
    if folder.is_dir():
        return sorted(p for p in folder.iterdir() if p.suffix == ".cif")
    return [path] if path.is_file() else []


def _stated_group(text: str) -> str:
    m = re.search(r"_(?:space_group_IT_number|symmetry_Int_Tables_number)\s+(\d+)", text)
    return m.group(1) if m else "–"


def _stability_rows(root: Path, step: Step) -> dict[str, dict]:
    """The step's per-structure stability rows (``logos evaluate --stability``), by the CIF file name they belong
    to (``NNNNNN_NAME.cif`` holds the block ``NAME``: ``ID`` or ``ID_RANK``); {} when the step was not relaxed."""
    from logos.science.materials.cif import cif_name

    report = step.reports.get(step.name)
    path = (root / report).with_name("metrics.json") if report else None
    if path is None or not path.is_file():
        return {}
    rows = json.loads(path.read_text()).get("tables", {}).get("stability per structure", [])
    out = {}
    for r in rows:
        out.setdefault(cif_name(str(r["id"])), r)
        out[cif_name(f"{r['id']}#{r['rank']}")] = r
    return out


def _stability_cells(row: dict | None) -> list[str]:
    if row is None:
        return ["–", "–"]
    if row.get("error"):
        return [f'<span class="no" title="{_e(row["error"])}">not relaxed</span>', "–"]
    return [_num(row.get("e_hull")), _num(row.get("rmsd")) if row.get("rmsd") is not None else "no match"]


def _crystal_row(root: Path, cif: Path, stability: dict | None = None) -> list[str]:
    link = _link(str(cif.relative_to(root)), cif.name)
    extra = _stability_cells(stability) if stability is not None else []
    try:
        from pymatgen.core import Structure
        from pymatgen.symmetry.analyzer import SpacegroupAnalyzer

        text = cif.read_text(errors="replace")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            structure = Structure.from_str(text, fmt="cif")
        if len(structure) == 0:
            raise ValueError("no sites")
    except Exception as e:  # pymatgen cannot read it: the row says so
        reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        return [link, '<span class="no">unreadable</span>', "–", "–", "–", "–", *extra,
                f'<div class="noimg">pymatgen cannot read this CIF: {_e(reason)}</div>']
    try:
        sga = SpacegroupAnalyzer(structure, symprec=0.1)
        found = f"{sga.get_space_group_symbol()} ({sga.get_space_group_number()})"
    except Exception:
        found = "spglib found none"
    lat = structure.lattice
    lattice = (f"{lat.a:.3f} {lat.b:.3f} {lat.c:.3f}<br>{lat.alpha:.2f} {lat.beta:.2f} {lat.gamma:.2f}")
    try:
        picture = _img(cell_png(structure), structure.composition.reduced_formula, "", "cell")
    except Exception as e:
        picture = f'<div class="noimg">cannot draw: {_e(e)}</div>'
    return [link, _e(structure.composition.reduced_formula), f"{_stated_group(text)} / {_e(found)}", lattice,
            f"{structure.volume:.1f}", f"{structure.density:.2f}", *extra, picture]


def _crystals(page: _Page) -> str:
    out = []
    for s in page.step("crystal"):
        files = _cif_files(page.root, s.output)
        which = "CIFs"
        if s.input:  # structure prediction: the most likely candidate of each formula (files NNNNNN_ID_1.cif)
            files = [f for f in files if f.stem.endswith("_1")] or files
            which = "formulas' most likely candidates"
        relaxed = _stability_rows(page.root, s)
        rows = [_crystal_row(page.root, f, relaxed.get(f.stem.split("_", 1)[-1]) if relaxed else None)
                for f in files[:8]]
        missing = s.generated - s.written
        note = f" {missing} sample(s) did not become a CIF (see the errors file)." if missing > 0 else ""
        if relaxed:
            note += (" E<sub>hull</sub>: energy above the hull of known phases after relaxation with the CHGNet ML "
                     "potential (not DFT); RMSD: how far relaxation moved the atoms (see the metrics' report).")
        out.append(f"<h3>{_e(s.title)}</h3><p class='small'>{len(rows)} of {len(files)} {which} shown (read with "
                   f"pymatgen; space group as stated in the CIF / as spglib finds it at 0.1 Å).{note}</p>"
                   + _table(["CIF", "formula", "space group (stated / found)", "a b c (Å) · α β γ (°)",
                             "volume (Å³)", "density (g/cm³)"]
                            + (["E_hull (eV/atom)", "RMSD (Å)"] if relaxed else []) + ["unit cell"], rows))
    return "".join(out)


def _mofs(page: _Page) -> str:
    from logos.science.materials.framework import parse_mof_text
    from logos.util.records import RecordError

    out = []
    for s in page.step("mof"):
        blocks = []
        for r in _samples(page.root / s.samples)[:4]:
            try:
                node, linkers = parse_mof_text(r["text"])
            except (RecordError, ValueError) as e:
                blocks.append(f"<p class='bad'>rank {r.get('rank')}: not a MOF text ({_e(e)})</p>")
                continue
            metals = _node_metals(node)
            cards = "".join(f'<div class="card">{_img(molecule_png(smi), smi, "RDKit cannot parse this linker")}'
                            f'<div class="smi">{_e(smi)}</div></div>' for smi in linkers[:6])
            more = f"<p class='small'>… and {len(linkers) - 6} more linkers</p>" if len(linkers) > 6 else ""
            blocks.append(f"<p><b>rank {r.get('rank')}</b> · log p {_num(r.get('logprob'), 1)} · node "
                          f"<code>{_e(node)}</code> · metal: {_e(', '.join(metals) or 'none')} · "
                          f"{len(linkers)} linker(s)</p><div class='grid'>{cards}</div>{more}")
        out.append(f"<h3>{_e(s.title)}</h3><p class='small'>File: {_output_link(page.root, s.output)}</p>"
                   + "".join(blocks))
    return "".join(out)


def _node_metals(node: str) -> list[str]:
    from pymatgen.core import Element

    out = []
    for symbol in dict.fromkeys(re.findall(r"[A-Z][a-z]?", node)):
        try:
            if Element(symbol).is_metal or Element(symbol).is_metalloid:
                out.append(symbol)
        except ValueError:
            pass
    return out


def _flatten(doc, prefix: str = "") -> list[tuple[str, object]]:
    """(dotted key, scalar) pairs of a JSON document."""
    if isinstance(doc, dict):
        return [kv for k, v in doc.items() for kv in _flatten(v, f"{prefix}{k}.")]
    if isinstance(doc, list):
        return [kv for i, v in enumerate(doc) for kv in _flatten(v, f"{prefix}{i}.")]
    return [(prefix.rstrip("."), doc)]


def _training(checkpoint: Path | None, root: Path) -> str:
    if checkpoint is None:
        return ""
    parts = []
    metrics = checkpoint / "metrics.csv"
    if metrics.is_file():
        series = read_metrics_csv(metrics)
        png = loss_png(series)
        last = {k: v[-1] for k, v in series.items()}
        facts = []
        if "step" in last or series.get("loss"):
            step, loss = series["loss"][-1] if series.get("loss") else (None, None)
            facts.append(f"{int(step):,} steps, last training loss {_num(loss)}" if step is not None else "")
        if "tokens" in last:
            facts.append(f"{int(last['tokens'][1]):,} tokens")
        if "elapsed_s" in last:
            facts.append(f"{last['elapsed_s'][1] / 3600:.2f} h")
        if "val_loss" in last:
            facts.append(f"last validation loss {_num(last['val_loss'][1])} (step {int(last['val_loss'][0]):,})")
        parts.append(f"<p>{_e(' · '.join(f for f in facts if f))}</p>"
                     + _img(png, "training and validation loss per domain", "no loss column in metrics.csv", "loss"))
    else:
        parts.append("<p class='small'>The checkpoint has no metrics.csv.</p>")
    # the checkpoint's own documents: its model card and any results (Markdown as text, JSON as a table)
    for f in sorted(checkpoint.glob("*.md"), key=lambda f: (f.name != "README.md", f.name)):
        parts.append(f"<h3>{_e(f.name)}</h3><pre class='card-md'>{_e(f.read_text(errors='replace'))}</pre>")
    for f in sorted(checkpoint.glob("results*.json")):
        try:
            flat = _flatten(json.loads(f.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            parts.append(f"<p class='bad'>{_e(f.name)}: not JSON ({_e(e)})</p>")
            continue
        parts.append(f"<h3>{_e(f.name)}</h3>" + _table(["key", "value"], [[_e(k), _num(v)] for k, v in flat], {1}))
    cfg = checkpoint / "config.json"
    if cfg.is_file():
        c = json.loads(cfg.read_text())
        parts.append(f"<p class='small'>Architecture: {_e(', '.join(c.get('architectures', [])))}, "
                     f"{c.get('num_hidden_layers')} layers, hidden size {c.get('hidden_size')}, "
                     f"{c.get('num_attention_heads')} heads, vocabulary {c.get('vocab_size')}.</p>")
    return "".join(parts)


def _metrics(page: _Page) -> str:
    tables, figures = [], []
    for s in page.steps:
        for name, metrics in s.metrics.items():
            rows = [[_e(k), _num(v)] for k, v in metrics.items() if not isinstance(v, (dict, list))]
            report = s.reports.get(name)
            ref = f" against {_e(s.reference)}" if s.reference and name == s.name else ""
            tables.append(f"<div style='display:inline-block;vertical-align:top;margin-right:24px'><h3>{_e(name)}</h3>"
                          f"<p class='small'>{_e(s.scored.get(name, s.output))}{ref}"
                          f"{' · ' + _output_link(page.root, report) if report else ''}</p>"
                          + _table(["metric", "value"], rows, {1}) + "</div>")
            folder = (page.root / report).parent if report else None
            pngs = sorted(folder.glob("*.png")) if folder is not None and folder.is_dir() else []
            for png in (p for p in pngs if p.stem != "molecules"):  # the molecule grid above shows those
                figures.append(f"<h3>{_e(name)}: {_e(png.stem)}</h3>"
                               + _img(png.read_bytes(), f"{name} {png.stem}", "figure missing", "loss"))
    if not tables:
        return "<p class='small'>No metrics were computed.</p>"
    return ("<p class='small'>Each output scored by <code>logos.evaluate</code> (the code of <code>logos evaluate"
            "</code>), with its report.</p>" + "".join(tables) + "".join(figures))


def _files(root: Path, page_name: str) -> str:
    items = []
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = f.relative_to(root).as_posix()
        if rel == page_name:
            continue
        size = f.stat().st_size
        label = f"{rel} ({size / 1024:.1f} KiB)" if size >= 1024 else f"{rel} ({size} B)"
        items.append(f"<li>{_link(rel, label)}</li>")
    return f"<ul class='files'>{''.join(items)}</ul>"


def write_page(root: Path, steps: list[Step], checkpoint: Path | None = None, title: str = "LOGOS demo",
               subtitle: str = "", page_name: str = "index.html") -> Path:
    """Write ``root/page_name`` for ``steps`` (outputs under ``root``) and return its path."""
    root = Path(root)
    page = _Page(root, steps)
    page.add("summary", "Run summary", lambda: _summary(root, steps))
    page.add("molecules", "Molecules", lambda: _molecules(page))
    page.add("reactions", "Reactions", lambda: _reactions(page))
    page.add("proteins", "Proteins and antibodies", lambda: _proteins(page))
    page.add("pockets", "Binding-site search", lambda: _pockets(page))
    page.add("ligands", "Ligands for the pocket", lambda: _ligands(page))
    page.add("crystals", "Crystals", lambda: _crystals(page))
    page.add("mofs", "Metal–organic frameworks", lambda: _mofs(page))
    page.add("training", "Training", lambda: _training(checkpoint, root))
    page.add("metrics", "Metrics", lambda: _metrics(page))
    # the manifest first, so that the file list links it
    write_atomic(root / "steps.json", json.dumps([asdict(s) for s in steps], indent=1) + "\n")
    page.add("files", "Files", lambda: _files(root, page_name))
    nav = "".join(f'<a href="#{a}">{_e(t)}</a>' for a, t, _ in page.sections)
    body = "".join(f'<section id="{a}"><h2>{_e(t)}</h2>{b}</section>' for a, t, b in page.sections)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    doc = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
           f"<style>{CSS}</style></head><body><header><h1>{_e(title)}</h1><p>{_e(subtitle)}</p>"
           f"<p class='small' style='color:#cfd8e3'>written {when}</p></header><nav>{nav}</nav>"
           f"<main>{body}</main></body></html>\n")
    out = root / page_name
    write_atomic(out, doc)
    return out
