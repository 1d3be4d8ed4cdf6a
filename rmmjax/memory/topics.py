"""What a reflector is (it extracts topics, then decides add or merge), and the offline one.

The offline reflector needs no model. A session is cut into topics where a turn stops resembling
the topic so far, and a topic's summary is its own turns, verbatim, under the session's date:
questions name people and dates, and on LoCoMo a unit reading "[date] Speaker: ..." is found far
more often than the bare utterance.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
from collections.abc import Sequence
from typing import final

import numpy as np

from rmmjax.encode.protocol import Encoder
from rmmjax.llm.parse import Topic
from rmmjax.memory.records import BankTurn


@final
@dataclasses.dataclass(frozen=True)
class Extraction:
  """The topics a reflector found in one session, and what it had to leave out."""

  topics: tuple[Topic, ...]
  dropped_turn_ids: int = 0  # turn ids named that are not the session's
  dropped_topics: int = 0  # topics without a summary or without any of the session's turns
  fallbacks: int = 0  # unusable replies replaced by a fallback (or by nothing)


@final
@dataclasses.dataclass(frozen=True)
class Candidate:
  """A memory shown to an add-or-merge decision; candidates come most similar first."""

  summary: str
  similarity: float  # cosine of its embedding and the new topic's summary embedding
  turns: int  # snippets it holds, counting those merged into it earlier in this reflection


@final
@dataclasses.dataclass(frozen=True)
class Decision:
  """Add the topic (position None), or merge it into candidates[position] with a new summary."""

  position: int | None
  summary: str | None = None
  fell_back: bool = False  # the decision's reply was unusable and "add" was chosen for it


ADD = Decision(None)


class Reflector(abc.ABC):
  """Extracts topics from a session and decides whether each one is added or merged."""

  @abc.abstractmethod
  def extract(self, turns: Sequence[BankTurn], date: str) -> Extraction:
    """Topic memories of one session's turns (held on `date`), each naming its turns."""

  @abc.abstractmethod
  def decide(self, topic: Topic, candidates: Sequence[Candidate]) -> Decision:
    """Add `topic`, or merge it into one of the (non-empty) candidates."""


def turn_text(turn: BankTurn, date: str) -> str:
  """A turn as one dated line; the same text as a turn unit's, so its embedding is shared."""
  return f"[{date}] {turn.speaker}: {turn.text}"


def segment(vectors: np.ndarray, *, split_below: float, min_turns: int,
            max_turns: int) -> list[range]:
  """Consecutive ranges of rows covering every row once: a new range starts at a row whose
  cosine to the current range's centroid (so one off-topic reply does not end it) is below
  `split_below` once the range has min_turns rows, and always when it has max_turns."""
  vectors = np.asarray(vectors, np.float32)
  if not (n := len(vectors)):
    return []
  ranges, start, total = [], 0, vectors[0].astype(np.float64)
  for i in range(1, n):
    length = i - start
    cosine = float(vectors[i] @ total) / max(
        float(np.linalg.norm(vectors[i]) * np.linalg.norm(total)), 1e-12)
    if length >= max_turns or (length >= min_turns and cosine < split_below):
      ranges.append(range(start, i))
      start, total = i, np.zeros_like(total)
    total = total + vectors[i]
  ranges.append(range(start, n))
  # A short tail is the end of the topic before it more often than a topic of its own.
  if len(ranges) > 1 and len(ranges[-1]) < min_turns and (
      len(ranges[-2]) + len(ranges[-1]) <= max_turns):
    ranges[-2:] = [range(ranges[-2].start, n)]
  return ranges


def extractive_summary(turns: Sequence[BankTurn], date: str) -> str:
  return f"[{date}] " + "\n".join(f"{t.speaker}: {t.text}" for t in turns)


@final
class OfflineReflector(Reflector):
  """Embedding-based topic segmentation (`segment`), extractive summaries and a similarity
  merge rule (`decide`).

  split_below 0.6 cuts LoCoMo sessions (22 turns on average) into topics of about 5 turns with
  all-MiniLM-L6-v2, whose cosines between dated turns of one session are mostly 0.5-0.8.
  max_merged_turns caps the turns one memory holds, so summaries stay readable.
  """

  def __init__(self, encoder: Encoder, *, split_below: float = 0.6, min_turns: int = 2,
               max_turns: int = 12, merge_at: float = 0.85, max_merged_turns: int = 36):
    self.encoder = encoder
    self.split_below, self.min_turns, self.max_turns = split_below, min_turns, max_turns
    self.merge_at, self.max_merged_turns = merge_at, max_merged_turns

  def with_encoder(self, encoder: Encoder) -> OfflineReflector:
    """The same reflector embedding turns with another encoder (a memo of the same one)."""
    other = copy.copy(self)
    other.encoder = encoder
    return other

  def extract(self, turns: Sequence[BankTurn], date: str) -> Extraction:
    if not turns:
      return Extraction(())
    vectors = np.asarray(self.encoder.encode([turn_text(t, date) for t in turns]), np.float32)
    parts = segment(vectors, split_below=self.split_below, min_turns=self.min_turns,
                    max_turns=self.max_turns)
    return Extraction(tuple(Topic(extractive_summary([turns[i] for i in part], date),
                                  tuple(turns[i].turn_id for i in part)) for part in parts))

  def decide(self, topic: Topic, candidates: Sequence[Candidate]) -> Decision:
    """Merge into the most similar candidate at or above merge_at (the cosine of the summaries'
    embeddings) that has room for the topic's turns, else add."""
    for position, candidate in enumerate(candidates):
      if candidate.similarity < self.merge_at:
        break
      if candidate.turns + len(topic.turn_ids) <= self.max_merged_turns:
        # Extractive: the merged summary is both texts, the older first, each under its date.
        return Decision(position, f"{candidate.summary}\n{topic.summary}")
    return ADD
