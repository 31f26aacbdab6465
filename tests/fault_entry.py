"""Test-only entry point: ``logos`` with the faults of ``LOGOS_TEST_FAULTS`` injected (see fault_injection.py).

Child processes of the fault and resume tests run ``python tests/fault_entry.py pretrain ...`` (also as the
script of ``torchrun`` and the ``deepspeed`` launcher) instead of ``python -m logos.cli pretrain ...``.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fault_injection import from_environment  # noqa: E402

from logos.cli import main  # noqa: E402

if __name__ == "__main__":
    from_environment()
    sys.exit(main())
