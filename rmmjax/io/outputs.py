"""Checks of output paths the user names, made before any work so a long run never ends in an
error about where its results were to go."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path


def can_create_in(directory: Path) -> bool:
  """Whether a file can really be created in the directory: permission bits are not enough
  (root ignores them; /proc and read-only mounts refuse whatever they say)."""
  try:
    with tempfile.NamedTemporaryFile(dir=directory, prefix=".rmmjax-write-check-"):
      return True
  except OSError:
    return False


def _check_output(path: str | Path, flag: str, directory: bool) -> Path:
  """A file (or directory) path that can be written: not a directory (a file), under a writable
  directory."""
  path = Path(path)
  if path.exists() and path.is_dir() != directory:
    raise ValueError(f"{flag} {path} is a {'file' if directory else 'directory'}; expected a "
                     f"{'directory' if directory else 'file name'}")
  start = path if directory else path.parent
  base = next((p for p in [start, *start.parents] if p.exists()), Path("."))
  if not base.is_dir():
    raise ValueError(f"{flag} {path}: {base} is a file, so no directory can be made there")
  if not os.access(base, os.W_OK | os.X_OK) or not can_create_in(base):
    raise ValueError(f"{flag} {path}: {base} is not writable")
  if path.exists() and not os.access(path, os.W_OK):
    raise ValueError(f"{flag} {path} exists and is not writable")
  return path


check_output_file = functools.partial(_check_output, directory=False)
check_output_dir = functools.partial(_check_output, directory=True)


def check_export_dir(out: str | Path, holds: str) -> Path:
  """--out for an export written as a directory, `holds` saying what it writes and so why it
  cannot be one .safetensors file (a reranker's export can)."""
  if Path(out).suffix == ".safetensors":
    raise ValueError(f"--out {out}: {holds}, not one .safetensors file; give a directory name")
  return check_output_dir(out, "--out")
