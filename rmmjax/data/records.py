"""Reading a dataset file's records through Hugging Face `datasets`.

JSON lists (LoCoMo, LongMemEval) and JSON Lines (MSC) alike come back as a list of plain
records, exactly as written (nested objects, per-record keys and mixed value types are kept),
for the loaders to check and convert. Nothing is cached on disk: the Arrow table lives in a
temporary folder for the duration of the read.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rmmjax.data.schema import MalformedData


def read_records(path: Path, expected: str) -> list[dict]:
  """The records of a JSON list or JSON Lines file; MalformedData naming the file otherwise."""
  import datasets  # noqa: PLC0415  (slow to import: only when a dataset is read)
  path = Path(path)
  if not path.exists():
    raise FileNotFoundError(f"{path} does not exist (expected {expected})")
  if path.stat().st_size == 0:
    raise MalformedData(f"{path}: empty file (expected {expected})")
  datasets.disable_progress_bars()
  with tempfile.TemporaryDirectory() as cache:
    try:
      table = datasets.load_dataset("json", data_files=str(path), split="train",
                                    cache_dir=cache, keep_in_memory=True)
    except Exception as err:  # noqa: BLE001  (datasets wraps parser errors in several types)
      cause = err.__cause__ or err
      raise MalformedData(f"{path}: not JSON records ({type(cause).__name__}: "
                          f"{str(cause).splitlines()[0] if str(cause) else ''}); expected "
                          f"{expected}") from None
    return table.to_list()
