"""The decoder's compiled core: built and used by the install, deciding exactly as its Python source, and set aside
for the source when that has changed since the build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Molecules from the fixture replayed token by token; at every position a fixed set of candidates is checked, and
# every third position plans an ending; what each check and plan decided is printed, with where each module ran.
REPLAY = r"""
import json, os, random
from pathlib import Path
import logos.decoding as decoding
from logos.decoding.constraints import TokenTable
from logos.decoding.rows import SmilesRow, SmilesVocab
from logos.language.tokenizer import load_tokenizer

root = Path(os.environ["LOGOS_ROOT"])
vocab = SmilesVocab.of(TokenTable(load_tokenizer(root / "tokenizers" / "default"), 2432))
smiles = [line.split()[0] for line in (root / "tests/assets/moses_500.smi").read_text().splitlines()[:160]]
pieces = [i for i, ok in enumerate(vocab.smiles) if ok]
candidates = random.Random(0).sample(pieces, 24) + [vocab.close_id]
decided = []
for k, text in enumerate(smiles):
    row = SmilesRow(vocab, "")
    row.advance(vocab.open_id)
    for i, token in enumerate(vocab.spell(text)):
        remaining = 12 + (k + i) % 40
        decided.append([row.fork().check(t, remaining) for t in candidates])
        if i % 3 == 0:
            decided.append(row.fork().ending(remaining))
        if not row.check(token, 1 << 20):
            decided.append("refused")
            break
        row.advance(token)
print(json.dumps({"native": decoding.native(), "decided": decided}))
"""


def _replay(env_extra: dict[str, str], package_root: Path = ROOT) -> dict:
    """Run the replay with ``logos`` imported from ``package_root`` (its working directory)."""
    env = {k: v for k, v in os.environ.items() if k != "LOGOS_PURE_PYTHON"}
    env.update(PYTHONPATH=str(package_root), OMP_NUM_THREADS="1", LOGOS_ROOT=str(ROOT), **env_extra)
    out = subprocess.run([sys.executable, "-c", REPLAY], cwd=package_root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return {**json.loads(out.stdout), "stderr": out.stderr}


def test_the_compiled_core_decides_as_its_source():
    """The install compiled the state machine and the planner, they run compiled, and every check and planned
    ending of a replay is the same as the Python source's (LOGOS_PURE_PYTHON=1)."""
    compiled = _replay({})
    source = _replay({"LOGOS_PURE_PYTHON": "1"})
    assert compiled["native"] == {"atoms": True, "aromatic": True, "chemistry": True, "ending": True}
    assert source["native"] == {"atoms": False, "aromatic": False, "chemistry": False, "ending": False}
    assert len(compiled["decided"]) > 2000, len(compiled["decided"])
    assert sum(v is True for checks in compiled["decided"] if isinstance(checks, list) for v in checks) > 1000
    assert compiled["decided"] == source["decided"]


def test_a_source_changed_since_the_build_runs_as_source(tmp_path):
    """A compiled module whose source no longer has the digest it was built from is not used: its source runs,
    with a warning, and the other modules stay compiled."""
    shutil.copytree(ROOT / "logos", tmp_path / "logos", ignore=shutil.ignore_patterns("__pycache__"))
    for shipped in ("pyproject.toml", "grammar", "tokenizers"):  # a checkout's layout: its shipped data beside it
        (tmp_path / shipped).symlink_to(ROOT / shipped)
    digests = tmp_path / "logos" / "decoding" / "_compiled.json"
    table = json.loads(digests.read_text())
    assert set(table) == {"atoms", "aromatic", "chemistry", "ending"}
    with open(tmp_path / "logos" / "decoding" / "aromatic.py", "a") as f:
        f.write("\n# edited after the build\n")
    changed = _replay({}, tmp_path)
    assert changed["native"] == {"atoms": True, "aromatic": False, "chemistry": True, "ending": True}
    assert "compiled modules older than their sources (aromatic)" in changed["stderr"]
    digests.unlink()  # no record of the build: nothing compiled is trusted
    assert not any(_replay({}, tmp_path)["native"].values())
