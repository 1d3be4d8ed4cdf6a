"""The `rmmjax` command (`rmmjax.cli.main:command`, or `python -m rmmjax.cli`); `main(argv)`
runs one command line and returns its exit status."""

from rmmjax.cli.main import main

__all__ = ["main"]
