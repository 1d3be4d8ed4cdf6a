"""The one schema every loader produces, and the report of what a loader repaired or dropped."""

from __future__ import annotations

import collections
import dataclasses

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


def require(record: dict, key: str, where: str, path) -> object:
  """record[key], or a MalformedData naming the file, the record and the missing field (a null
  counts as missing)."""
  if not isinstance(record, dict) or record.get(key) is None:
    raise MalformedData(f"{path}: {where}: missing field {key!r}")
  return record[key]


@dataclasses.dataclass
class LoadReport:
  """Counts of every repair and drop a loader made, with an example of each."""

  counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  examples: dict = dataclasses.field(default_factory=dict)

  def note(self, what: str, example: str) -> None:
    self.counts[what] += 1
    self.examples.setdefault(what, example)

  def summary(self) -> str:
    if not self.counts:
      return "no repairs or drops"
    return "; ".join(f"{what}: {n} (e.g. {self.examples[what]})"
                     for what, n in sorted(self.counts.items()))
