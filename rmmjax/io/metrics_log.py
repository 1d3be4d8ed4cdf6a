"""metrics.jsonl: one JSON object per logged step, rewound on resume to the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from rmmjax.io.workdir import atomic_write_text


def read_rows(path: Path) -> list[dict]:
  path = Path(path)
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rewind(path: Path, upto_step: int) -> list[dict]:
  """Keeps only the rows of steps up to `upto_step` (work after a checkpoint is redone)."""
  rows = [r for r in read_rows(path) if r["step"] <= upto_step]
  atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
  return rows


def append_rows(path: Path, rows: list[dict]) -> None:
  with open(path, "a") as f:
    for row in rows:
      f.write(json.dumps(row) + "\n")
