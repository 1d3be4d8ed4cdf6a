"""The manifest every workdir and export holds, rmmjax.json: its kind, learner, stages and format.
A folder without one, or of another format, is refused in one line rather than guessed at."""

from __future__ import annotations

import json
from pathlib import Path

RUN_FILE = "rmmjax.json"  # the manifest
RECORD_FILE = "record.json"  # what a training workdir's reranker was trained on
# Of the files a workdir or an export holds; a folder of another format is refused. 2: the one
# learner key (a config.json of format 1 names the reranker's family as `variant`).
FORMAT = 2
KINDS = ("train", "sweep", "export")
# Files only a workdir holds (a Hugging Face export has a config.json of its own): beside them
# and no manifest, the folder was written by an earlier rmmjax.
EARLIER = ("run.json", "checkpoints", "sweep.json", "record.json")


def read_json(path: Path, expected: str, where: str | None = None):
  """The JSON value in path, or one line naming the file (as `where`) and why it is not JSON."""
  try:
    return json.loads(Path(path).read_text())
  except (UnicodeDecodeError, ValueError) as err:
    raise ValueError(f"{where or path} is not JSON ({err}); {expected}") from None


def read_run_record(folder: Path) -> dict | None:
  """The manifest of a workdir or an export; None for a folder without one (a fresh workdir).
  A run's files without one (an earlier rmmjax's), or another format, is refused."""
  folder = Path(folder)
  if folder.exists() and not folder.is_dir():
    raise ValueError(f"workdir {folder} is a file; expected a directory (or a path to create)")
  path = folder / RUN_FILE
  if not path.exists():
    earlier = [n for n in EARLIER if (folder / n).exists()]
    if earlier:
      raise another_format(f"{folder} holds a run's files ({earlier[0]}) but", 0,
                           "train or sweep into a fresh workdir")
    return None
  record = read_json(path, "expected the folder's manifest")
  if not isinstance(record, dict) or (record.get("format") == FORMAT
                                      and record.get("kind") not in KINDS):
    raise ValueError(f"{path}: expected a \"kind\" of {', '.join(KINDS)}")
  if record.get("format") != FORMAT:
    raise another_format(str(folder), record.get("format"), "export its training workdir again"
                         if record.get("kind") == "export" else "train or sweep into a fresh "
                         "workdir")
  return record


def another_version(where: str, written: str, reads: str, again: str,
                    error: type[ValueError] = ValueError) -> ValueError:
  """The one-line refusal of a file or folder of another format (none older is read), naming
  both ("format 2", "schema version 3"); `again` says what to do."""
  return error(f"{where} was written in rmmjax's {written}; this rmmjax reads {reads}; {again}")


def another_format(where: str, written, again: str) -> ValueError:
  """another_version's refusal of another manifest format (0: before folders held one)."""
  if written == 0:
    return ValueError(f"{where} no {RUN_FILE}: written by an earlier rmmjax (format 0; this one "
                      f"reads format {FORMAT}); {again}")
  return another_version(where, f"format {written!r}", f"format {FORMAT}", again)


def stopped_in_first_stage(workdir: Path) -> FileNotFoundError | None:
  """The refusal of a two-stage run that stopped in its first stage (whose workdir inside it
  holds the only files yet); None for any other folder."""
  stage = Path(workdir) / "query_encoder"
  if not (stage / "config.json").exists():
    return None
  return FileNotFoundError(f"{workdir} is a two-stage run that stopped in its first stage (its "
                           f"query encoder, in {stage}): run the same train command again to "
                           "finish it")
