"""make demo's report page: a quick demo run on the shipped model, the page rendered in headless Chromium.

The demo (``scripts/demo.py``, one sample and one input per task) writes ``index.html``; Chromium loads a
copy of it with a small script that records, after the load event, which sections exist, which
pictures decoded (``naturalWidth > 0``) and where every link points; the test then checks those
files exist and that a screenshot of the page is not blank. Chromium is required (`make test` installs it when it
runs as root): without it the test fails rather than skips.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = ROOT / "checkpoints" / "logos-tiny"
TASKS = ("molecule", "retro", "forward", "protein", "antibody", "pocket", "ligand", "crystal", "csp", "mof")
SECTIONS = ("summary", "molecules", "reactions", "proteins", "pockets", "ligands", "crystals", "mofs", "training",
            "metrics", "files")

# Runs after the load event: the page's facts, written into the DOM for --dump-dom to print.
PROBE = """<script>
window.addEventListener("load", () => {
  const imgs = [...document.images];
  const facts = {
    sections: [...document.querySelectorAll("section[id]")].map(s => s.id),
    images: imgs.length,
    broken: imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.alt || i.src.slice(0, 60)),
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
    summary_rows: [...document.querySelectorAll("#summary tr")].slice(1).map(r => r.cells[0].textContent),
    text_length: document.body.innerText.length,
  };
  const out = document.createElement("pre");
  out.id = "probe";
  out.textContent = JSON.stringify(facts);
  document.body.appendChild(out);
});
</script>"""


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is required for the demo page test (apt-get install chromium)")


def _browse(page: Path, *args: str, profile: Path) -> subprocess.CompletedProcess:
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--hide-scrollbars", f"--user-data-dir={profile}", "--virtual-time-budget=10000", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    """The output folder of a quick demo run: every task, one sample and one input each."""
    if not (CHECKPOINT / "model.safetensors").exists():
        pytest.fail(f"{CHECKPOINT} holds no model.safetensors: the demo's model is missing")
    out = tmp_path_factory.mktemp("demo")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--checkpoint", str(CHECKPOINT),
                           "--out", str(out), "--samples", "1", "--inputs", "1", "-q"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "DEMO_RELAX_STEPS": "50", "DEMO_RELAX_SECONDS": "10"})
    assert (out / "index.html").exists(), proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def _probe(page: Path, tmp_path: Path) -> dict:
    probe = page.with_name("_probe.html")  # beside the page, so its relative links resolve the same way
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    try:
        proc = _browse(probe, "--dump-dom", profile=tmp_path / "profile")
    finally:
        probe.unlink()
    found = re.search(r'<pre id="probe">(.*?)</pre>', proc.stdout, flags=re.S)
    assert found, f"Chromium printed no probe result:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


def test_demo_prints_a_summary_and_writes_every_task(demo):
    steps = json.loads((demo / "steps.json").read_text())
    assert [s["name"] for s in steps] == list(TASKS)
    for s in steps:
        assert s["error"] is None, s
        assert s["generated"] >= 1, s
        assert (demo / s["samples"]).exists(), s


def test_page_renders_in_chromium_with_every_picture_and_link(demo, tmp_path):
    page = demo / "index.html"
    text = page.read_text(encoding="utf-8")
    # self-contained: no script, style sheet, font or picture from elsewhere
    assert not re.search(r"""(?:src|href)=["']?(?:https?:)?//""", text)
    assert "<script" not in text and "<link" not in text

    facts = _probe(page, tmp_path)
    assert facts["sections"] == list(SECTIONS)
    assert facts["summary_rows"] == list(TASKS)
    assert facts["images"] >= 8  # molecule, reactions (predicted and recorded), ligand, two unit cells, linker, loss
    assert facts["broken"] == []
    assert facts["text_length"] > 2000
    links = [unquote(urlparse(link).path) for link in facts["links"]]
    assert all(link.startswith("file://") for link in facts["links"])  # relative links, resolved by the browser
    files = [Path(p) for p in links if not p.endswith("/_probe.html")]  # the rest are the page's own anchors
    assert len(files) > 20
    assert [p for p in files if not p.exists()] == []
    linked = {p.resolve() for p in files}
    for s in json.loads((demo / "steps.json").read_text()):
        output = demo / s["output"]
        assert (output if output.exists() else output.with_suffix("")).resolve() in linked, s["output"]

    shot = tmp_path / "page.png"
    _browse(page, f"--screenshot={shot}", "--window-size=1400,3000", profile=tmp_path / "profile")
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (3000, 1400)
    assert pixels.std() > 20 and (pixels < 200).mean() > 0.02  # drawn, not a blank page


def test_a_cif_pymatgen_cannot_read_is_shown_not_fatal(demo, tmp_path):
    from logos.report.page import Step, write_page

    out = tmp_path / "copy"
    shutil.copytree(demo, out)
    steps = [Step(**s) for s in json.loads((out / "steps.json").read_text())]
    folder = out / "generated" / "crystal"
    folder.mkdir(exist_ok=True)
    shutil.copy(ROOT / "tests" / "assets" / "crystal" / "broken_truncated_loop.cif", folder / "000099_bad.cif")
    (folder / "000098_empty.cif").write_text("data_empty\n")
    text = write_page(out, steps, CHECKPOINT).read_text(encoding="utf-8")
    crystals = text.split('<section id="crystals">')[1].split("</section>")[0]
    assert crystals.count("pymatgen cannot read this CIF") == 2
    assert "000099_bad.cif" in crystals and 'class="cell"' in crystals  # the good cell is still drawn


def test_crystal_tables_show_energy_above_hull_and_rmsd(demo):
    """The crystals were relaxed with the ML potential (logos evaluate --stability): E_hull and RMSD per cell."""
    text = (demo / "index.html").read_text(encoding="utf-8")
    crystals = text.split('<section id="crystals">')[1].split("</section>")[0]
    assert crystals.count("E_hull (eV/atom)") == 2 and crystals.count("RMSD (Å)") == 2  # unconditional and csp
    assert "not DFT" in crystals
    rows = json.loads((demo / "eval" / "crystal" / "metrics.json").read_text())["tables"]["stability per structure"]
    assert len(rows) == 1 and (rows[0]["e_hull"] is not None or rows[0]["error"])
    assert all(f'<section id="{s}">' in text for s in SECTIONS)
