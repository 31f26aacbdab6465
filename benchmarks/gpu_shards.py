"""Token shards for the GPU check: the 500-molecule MOSES fixture, tokenized and packed, small enough to bundle.

    python benchmarks/gpu_shards.py gpu_shards
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(out: str) -> int:
    from logos.cli import main as cli
    from logos.data.pack import pack

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "moses.jsonl"
        if cli(["tokenize", str(REPO / "tests" / "assets" / "moses_500.smi"), "-o", str(corpus), "-q"]) != 0:
            return 1
        pack([corpus], REPO / "tokenizers" / "default", Path(out), val_fraction=0.1, progress=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "gpu_shards"))
