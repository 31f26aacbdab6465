"""The package version, in one place (``logos.__version__``; stamped into record headers and evaluation reports)."""

VERSION = "0.1.0"
