"""What iterative evidence retrieval (IRIS) reads: a store of atomic facts (the Index layer),
links between them (the Edge layer) and the verbatim turns they came from (the Raw layer).

`rmmjax.memory.lace.LaceMem` implements it; IRIS (rmmjax.retrieve.iris) codes against this
protocol only, so retrieval never imports the memory layer above it.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Fact:
  """An Index-layer entry: one atomic statement, linked to the turn it came from."""

  fact_id: int
  subject: str
  predicate: str
  object: str
  time: str  # the session date (or a time the statement names)
  turn_id: str  # its source turn in the Raw layer
  session_id: str
  text: str  # the statement as indexed, e.g. "[8 May 2023] Caroline: went to a support group"


@dataclasses.dataclass(frozen=True)
class RawTurn:
  """A Raw-layer entry: a verbatim turn with its session and date."""

  turn_id: str
  session_id: str
  date: str
  speaker: str
  text: str


def turn_prompt_text(raw: RawTurn) -> str:
  """A turn as the generator sees it: "[date] speaker: text"."""
  return f"[{raw.date}] {raw.speaker}: {raw.text}" if raw.date else f"{raw.speaker}: {raw.text}"


class EvidenceStore(Protocol):
  """One conversation's (one user's) layered memory, read-only for retrieval."""

  def search(self, query: str, k: int) -> list[tuple[int, float]]:
    """The k facts most relevant to the query: (fact_id, score), best first."""

  def search_vector(self, vector, k: int, bm25_query: str) -> list[tuple[int, float]]:
    """The k facts ranked by their embeddings' dot product with `vector` (fused with BM25 over
    `bm25_query` when the store is hybrid): the search of a `VectorRefiner`'s query."""

  def query_vector(self, query: str):
    """The query's embedding (D,) as the store's dense search computes it."""

  def fact(self, fact_id: int) -> Fact:
    """The fact with this id."""

  def neighbours(self, fact_id: int, min_weight: float) -> list[tuple[int, float]]:
    """Facts linked to this one by an edge of at least min_weight: (fact_id, weight)."""

  def raw(self, turn_id: str) -> RawTurn:
    """The verbatim turn a fact came from."""

  def facts_about(self, entity: str) -> list[int]:
    """Ids of the facts whose subject or object names the entity (case-insensitive)."""
