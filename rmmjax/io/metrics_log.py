"""metrics.jsonl: one JSON object per logged step, rewound on resume to the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rmmjax.io.workdir import atomic_write_text


def read_rows(path: Path) -> list[dict]:
  """The logged rows; an unreadable last line (an append cut short by a kill) is dropped, an
  unreadable line before it is refused, naming the file and line."""
  path = Path(path)
  if not path.exists():
    return []
  lines = path.read_bytes().split(b"\n")
  if lines[-1] == b"":
    lines.pop()  # the newline that ends the last row
  rows = []
  for number, line in enumerate(lines, 1):
    try:
      row = json.loads(line)  # bytes that are not UTF-8 raise a ValueError too
      if not isinstance(row, dict) or not isinstance(row.get("step"), int):
        raise ValueError("expected an object with an integer \"step\"")
    except ValueError as err:
      if number == len(lines):
        break  # rows are appended before the checkpoint they lead to: this one is redone
      raise ValueError(f"{path}, line {number}: not a metrics row ({err}); only the last line "
                       "may be cut short, so the file is damaged: use a fresh workdir") from None
    rows.append(row)
  return rows


def rewind(path: Path, upto_step: int, rows: list[dict]) -> list[dict]:
  """Writes the rows of steps up to `upto_step` alone: work after a checkpoint is redone."""
  rows = [r for r in rows if r["step"] <= upto_step]
  atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
  return rows


def append_rows(path: Path, rows: list[dict]) -> None:
  with open(path, "a") as f:
    f.writelines(json.dumps(row) + "\n" for row in rows)


def window_means(metrics_T: dict, start_step: int, log_every: int) -> list[dict]:
  """Per-step metrics -> one row per window of log_every steps, labelled by its last step."""
  num = len(next(iter(metrics_T.values())))
  return [{"step": start_step + min(lo + log_every, num)}
          | {k: float(np.mean(v[lo:lo + log_every])) for k, v in sorted(metrics_T.items())}
          for lo in range(0, num, log_every)]


def check_finite(metrics_T: dict, start_step: int) -> None:
  for name, values in metrics_T.items():
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
      raise FloatingPointError(f"{name} became {values[bad[0]]} at step {start_step + bad[0] + 1}")


def kept_rows(log_path: Path, logged: list[dict], step: int, log_every: int) -> list[dict]:
  """The logged rows up to the checkpoint's step, which must be one every log_every steps."""
  rows = [r for r in logged if r["step"] <= step]
  if [r["step"] for r in rows] != list(range(log_every, step + 1, log_every)):
    raise ValueError(f"{log_path} does not hold one row every {log_every} steps up to the "
                     f"checkpoint at step {step}; use a fresh workdir")
  return rows
