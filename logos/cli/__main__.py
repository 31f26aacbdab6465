"""``python -m logos.cli``: the ``logos`` command (used by launchers such as ``torchrun -m``)."""

import sys

from logos.cli.main import main

sys.exit(main())
