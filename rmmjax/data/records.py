"""Reading a dataset file's records: a JSON list (LoCoMo, LongMemEval) or JSON Lines (MSC).

Records come back exactly as written, every value with its JSON type, for the loaders to check:
hence the standard `json` module, not a columnar reader (docs/command-line.md, Loaders).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from rmmjax.data.schema import MalformedData, describe

_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace


def read_records(path: str | Path, expected: str, noun: str = "records") -> list[dict]:
  """The records of a JSON list or JSON Lines file; otherwise a MalformedData naming the file and
  ending with `expected`, what it should be (`noun` names the records in an empty list's)."""
  path = Path(path)
  text = _text(path, expected)
  start = _SPACE.match(text).end()
  if start == len(text):
    what = "an empty file" if not text else f"only whitespace ({len(text)} characters)"
    raise MalformedData(f"{path}: {what}; expected {expected}")

  def refuse(name: str) -> None:
    raise MalformedData(f"{path}: holds {name}, which is not a JSON value; expected {expected}")

  decoder = json.JSONDecoder(parse_constant=refuse)  # Python's json reads NaN, Infinity
  if text[start] == "[":
    try:
      items, lines = decoder.decode(text), None
    except json.JSONDecodeError as err:
      raise MalformedData(f"{path}: not JSON ({_json_error(err)}); expected {expected}") from None
    if not items:
      raise MalformedData(f"{path}: no {noun} (an empty list); expected {expected}")
  elif text[start] == "{":
    items, lines = _json_lines(path, text, start, expected, decoder)
  else:
    raise MalformedData(f"{path}: not JSON records: the file starts with "
                        f"{text[start:start + 30].splitlines()[0]!r}, not '[' (a JSON list) or "
                        f"'{{' (JSON Lines); expected {expected}")
  for i, item in enumerate(items):
    if not isinstance(item, dict):
      where = f"record {i}" + (f" (line {lines[i]})" if lines else "")
      raise MalformedData(f"{path}: {where} is {describe(item)}, not an object; "
                          f"expected {expected}")
  return items


def _text(path: Path, expected: str) -> str:
  """The file's text; a missing path, a directory, an unreadable or non-UTF-8 file named as
  such."""
  if not path.exists():
    where = "" if path.parent.is_dir() else f" (nor does its folder {path.parent})"
    raise FileNotFoundError(f"{path} does not exist{where}; expected {expected}")
  if path.is_dir():
    inside = sorted(p.name for p in path.iterdir()
                    if p.is_file() and p.suffix in (".json", ".jsonl", ".txt"))[:5]
    holds = f"; it holds {', '.join(inside)}" if inside else ""
    raise MalformedData(f"{path} is a directory, not a file{holds}; expected {expected}")
  if not path.is_file():
    raise MalformedData(f"{path} is not a regular file; expected {expected}")
  try:
    data = path.read_bytes()
  except OSError as err:
    why = "permission denied" if isinstance(err, PermissionError) else err.strerror or err
    raise MalformedData(f"{path} cannot be read ({why}); expected {expected}") from None
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as err:
    raise MalformedData(f"{path}: not UTF-8 text (byte {data[err.start]:#04x} at offset "
                        f"{err.start}; a compressed file must be unpacked first); expected "
                        f"{expected}") from None


def _json_error(err: json.JSONDecodeError) -> str:
  """What and where: "Expecting ',' delimiter at line 3, column 5" (some of json's messages,
  "Unterminated string starting at", already end in "at")."""
  return f"{err.msg.removesuffix(' at')} at line {err.lineno}, column {err.colno}"


def _json_lines(path: Path, text: str, start: int, expected: str,
                decoder: json.JSONDecoder) -> tuple[list, list[int]]:
  """The JSON values of a JSON Lines file (one a line, or each spread over several lines), with
  the line each starts on."""
  items, lines = [], []
  line, counted = 1, 0
  pos = start
  while pos < len(text):
    line += text.count("\n", counted, pos)
    counted = pos
    try:
      item, pos = decoder.raw_decode(text, pos)
    except json.JSONDecodeError as err:
      raise MalformedData(f"{path}: record {len(items)} (line {line}) is not JSON "
                          f"({_json_error(err)}); expected {expected}") from None
    items.append(item)
    lines.append(line)
    pos = _SPACE.match(text, pos).end()
  return items, lines
