"""The one schema every loader produces, and the report of what a loader repaired or dropped."""

from __future__ import annotations

import collections
import dataclasses
import json

CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop",
                  5: "adversarial"}


@dataclasses.dataclass(frozen=True)
class Turn:
  turn_id: str  # unique within its conversation, e.g. "D3:7"
  speaker: str
  text: str
  caption: str = ""  # image turns: a caption of the shared image


@dataclasses.dataclass(frozen=True)
class Session:
  session_id: str
  date: str
  turns: tuple[Turn, ...]


@dataclasses.dataclass(frozen=True)
class Question:
  question: str
  answer: str
  evidence: tuple[str, ...]  # turn ids that hold the answer
  category: str


@dataclasses.dataclass(frozen=True)
class Conversation:
  conversation_id: str
  sessions: tuple[Session, ...]
  questions: tuple[Question, ...]
  personas: tuple[tuple[str, ...], ...] = ()  # per-speaker facts, where a dataset has them (MSC)

  def turn_ids(self) -> set[str]:
    return {t.turn_id for s in self.sessions for t in s.turns}


class MalformedData(ValueError):
  """A file that cannot be read as the dataset, naming the file, record and field."""


_KINDS = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list",
          dict: "an object", type(None): "null"}

# The JSON types a field may hold, with the words a message uses for them.
Kind = tuple[tuple[type, ...], str]
STRING = ((str,), "a string")
LIST = ((list,), "a list")
OBJECT = ((dict,), "an object")
SCALAR = ((str, int, float), "a string or a number")


def describe(value: object) -> str:
  """A JSON value as a message shows it: its type and, abridged, the value."""
  kind = _KINDS.get(type(value), type(value).__name__)
  if value is None:
    return kind
  # (a scalar as the file writes it: true, "D1:3")
  text = (_abridged(value) if isinstance(value, (list, dict))
          else json.dumps(value, ensure_ascii=False, default=repr))
  if len(text) > 60:
    text = text[:57] + "..."
  return f"{kind} ({text})"


def _abridged(value: list | dict) -> str:
  if isinstance(value, list):
    items = json.dumps(value, ensure_ascii=False, default=repr)
    return f"{len(value)} item{'s' * (len(value) != 1)}: {items}" if value else "[]"
  return f"keys {', '.join(map(str, list(value)[:6]))}" if value else "{}"


def check(value: object, kind: Kind, name: str, where: str, path,
          expected: str | None = None) -> object:
  """value if its JSON type is one of kind's (a boolean is no number here); otherwise a
  MalformedData naming the file, the record, the field, the value and what was expected."""
  types, words = kind
  if isinstance(value, types) and not (isinstance(value, bool) and bool not in types):
    return value
  raise MalformedData(f"{path}: {where}: {name} is {describe(value)}; expected "
                      f"{expected or words}")


def require(record: dict, key: str, where: str, path, kind: Kind | None = None,
            expected: str | None = None) -> object:
  """record[key], checked against kind when given, or a MalformedData naming the file, the
  record and the missing field (a null counts as missing) and what was expected."""
  if not isinstance(record, dict):
    raise MalformedData(f"{path}: {where} is {describe(record)}, not an object (with a field "
                        f"{key!r})")
  if record.get(key) is None:
    wanted = f"; expected {expected or kind[1]}" if expected or kind else ""
    raise MalformedData(f"{path}: {where}: missing field {key!r}{wanted}")
  if kind is None:
    return record[key]
  return check(record[key], kind, f"field {key!r}", where, path, expected)


def optional(record: dict, key: str, where: str, path, kind: Kind, default: object,
             expected: str | None = None) -> object:
  """record[key] checked against kind, or default where it is absent or null."""
  value = record.get(key)
  if value is None:
    return default
  return check(value, kind, f"field {key!r}", where, path, expected)


@dataclasses.dataclass
class LoadReport:
  """Counts of every repair and drop a loader made, with an example of each."""

  counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  examples: dict = dataclasses.field(default_factory=dict)

  def note(self, what: str, example: str) -> None:
    self.counts[what] += 1
    self.examples.setdefault(what, example)
