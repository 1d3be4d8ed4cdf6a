"""Command-line arguments that tests build often."""


def sets(*items: str) -> list[str]:
  """--set key=value for each item."""
  return [arg for item in items for arg in ("--set", item)]
