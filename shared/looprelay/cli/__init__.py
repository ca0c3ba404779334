"""The ``looprelay`` command line."""

from looprelay.cli.root import cli, main

__all__ = ["cli", "main"]
