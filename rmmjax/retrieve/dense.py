"""Dense top-K retrieval as a jitted matmul, and reciprocal-rank fusion with another ranker."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

QUERY_CHUNK = 64  # queries scored together: bounds the (chunk x N) score matrix


@functools.partial(jax.jit, static_argnames="k")
def dense_top_k(q_QxD: jax.Array, bank_NxD: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """Inner-product top-k of each query over the bank: (scores_QxK, indices_QxK), best first."""
  return jax.lax.top_k(q_QxD @ bank_NxD.T, k)


def search(q_QxD: np.ndarray, bank_NxD: np.ndarray, k: int) -> np.ndarray:
  """Indices (Q, k) of the best bank rows for each query, queries in fixed-size chunks so one
  compiled program serves any number of queries."""
  q_QxD = np.asarray(q_QxD, np.float32)
  k = min(k, bank_NxD.shape[0])
  bank = jnp.asarray(bank_NxD, jnp.float32)
  out = []
  for start in range(0, len(q_QxD), QUERY_CHUNK):
    chunk = q_QxD[start:start + QUERY_CHUNK]
    padded = np.zeros((QUERY_CHUNK, q_QxD.shape[1]), np.float32)
    padded[:len(chunk)] = chunk
    out.append(dense_top_k(padded, bank, k)[1][:len(chunk)])
  return np.asarray(jnp.concatenate(out)) if out else np.zeros((0, k), np.int32)


class DenseRetriever:
  """Ranks a fixed list of texts by the inner product of their embeddings with the query's.

  A separate query encoder (a fine-tuned one) may embed the queries; the bank keeps the
  embeddings it was indexed with.
  """

  def __init__(self, texts: list[str], encoder, query_encoder=None):
    if not texts:
      raise ValueError("DenseRetriever needs at least one text to index")
    self._encoder = query_encoder or encoder
    self._bank = encoder.encode(texts)

  def rank(self, queries: list[str], k: int) -> np.ndarray:
    return search(self._encoder.encode(queries), self._bank, k)


class FusionRetriever:
  """Reciprocal-rank fusion: score = sum over rankers of 1 / (c + rank), ranks from 1."""

  def __init__(self, rankers: list, size: int, c: float = 60.0):
    self._rankers, self._size, self._c = rankers, size, c

  def rank(self, queries: list[str], k: int) -> np.ndarray:
    fused = np.zeros((len(queries), self._size))
    rows = np.arange(len(queries))[:, None]
    for ranker in self._rankers:
      order = ranker.rank(queries, self._size)
      fused[rows, order] += 1.0 / (self._c + 1.0 + np.arange(order.shape[1]))[None, :]
    return np.argsort(-fused, axis=1, kind="stable")[:, :min(k, self._size)]
