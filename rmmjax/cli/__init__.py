"""The `rmmjax` command (`rmmjax.cli:main`, or `python -m rmmjax.cli`)."""

from rmmjax.cli.main import main

__all__ = ["main"]
