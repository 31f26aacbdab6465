"""``logos --help`` and ``import logos`` stay light: no RDKit, gemmi, spglib or torch until a job needs them."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO

HEAVY = ("rdkit", "gemmi", "spglib", "torch", "transformers")


def _loaded_after(code: str) -> set[str]:
    probe = code + "\nimport sys\nprint(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return set(out.split()) & set(HEAVY)


def test_logos_help_imports_no_science_library():
    code = ("import contextlib, io\nfrom logos.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(['--help'])\n    except SystemExit:\n        pass")
    assert _loaded_after(code) == set()


def test_import_logos_is_lazy():
    assert _loaded_after("import logos; logos.tasks.names('generate')") == set()


def test_public_api():
    import logos

    assert set(logos.__all__) >= {"encode", "decode", "validate", "load_model", "generate", "evaluate", "tasks"}
    logos.validate("<MoleculeS>CC(=O)O<MoleculeE>")
    assert callable(logos.generate.run) and callable(logos.evaluate.run) and callable(logos.load_model)
    assert "molecule" in logos.tasks.names("generate")


def test_local_rank_before_the_subcommand():
    from logos.cli.main import _command_of

    assert _command_of(["--local_rank", "0", "tokenize", "x.smi"]) == "tokenize"
    assert _command_of(["--local_rank=0", "pretrain"]) == "pretrain"
    assert _command_of(["--help"]) is None
