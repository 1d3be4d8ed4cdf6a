"""Reciprocal-rank fusion, with credit only for what a ranker matched.

Each ranker hands over the rows it matched, best first; a row earns 1 / (c + rank) from every
ranker that matched it (ranks from 1) and nothing from the others. BM25 matches only texts that
share a term with the query: its texts of score 0 come in corpus order, and counting them as
ranked would hand the earliest texts of a collection near-top credit whenever few texts match.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

RRF_C = 60.0


def rrf_top(rankings: Sequence[np.ndarray], k: int, c: float = RRF_C) -> np.ndarray:
  """The k rows of best fused score, best first (ties: the lower row first); only rows some
  ranking holds, so fewer than k when they hold fewer."""
  rankings = [np.asarray(r, np.int64) for r in rankings]
  rows = np.concatenate(rankings) if rankings else np.zeros(0, np.int64)
  if not len(rows):
    return rows
  credit = np.concatenate([1.0 / (c + 1.0 + np.arange(len(r))) for r in rankings])
  unique, inverse = np.unique(rows, return_inverse=True)
  fused = np.bincount(inverse, weights=credit)
  return unique[np.lexsort((unique, -fused))][:k]


def rrf_scores(rankings: Sequence[np.ndarray], n: int, c: float = RRF_C) -> np.ndarray:
  """The fused score (n,) of every row: 0 for rows no ranking holds."""
  fused = np.zeros(n)
  for ranking in rankings:
    ranking = np.asarray(ranking, np.int64)
    fused[ranking] += 1.0 / (c + 1.0 + np.arange(len(ranking)))
  return fused
