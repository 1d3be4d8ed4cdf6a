"""A run's working directory: its config.json, and files written whole or not at all."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from rmmjax.config import Config, from_json

# Keys a resumed run may change: more steps extend a run without changing its first steps.
EXTENDABLE_KEYS = ("steps",)


def atomic_write_text(path: Path, text: str) -> None:
  """Writes text to path through a temporary file and a rename, so readers never see half."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  try:
    with os.fdopen(fd, "w") as f:
      f.write(text)
    os.replace(tmp, path)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise


def atomic_write_json(path: Path, data) -> None:
  atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def read_config(workdir: Path) -> Config:
  path = Path(workdir) / "config.json"
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist: is {workdir} a training workdir?")
  return from_json(path.read_text())


def check_resumable(workdir: Path, cfg: Config) -> None:
  """Refuses a workdir that holds a run of another config (before anything is written)."""
  path = Path(workdir) / "config.json"
  if not path.exists():
    if (Path(workdir) / "checkpoints").exists():
      raise ValueError(f"{workdir} holds checkpoints but no config.json; use a fresh workdir")
    return
  old = json.loads(from_json(path.read_text()).to_json())  # keys added since: their defaults
  new = json.loads(cfg.to_json())
  diff = {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
          if old.get(k) != new.get(k) and k not in EXTENDABLE_KEYS}
  if diff:
    shown = ", ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in diff.items())
    raise ValueError(f"{workdir} holds a run of another config ({shown}); use a fresh workdir "
                     "or the same settings to resume")
