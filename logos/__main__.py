"""``python -m logos``: the ``logos`` command."""

import sys

from logos.cli.main import main

sys.exit(main())
