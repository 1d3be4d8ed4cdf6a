"""LaceMem: a layered memory of one conversation (one user), built turn by turn or at once.

Index: atomic facts cut from each turn (`facts.py`), embedded. Edge: same-turn and same-session
links between facts at most `session_window` apart in their session (linear, not quadratic, in
a long session), and semantic ones (`links.py`); a pair linked twice keeps the larger weight.
Raw: the verbatim turns. Streaming and batch builds give identical layers, bit for bit, whenever
the encoder embeds a text alike alone and in a batch (a padded BERT batch may move a vector by
~1e-7; its embedding cache removes even that).
"""

from __future__ import annotations

import dataclasses
import re
from typing import final

import numpy as np

from rmmjax.data.schema import Conversation
from rmmjax.encode.protocol import Encoder
from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.ingest import bank_text
from rmmjax.memory.lace.facts import turn_drafts
from rmmjax.memory.lace.links import SemanticGraph, snap
from rmmjax.memory.lace.settings import LaceSettings, fact_text
from rmmjax.memory.records import EncoderMismatch, LaceSaved, LaceSnapshot, UnknownRecord
from rmmjax.retrieve.bm25 import BM25Retriever
from rmmjax.retrieve.evidence import Fact, RawTurn
from rmmjax.retrieve.fusion import rrf_scores

RECENT_QUERIES = 4  # query embeddings a LaceMem remembers (an IRIS call asks up to 3 texts)


@final
class LaceMem:
  """Index, Edge and Raw layers of one conversation; an EvidenceStore for iterative retrieval."""

  def __init__(self, encoder: Encoder | None, *, settings: LaceSettings | None = None):
    self.encoder = encoder
    self.query_encoder: Encoder | None = None  # embeds queries in place of `encoder` when set
    self.settings = LaceSettings() if settings is None else settings
    self._facts: list[Fact] = []
    self._raw: dict[str, RawTurn] = {}
    self._session_dates: dict[str, str] = {}
    self._session_facts: dict[str, list[int]] = {}  # fact ids of each session, in order
    self._session_pos: list[int] = []  # each fact's place in its session's list
    self._graph: SemanticGraph | None = None  # created with the first vectors (their size)
    self._bm25: BM25Retriever | None = None
    self._bm25_size = 0  # facts the BM25 index covers; rebuilt when the Index layer grows
    self.fallbacks = 0  # turns an LLM extractor handed to the offline one, as saved
    self._saved: LaceSaved | None = None  # what the bank holds of it, if it came from one
    # The last few queries embedded, text -> vector, with the encoder that embedded them: IRIS
    # asks again for the question between searches of refined queries (its reranker does).
    self._recent_queries: dict[str, np.ndarray] = {}
    self._recent_encoder: Encoder | None = None

  # -- building ---------------------------------------------------------------------------

  def _check_raw(self, raw: RawTurn) -> RawTurn:
    if raw.turn_id in self._raw:
      raise ValueError(f"turn {raw.turn_id!r} is already in this LaceMem (session "
                       f"{self._raw[raw.turn_id].session_id!r}); turn ids must be unique")
    known = self._session_dates.get(raw.session_id, raw.date)
    if known != raw.date:
      raise ValueError(f"session {raw.session_id!r} has date {known!r}, but turn "
                       f"{raw.turn_id!r} gives {raw.date!r}; a session has one date")
    return raw

  def _fill(self, turns: list[RawTurn], facts: list[Fact]) -> None:
    """Adds turns, then facts (ids continuing this LaceMem's), to the layers' lists."""
    for turn in turns:
      self._raw[self._check_raw(turn).turn_id] = turn
      self._session_dates.setdefault(turn.session_id, turn.date)
    for fact in facts:
      self._facts.append(fact)
      in_session = self._session_facts.setdefault(fact.session_id, [])
      self._session_pos.append(len(in_session))
      in_session.append(fact.fact_id)

  def _new_graph(self, vectors: np.ndarray) -> SemanticGraph:
    s = self.settings
    return SemanticGraph.build(vectors, min_cosine=s.min_cosine, max_neighbours=s.max_semantic,
                               chunk=s.chunk)

  def add_turn(self, turn_id: str, session_id: str, date: str, speaker: str,
               text: str) -> list[int]:
    """Adds one turn to every layer at once (`add_turns`); returns its new facts' ids."""
    return self.add_turns([(turn_id, session_id, date, speaker, text)])

  def add_turns(self, turns: list[tuple[str, str, str, str, str]]) -> list[int]:
    """Adds turns (turn_id, session_id, date, speaker, text), in order, with one encoder call:
    the layers of adding them one by one. Returns their new facts' ids; nothing is added when
    any fails (a repeated turn id, an encoder error)."""
    raws, facts, dates = {}, [], {}
    for turn in turns:
      raw = self._check_raw(RawTurn(*turn))
      if raw.turn_id in raws or dates.setdefault(raw.session_id, raw.date) != raw.date:
        raise ValueError(f"turn {raw.turn_id!r} repeats a turn id, or gives session "
                         f"{raw.session_id!r} another date, among the turns added together")
      raws[raw.turn_id] = raw
      start = len(self._facts) + len(facts)
      facts += [Fact(start + n, d.subject, d.predicate, d.object, raw.date, raw.turn_id,
                     raw.session_id, fact_text(raw.date, raw.speaker, d.clause))
                for n, d in enumerate(turn_drafts(raw.speaker, raw.text))]
    vectors = self.encoder.encode([f.text for f in facts]) if facts else None
    if vectors is not None:  # checked (snapped to the grid) before anything changes
      vectors = snap(vectors) if self._graph is None else self._graph.check(vectors)
    self._fill(list(raws.values()), facts)
    if vectors is not None and self._graph is None:
      self._graph = self._new_graph(vectors)
    elif vectors is not None:
      self._graph.add(vectors)
    return [f.fact_id for f in facts]

  @classmethod
  def from_conversation(cls, conversation: Conversation, encoder: Encoder, *,
                        settings: LaceSettings | None = None) -> LaceMem:
    """All turns at once (`add_turns`): one encoder call, one blocked linking pass."""
    lace = cls(encoder, settings=settings)
    lace.add_turns([(t.turn_id, s.session_id, s.date, t.speaker, bank_text(t))
                    for s in conversation.sessions for t in s.turns])
    return lace

  @classmethod
  def from_facts(cls, turns: list[RawTurn], facts: list[Fact], vectors: np.ndarray, *,
                 settings: LaceSettings | None = None) -> LaceMem:
    """Layers from facts made elsewhere (ids 0..N-1, each naming one of the turns) and their
    embeddings (N x D), linked in one batch (no encoder: it cannot add turns)."""
    lace = cls(None, settings=settings)
    lace._fill(turns, facts)
    if facts:
      lace._graph = lace._new_graph(vectors)
    return lace

  # -- the EvidenceStore protocol --------------------------------------------------------

  def __len__(self) -> int:
    return len(self._facts)

  def fact(self, fact_id: int) -> Fact:
    if not isinstance(fact_id, (int, np.integer)) or not 0 <= fact_id < len(self._facts):
      raise UnknownRecord(f"this LaceMem has no fact {fact_id!r}; ids run from 0 to "
                          f"{len(self._facts) - 1}")
    return self._facts[int(fact_id)]

  def raw(self, turn_id: str) -> RawTurn:
    return self._raw[turn_id]

  def neighbours(self, fact_id: int, min_weight: float) -> list[tuple[int, float]]:
    """Facts linked to this one by an edge of at least min_weight, heaviest first."""
    fact = self.fact(fact_id)
    fact_id, s = int(fact_id), self.settings
    found: dict[int, float] = {}
    if self._graph is not None:
      found.update(self._graph.linked(fact_id, s.semantic_rule))
    session, at = self._session_facts[fact.session_id], self._session_pos[fact_id]
    for other in session[max(0, at - s.session_window):at + s.session_window + 1]:
      if other != fact_id:
        weight = s.same_turn if self._facts[other].turn_id == fact.turn_id else s.same_session
        found[other] = max(weight, found.get(other, weight))
    return sorted(((j, w) for j, w in found.items() if w >= min_weight),
                  key=lambda item: (-item[1], item[0]))

  def facts_about(self, entity: str) -> list[int]:
    pattern = re.compile(rf"(?<!\w){re.escape(entity.strip())}(?!\w)", re.IGNORECASE)
    return [f.fact_id for f in self._facts if pattern.search(f.subject) or pattern.search(f.object)]

  def search(self, query: str, k: int) -> list[tuple[int, float]]:
    bm25 = self.settings.retrieval == "bm25" or not self._facts  # no query embedding needed
    return self.search_vector(None if bm25 else self.query_vector(query), k, query)

  def search_vector(self, vector: np.ndarray | None, k: int,
                    bm25_query: str) -> list[tuple[int, float]]:
    """The k facts ranked by their embeddings' dot product with `vector`, fused with BM25 over
    `bm25_query` under hybrid retrieval (BM25 alone ignores the vector)."""
    mode, n = self.settings.retrieval, len(self._facts)
    if not n:
      return []
    if mode != "bm25":
      dense = self._graph.vectors @ np.asarray(vector, np.float32)
    if mode == "dense":
      final_scores = dense
    elif mode == "bm25":
      final_scores = self._bm25_scores(bm25_query)
    else:  # BM25 is credited only with facts that share a term with the query
      bm25 = self._bm25_scores(bm25_query)
      matched = np.flatnonzero(bm25 > 0)
      final_scores = rrf_scores([matched[np.lexsort((matched, -bm25[matched]))],
                                 np.argsort(-dense, kind="stable")], n, self.settings.fusion_c)
    order = np.argsort(-final_scores, kind="stable")[:min(k, n)]
    return [(int(i), float(final_scores[i])) for i in order]

  def query_vector(self, query: str) -> np.ndarray:
    """The query's embedding (D,) as dense search computes it (the query encoder, if set);
    read-only, and remembered among the last RECENT_QUERIES queries."""
    encoder = self.query_encoder or self.encoder
    if self._recent_encoder is not encoder:
      self._recent_queries, self._recent_encoder = {}, encoder
    recent = self._recent_queries
    if query in recent:
      recent[query] = recent.pop(query)  # now the most recent
    else:
      vector = np.asarray(encoder.encode([query]), np.float32)[0]
      vector.flags.writeable = False
      recent[query] = vector
      if len(recent) > RECENT_QUERIES:
        del recent[next(iter(recent))]  # the least recently asked
    return recent[query]

  def fact_vectors(self, fact_ids: list[int]) -> np.ndarray:
    """The stored embeddings of these facts (len(fact_ids) x D), the rows search compares."""
    ids = [self.fact(f).fact_id for f in fact_ids]  # checks every id
    if self._graph is None:
      return np.zeros((0, 0), np.float32)
    return self._graph.vectors[ids]

  def _bm25_scores(self, query: str) -> np.ndarray:
    if self._bm25 is None or self._bm25_size != len(self._facts):
      # Rebuilt from scratch: BM25's document frequencies change with every new fact.
      self._bm25 = BM25Retriever([f.text for f in self._facts])
      self._bm25_size = len(self._facts)
    return np.asarray(self._bm25.scores([query])[0], np.float64)

  # -- inspection and persistence -------------------------------------------------------

  facts = property(lambda self: list(self._facts))
  turns = property(lambda self: list(self._raw.values()))

  def turn_ids(self) -> set[str]:
    return set(self._raw)

  def edges(self) -> dict[tuple[int, int], float]:
    """Every edge once, as {(smaller id, larger id): weight}."""
    return {(i, j): w for i in range(len(self._facts))
            for j, w in self.neighbours(i, -np.inf) if i < j}

  def save(self, bank: MemoryBank, user: str) -> None:
    """Stores the three layers as the user's LaceMem in the bank: only what was added since
    this LaceMem last saved or loaded, unless another process saved in between (then the whole,
    replacing theirs)."""
    graph = self._graph
    snap = LaceSnapshot(
        dataclasses.asdict(self.settings), getattr(self.encoder, "identity", ""),
        self.fallbacks, self.turns, self.facts,
        graph.vectors if graph is not None else np.zeros((0, 0), np.float32),
        graph.lists() if graph is not None else ())
    since, lists = self._saved, {}
    if since is not None and graph is not None:
      lists = {i: graph.list_of(i) for i in sorted(
          {i for i in graph.changed if i < since.facts} | set(range(since.facts, len(graph))))}
    revision = bank.save_lace(user, snap, since, lists)
    self._saved = LaceSaved(revision, len(self._raw), len(self._facts))
    if graph is not None:
      graph.changed.clear()

  @classmethod
  def load(cls, bank: MemoryBank, user: str, encoder: Encoder | None) -> LaceMem:
    """The user's saved LaceMem; `encoder` must be the one its facts were embedded with."""
    if (snap := bank.load_lace(user)) is None:
      raise UnknownRecord(f"user {user!r} has no saved LaceMem in {bank.where}; save one first")
    if encoder is not None and snap.encoder and encoder.identity != snap.encoder:
      raise EncoderMismatch(f"the LaceMem of user {user!r} was embedded with encoder "
                            f"{snap.encoder!r}, not {encoder.identity!r}; load it with that "
                            f"encoder or rebuild it")
    lace = cls(encoder, settings=LaceSettings(**snap.settings))
    lace.fallbacks = snap.fallbacks
    lace._fill(snap.turns, snap.facts)
    if snap.facts:
      s = lace.settings
      lace._graph = SemanticGraph.restore(snap.vectors, snap.links, min_cosine=s.min_cosine,
                                          max_neighbours=s.max_semantic, chunk=s.chunk)
    lace._saved = LaceSaved(snap.revision, len(snap.turns), len(snap.facts))
    return lace
