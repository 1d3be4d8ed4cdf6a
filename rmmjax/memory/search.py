"""Retrieval over one user's memory bank: BM25 over the memories' text, dense search over the
embeddings stored beside them (never re-embedded at query time), or their reciprocal-rank fusion.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.records import Memory
from rmmjax.retrieve.bm25 import BM25Retriever
from rmmjax.retrieve.fusion import RRF_C, rrf_top

FUSION_DEPTH = 200  # each ranker's list fused (at least 10 k)


def memory_text(memory: Memory) -> str:
  """What BM25 indexes: the summary and the verbatim snippets it came from."""
  return " ".join([memory.summary, *(s.text for s in memory.snippets)])


@dataclasses.dataclass(frozen=True)
class UserIndex:
  """One user's memories as a search index (row i is memories[i])."""

  memories: tuple[Memory, ...]
  emb_NxD: np.ndarray
  bm25: BM25Retriever | None
  version: int  # the bank's memory_version of the user when it was built

  def rank(self, query: str, q_D: np.ndarray, retriever: str, k: int) -> np.ndarray:
    """Row indices of the k best memories for the query, best first (fewer if the bank is)."""
    n = len(self.memories)
    if (k := min(k, n)) == 0:
      return np.zeros(0, np.int64)
    if retriever == "bm25":
      return self.bm25.rank([query], k)[0]
    if retriever == "dense":
      return self._dense(q_D, k)
    # Fusion of each ranker's top `depth`, not of all N: a memory below both depths could only
    # enter the top k when fewer than k memories made either list, and ranking every memory
    # twice would cost a full sort of the bank per query. BM25 is credited only with memories
    # that share a term with the query.
    depth = min(n, max(FUSION_DEPTH, 10 * k))
    return rrf_top([self.bm25.matched([query], depth)[0], self._dense(q_D, depth)], k, RRF_C)

  def _dense(self, q_D: np.ndarray, k: int) -> np.ndarray:
    """Top k rows by inner product. One query at a time: a NumPy matrix-vector product and a
    partial sort (the jitted batch search pads to 64 queries, 64 times this work)."""
    scores_N = self.emb_NxD @ np.asarray(q_D, np.float32)
    top = np.argpartition(-scores_N, k - 1)[:k] if k < len(scores_N) else np.arange(len(scores_N))
    return top[np.lexsort((top, -scores_N[top]))]


class BankSearch:
  """Per-user indexes over a MemoryBank, kept until the user's memories change."""

  def __init__(self, bank: MemoryBank, encoder_identity: str, retriever: str):
    self.bank, self.encoder_identity, self.retriever = bank, encoder_identity, retriever
    self._indexes: dict[str, UserIndex] = {}

  def index(self, user: str) -> UserIndex:
    cached = self._indexes.get(user)
    if cached is not None and cached.version == self.bank.memory_version(user):
      return cached
    version, memories, emb = self.bank.memory_snapshot(user, self.encoder_identity)
    bm25 = (BM25Retriever([memory_text(m) for m in memories])
            if memories and self.retriever != "dense" else None)
    self._indexes[user] = UserIndex(tuple(memories), emb, bm25, version)
    return self._indexes[user]
