"""The ``logos`` command line (argparse only): see :mod:`logos.cli.main`."""

from logos.cli.main import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, build_parser, main

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_REJECTED", "EXIT_USAGE"]
