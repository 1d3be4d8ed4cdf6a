"""LaceMem's semantic links: each fact's top neighbours by cosine, kept exactly under streaming.

Fact i ranks the other facts j with cosine >= min_cosine by (cosine descending, fact id
ascending) and keeps the first `max_neighbours`: its list S(i). A streaming insert reproduces
that order-free rule exactly: the new fact ranks every older one, and enters an older list only
when it beats the list's weakest entry (on a tie the older id wins), evicting that entry. The
reverse index R(i) = {j : i in S(j)} follows every entry and eviction. Edges are S(i) and R(i)
intersected ("mutual": at most `max_neighbours` per fact) or united ("either").

Exactness: vectors are rounded to multiples of 2^-11 (GRID_BITS), so for rows of norm < 2 every
product is a multiple of 2^-22 and every partial sum of a dot product one of magnitude < 4, all
representable in float32: a dot product is exact in any summation order, so streaming inserts,
batch builds, any BLAS and any device give bit-identical cosines. The rounding moves a cosine
by about 1e-4 at D = 384.

Cost: a streaming insert compares the new fact with the N older ones (2 N D FLOPs, in row blocks
of `chunk`); a batch build computes the upper block triangle of the N x N cosine matrix, chunk x
chunk at a time (N^2 D FLOPs in O(chunk^2) memory), pruning to the top k per fact as it goes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import final

import numpy as np

GRID_BITS = 11
RULES = ("mutual", "either")


def snap(vectors: np.ndarray) -> np.ndarray:
  """Unit-norm rows (the Encoder protocol's) rounded to the 2^-11 grid, as float32."""
  array = np.asarray(vectors, np.float32)
  scale = np.float32(2.0 ** GRID_BITS)
  return (np.round(array * scale) / scale).astype(np.float32)


def _top_per_row(rows: np.ndarray, cols: np.ndarray, cos: np.ndarray,
                 k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Each row's k best (row, col, cos) entries by (cos descending, col ascending), row-sorted."""
  order = np.lexsort((cols, -cos, rows))
  rows, cols, cos = rows[order], cols[order], cos[order]
  if rows.size == 0:
    return rows, cols, cos
  first = np.r_[0, np.flatnonzero(np.diff(rows)) + 1]
  rank = np.arange(rows.size) - np.repeat(first, np.diff(np.r_[first, rows.size]))
  keep = rank < k
  return rows[keep], cols[keep], cos[keep]


@final
class SemanticGraph:
  """The vectors of the facts so far and every fact's ranked neighbour list S(i)."""

  def __init__(self, dim: int, *, min_cosine: float, max_neighbours: int, chunk: int):
    self.dim, self.min_cosine = dim, np.float32(min_cosine)
    self.k, self.chunk = max_neighbours, chunk
    self._vectors = np.zeros((0, dim), np.float32)  # capacity grows by doubling
    self._n = 0
    self._top: list[list[tuple[float, int]]] = []  # S(i), best first
    self._ranked_by: list[dict[int, float]] = []  # R(i): j -> cosine, for every i in S(j)
    self._worst = np.zeros(0, np.float32)  # cosine to beat to enter S(i); -inf when not full
    # Facts whose list S(i) a streaming insert changed since the owner last cleared this (a
    # save then rewrites only those lists).
    self.changed: set[int] = set()

  def __len__(self) -> int:
    return self._n

  @property
  def vectors(self) -> np.ndarray:
    return self._vectors[:self._n]

  def _store(self, rows: np.ndarray) -> None:
    need = self._n + rows.shape[0]
    if need > self._vectors.shape[0]:
      grown = np.zeros((max(need, 2 * self._vectors.shape[0], 16), self.dim), np.float32)
      grown[:self._n] = self.vectors
      worst = np.full(grown.shape[0], -np.inf, np.float32)
      worst[:self._n] = self._worst[:self._n]
      self._vectors, self._worst = grown, worst
    self._vectors[self._n:need] = rows
    self._n = need

  def check(self, vectors: np.ndarray) -> np.ndarray:
    rows = snap(vectors)
    if rows.shape[1] != self.dim:
      raise ValueError(f"expected vectors of dimension {self.dim} (the graph's), got "
                       f"{rows.shape[1]}")
    return rows

  def add(self, vectors: np.ndarray) -> None:
    """Streams new facts in, in order: each is linked as a batch build over all would link it."""
    new = self.check(vectors)
    start = self._n
    self._store(new)
    sims = np.empty((new.shape[0], self._n), np.float32)
    for lo in range(0, self._n, self.chunk):
      # new @ block.T, not (block @ new.T).T: BLAS's fast path for a few rows (6x at one).
      sims[:, lo:lo + self.chunk] = new @ self._vectors[lo:min(lo + self.chunk, self._n)].T
    for m in range(new.shape[0]):
      self._insert(start + m, sims[m, :start + m])

  def _insert(self, new: int, sims: np.ndarray) -> None:
    cand = np.flatnonzero(sims >= self.min_cosine)
    best = cand[np.lexsort((cand, -sims[cand]))[:self.k]]
    self._top.append([(float(sims[j]), int(j)) for j in best])
    self._ranked_by.append({})
    for cos, j in self._top[new]:
      self._ranked_by[j][new] = cos
    self._refresh_worst(new)
    for i in cand[sims[cand] > self._worst[cand]]:
      i, cos, top = int(i), float(sims[i]), self._top[int(i)]
      if len(top) == self.k:
        del self._ranked_by[top.pop()[1]][i]
      # The new id is the largest: it goes after every entry with an equal or higher cosine.
      at = next((p for p, (c, _) in enumerate(top) if c < cos), len(top))
      top.insert(at, (cos, new))
      self._ranked_by[new][i] = cos
      self._refresh_worst(i)
      self.changed.add(i)

  def _refresh_worst(self, i: int) -> None:
    top = self._top[i]
    # inf: a list of capacity 0 takes nothing; -inf: a list with room takes any candidate.
    self._worst[i] = (np.inf if self.k == 0 else top[-1][0] if len(top) == self.k else -np.inf)

  @classmethod
  def _holding(cls, vectors: np.ndarray, **settings) -> SemanticGraph:
    """A graph of these vectors (snapped) with no lists yet; `settings` are __init__'s."""
    rows = snap(vectors)
    graph = cls(rows.shape[1], **settings)
    graph._store(rows)
    return graph

  @classmethod
  def build(cls, vectors: np.ndarray, **settings) -> SemanticGraph:
    """All facts at once: the blocked upper triangle of the cosine matrix, pruned as it goes."""
    graph = cls._holding(vectors, **settings)
    n, v, k, chunk = graph._n, graph.vectors, graph.k, graph.chunk
    found: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    pending, limit = 0, max(1 << 20, 4 * n * max(k, 1))
    for r0 in range(0, n if k else 0, chunk):
      block = v[r0:r0 + chunk]
      for c0 in range(r0, n, chunk):
        sims = block @ v[c0:c0 + chunk].T
        if c0 == r0:
          np.fill_diagonal(sims, -np.inf)
        # flatnonzero: about 9x faster than nonzero on a mostly-False 2-D mask.
        i, j = np.divmod(np.flatnonzero(sims >= graph.min_cosine), sims.shape[1])
        cos = sims[i, j]
        found.append((i + r0, j + c0, cos))
        if c0 != r0:
          found.append((j + c0, i + r0, cos))
        pending += (1 + (c0 != r0)) * i.size
        if pending > limit:
          found, pending = [_top_per_row(*map(np.concatenate, zip(*found)), k)], 0
    graph._set_lists(*(_top_per_row(*map(np.concatenate, zip(*found)), k) if found
                       else (np.zeros(0, np.int64),) * 3))
    return graph

  def _set_lists(self, rows: np.ndarray, cols: np.ndarray, cos: np.ndarray) -> None:
    self._top = [[] for _ in range(self._n)]
    self._ranked_by = [{} for _ in range(self._n)]
    for i, j, c in zip(rows.tolist(), cols.tolist(), np.asarray(cos, np.float32).tolist()):
      self._top[i].append((c, j))
      self._ranked_by[j][i] = c
    for i in range(self._n):
      self._refresh_worst(i)

  @classmethod
  def restore(cls, vectors: np.ndarray, lists: list[tuple[int, int, float]],
              **settings) -> SemanticGraph:
    """A graph from stored vectors and (fact, neighbour, cosine) entries in list order."""
    graph = cls._holding(vectors, **settings)
    rows, cols, cos = zip(*lists) if lists else ((), (), ())
    rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
    bad = (rows < 0) | (rows >= graph._n) | (cols < 0) | (cols >= graph._n) | (rows == cols)
    if bad.any() or np.any(np.bincount(rows, minlength=graph._n) > graph.k):
      raise ValueError(f"stored neighbour lists do not fit {graph._n} facts with at most "
                       f"{graph.k} neighbours each")
    graph._set_lists(rows, cols, cos)
    return graph

  def linked(self, i: int, rule: str) -> dict[int, float]:
    """The facts i shares a semantic edge with under the rule, with their cosines."""
    if rule == "mutual":
      return {j: c for c, j in self._top[i] if j in self._ranked_by[i]}
    return {**self._ranked_by[i], **{j: c for c, j in self._top[i]}}

  def lists(self) -> Iterator[tuple[int, int, float]]:
    """Every (fact, neighbour, cosine) entry of every S(i), in list order."""
    return ((i, j, c) for i, top in enumerate(self._top) for c, j in top)

  def list_of(self, i: int) -> list[tuple[int, float]]:
    """S(i) as (neighbour, cosine) entries, in list order."""
    return [(j, c) for c, j in self._top[i]]
