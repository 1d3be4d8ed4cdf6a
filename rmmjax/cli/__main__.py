"""`python -m rmmjax.cli`."""

from rmmjax.cli.main import command

command()
