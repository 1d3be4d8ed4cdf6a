"""BM25 over one conversation's units, through the bm25s library."""

from __future__ import annotations

import logging

import bm25s
import numpy as np

logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs every index build at DEBUG


class BM25Retriever:
  """Ranks a fixed list of texts for each query (Lucene BM25, English stopwords)."""

  def __init__(self, texts: list[str], k1: float = 1.5, b: float = 0.75):
    self._size = len(texts)
    self._model = bm25s.BM25(k1=k1, b=b)
    self._model.index(bm25s.tokenize(texts, stopwords="en", show_progress=False),
                      show_progress=False)

  def scores(self, queries: list[str]) -> np.ndarray:
    """BM25 score (len(queries), texts) of every text; 0 where a text shares no term."""
    tokens = bm25s.tokenize(queries, stopwords="en", return_ids=False, show_progress=False)
    # A query of stopwords only has no terms: it matches nothing (bm25s would fail on it).
    return np.stack([self._model.get_scores(query_tokens) if query_tokens
                     else np.zeros(self._size) for query_tokens in tokens])

  def rank(self, queries: list[str], k: int) -> np.ndarray:
    """Indices of the k best texts for each query, best first, shape (len(queries), k)."""
    k = min(k, self._size)
    if not queries:
      return np.zeros((0, k), np.int64)
    # Texts that share no term with a query score 0; ties keep corpus order.
    return np.argsort(-self.scores(queries), axis=1, kind="stable")[:, :k]

  def matched(self, queries: list[str], k: int) -> list[np.ndarray]:
    """Per query, the (at most k) texts that share a term with it, best first: what BM25 can
    vouch for, and all that fusion credits it with."""
    out = []
    for scores_N in self.scores(queries) if queries else []:
      hits = np.flatnonzero(scores_N > 0)
      if len(hits) > k:
        hits = hits[np.argpartition(-scores_N[hits], k - 1)[:k]]
      out.append(hits[np.lexsort((hits, -scores_N[hits]))])
    return out
