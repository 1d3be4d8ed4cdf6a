"""TensorBoard scalars through tensorboardX (no TensorFlow needed)."""

from __future__ import annotations

from pathlib import Path

from tensorboardX import SummaryWriter


class ScalarWriter:
  """Writes rows of scalars, and the run's config as text at step 0."""

  def __init__(self, logdir: Path, config_json: str | None = None):
    self._writer = SummaryWriter(str(logdir))
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
