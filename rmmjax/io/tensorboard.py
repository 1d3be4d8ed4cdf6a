"""TensorBoard scalars through tensorboardX (no TensorFlow needed)."""

from __future__ import annotations

import sys
from pathlib import Path

from rmmjax.io.workdir import replace_dir


# tensorboardX is imported without PyTorch: it imports torch where installed (the parity extra
# installs it) only to accept torch tensors, which costs seconds of every training run's start;
# rmmjax writes Python floats. (`import torch` then raises ImportError, which it expects.)
_block_torch = "torch" not in sys.modules
if _block_torch:
  sys.modules["torch"] = None
try:
  from tensorboardX import SummaryWriter  # noqa: E402
finally:
  if _block_torch:
    del sys.modules["torch"]

# Event files are named by the second they were opened in, then by these suffixes: a file of
# appended rows sorts after the rewritten one it continues even when both open in one second.
REWRITTEN_SUFFIX = ".0"
APPENDED_SUFFIX = ".1"


class ScalarWriter:
  """Writes rows of scalars, and the run's config as text at step 0."""

  def __init__(self, logdir: Path, config_json: str | None = None, filename_suffix: str = ""):
    self._writer = SummaryWriter(str(logdir), filename_suffix=filename_suffix)
    if config_json is not None:
      self._writer.add_text("config", f"```\n{config_json}\n```", 0)

  def write_rows(self, rows: list[dict], prefix: str = "train") -> None:
    for row in rows:
      for name, value in row.items():
        if name != "step":
          self._writer.add_scalar(f"{prefix}/{name}", value, row["step"])
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


def rewrite(logdir: Path, runs: dict[str, list[dict]], prefix: str,
            config_json: str | None = None) -> None:
  """Replaces logdir by event files of exactly `runs` (subdirectory -> rows; "" for logdir
  itself), written into a temporary directory that is then swapped in."""
  with replace_dir(logdir) as tmp:
    for name, rows in runs.items():
      writer = ScalarWriter(tmp / name if name else tmp, config_json, REWRITTEN_SUFFIX)
      try:
        writer.write_rows(rows, prefix)
      finally:
        writer.close()  # drains the writer's queue: the file is whole before the swap


def appender(logdir: Path) -> ScalarWriter:
  """A writer that continues the run of logdir (after `rewrite`) in an event file of its own."""
  return ScalarWriter(logdir, filename_suffix=APPENDED_SUFFIX)
