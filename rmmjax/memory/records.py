"""What the memory bank stores and returns, its errors, and checks of what callers pass in."""

from __future__ import annotations

import collections
import dataclasses
import sqlite3
from collections.abc import Iterable, Sequence
from typing import NamedTuple, final

import numpy as np

from rmmjax.retrieve.evidence import Fact, RawTurn

_CHUNK = 500  # ids bound per IN (...): SQLite caps the number of bound parameters


class BankError(ValueError):
  """Base of the bank's errors (never raised itself); a ValueError so commands report it."""


@final
class BankFileError(BankError):
  """A file that cannot be used as a memory bank, naming the file, the reason and the remedy."""


@final
class UnknownRecord(BankError):
  """A user, session, turn or memory that the named user does not have."""


@final
class EncoderMismatch(BankError):
  """Embeddings asked for with an encoder other than the one the memories were embedded with."""


@final
class SessionEnded(BankError):
  """A write into a session whose reflection is applied (by this process or another one)."""


@final
class StaleRead(BankError):
  """A reflection computed from rows that another writer changed before it was applied."""


# Who opened a session: only that kind of writer appends to it. "chat" sessions hold the
# agent's exchanges, "ingest" sessions a dataset's, "api" those opened through start_session.
ORIGINS = ("api", "chat", "ingest")
# What a turn is, set by its writer; only statements are evidence (docs/memory.md says why).
KINDS = ("statement", "question", "answer")


@final
@dataclasses.dataclass(frozen=True)
class SessionInfo:
  session_id: str
  date: str
  ordinal: int  # 0 for the user's first session
  ended: bool  # its reflection is applied; it takes no more turns
  origin: str = "api"  # the kind of writer that opened it (ORIGINS)


@final
@dataclasses.dataclass(frozen=True)
class BankTurn:
  turn_id: str
  session_id: str
  speaker: str
  text: str
  date: str  # its session's date
  kind: str = "statement"  # KINDS


@final
class Snippet(NamedTuple):
  """A raw turn that a memory came from, verbatim."""

  turn_id: str
  session_id: str
  date: str
  text: str


@final
@dataclasses.dataclass(frozen=True)
class Memory:
  id: int
  summary: str
  snippets: tuple[Snippet, ...]
  created: float
  updated: float


@final
@dataclasses.dataclass(frozen=True)
class ReflectionInput:
  """What one reflection reads, all from one snapshot of the bank: the session, its turns, the
  user's memories with their embeddings (row i of vectors embeds memories[i]), and the user's
  memory version, which apply_reflection checks before it writes."""

  session: SessionInfo
  turns: list[BankTurn]
  memories: list[Memory]
  vectors: np.ndarray
  version: int


@final
@dataclasses.dataclass(frozen=True)
class NewMemory:
  """A topic memory to add: its summary, the turns it came from, its summary's embedding."""

  summary: str
  turn_ids: Sequence[str]
  embedding: np.ndarray


@final
@dataclasses.dataclass(frozen=True)
class Merge:
  """A merge into an existing memory: the new summary, more turns, the new summary's embedding."""

  memory_id: int
  summary: str
  turn_ids: Sequence[str]
  embedding: np.ndarray


def text_arg(value: object, name: str) -> str:
  if not isinstance(value, str) or not value:
    raise ValueError(f"{name} must be a non-empty string, got {value!r}")
  return value


def turn_rows(turns: Iterable[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
  rows = [(text_arg(t, f"turns[{i}] turn_id"), speaker, text)
          for i, (t, speaker, text) in enumerate(turns)]
  if dup := repeated([r[0] for r in rows]):
    raise ValueError(f"turn ids repeat within one add_turns call: {dup}")
  return rows


def chat_turn_rows(turns: Sequence[tuple[str, ...]]) -> tuple[list[tuple[str, str]], list[str]]:
  """(speaker, text) pairs and their kinds from (speaker, text) or (speaker, text, kind) turns
  (KINDS; a statement when not given)."""
  kinds = [(kind or ["statement"])[0] for _, _, *kind in turns]
  if bad := [(i, k) for i, k in enumerate(kinds) if k not in KINDS]:
    raise ValueError(f"turns[{bad[0][0]}] kind {bad[0][1]!r} is not one of {', '.join(KINDS)}")
  return [(t[0], t[1]) for t in turns], kinds


def vector_arg(value: object, name: str, ndim: int = 1) -> np.ndarray:
  """value as float32 with ndim dimensions, the last one non-empty, every number finite."""
  array = np.asarray(value, np.float32)
  if array.ndim != ndim or array.shape[-1] == 0 or not np.isfinite(array).all():
    what = "a non-empty vector" if ndim == 1 else "an N x D matrix (D > 0)"
    bad = " with NaN or inf" if array.ndim == ndim and array.size else ""
    raise ValueError(f"{name} must be {what} of finite numbers, got shape {array.shape}{bad}")
  return array


def reflection_items(adds: Sequence[NewMemory],
                     merges: Sequence[Merge]) -> tuple[list[NewMemory], list[Merge]]:
  adds, merges = list(adds), list(merges)
  for i, item in enumerate([*adds, *merges]):
    what = f"adds[{i}]" if i < len(adds) else f"merges[{i - len(adds)}]"
    vector_arg(item.embedding, f"{what} embedding")
    if isinstance(item.turn_ids, (str, bytes)):
      raise ValueError(f"{what} turn_ids must be a list of turn ids, got {item.turn_ids!r}")
  return adds, merges


def repeated(values: list) -> list:
  return sorted((v for v, n in collections.Counter(values).items() if n > 1), key=str)[:5]


def select_in(db: sqlite3.Connection, sql: str, params: tuple, values: list) -> list[tuple]:
  """Rows of sql, whose IN ({}) takes values, in chunks."""
  chunks = (values[i:i + _CHUNK] for i in range(0, len(values), _CHUNK))
  return [row for chunk in chunks
          for row in db.execute(sql.format(",".join("?" * len(chunk))), [*params, *chunk])]


# LaceMem's layers as plain values: what LaceMem hands the bank to save and gets back.
@final
@dataclasses.dataclass(frozen=True)
class LaceSnapshot:
  settings: dict
  encoder: str  # the identity of the encoder that embedded the facts ("" when none did)
  fallbacks: int  # turns the LLM extractor handed to the offline one
  turns: list[RawTurn]  # in the order they were added
  facts: list[Fact]  # by fact id, from 0
  vectors: np.ndarray  # N x D float32, row i embedding fact i
  # (fact, neighbour, cosine), each fact's list in rank order (an iterator is read only by a
  # full write, so a save that appends never walks every fact's list)
  links: Iterable[tuple[int, int, float]]
  revision: int = 0  # the bank's count of writes when this was saved (0: not from a bank)


@final
@dataclasses.dataclass(frozen=True)
class LaceSaved:
  """What a LaceMem knows the bank holds of it, since its last load or save."""

  revision: int
  turns: int
  facts: int
