"""Dense top-K retrieval as a jitted matmul, and reciprocal-rank fusion with another ranker."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rmmjax.retrieve.fusion import rrf_top

QUERY_CHUNK = 64  # queries scored together: bounds the (chunk x N) score matrix
BANK_ROWS = 256  # the fewest rows a bank is padded to


@functools.partial(jax.jit, static_argnames="k")
def dense_top_k(q_QxD: jax.Array, bank_NxD: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
  """Inner-product top-k of each query over the bank: (scores_QxK, indices_QxK), best first."""
  return jax.lax.top_k(q_QxD @ bank_NxD.T, k)


@functools.partial(jax.jit, static_argnames="k")
def masked_top_k(q_QxD: jax.Array, bank_NxD: jax.Array, valid_N: jax.Array, k: int):
  """dense_top_k over the bank's valid rows only (the others score -inf)."""
  return jax.lax.top_k(jnp.where(valid_N[None, :], q_QxD @ bank_NxD.T, -jnp.inf), k)


@functools.lru_cache(maxsize=None)
def _sharded_top_k(mesh: Mesh, k: int):
  """Top-k over a bank whose rows are split across the mesh's devices: each device takes the
  top k of its own rows, then the devices' candidates are gathered and the top k of those kept.
  Only Q x k x devices scores cross devices, never the Q x N score matrix."""
  axis = mesh.axis_names[0]

  def local(q_QxD, bank_nxD, valid_n):
    scores_Qxn = jnp.where(valid_n[None, :], q_QxD @ bank_nxD.T, -jnp.inf)
    values_Qxk, idx_Qxk = jax.lax.top_k(scores_Qxn, k)
    idx_Qxk = idx_Qxk + jax.lax.axis_index(axis) * bank_nxD.shape[0]
    values = jax.lax.all_gather(values_Qxk, axis, axis=1, tiled=True)
    idx = jax.lax.all_gather(idx_Qxk, axis, axis=1, tiled=True)
    best_Qxk, pos_Qxk = jax.lax.top_k(values, k)
    return best_Qxk, jnp.take_along_axis(idx, pos_Qxk, axis=1)

  return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(axis), P(axis)),
                               out_specs=(P(), P()), check_vma=False))


def shard_bank(bank_NxD: np.ndarray, devices) -> tuple[Mesh, jax.Array, jax.Array]:
  """The bank's rows split evenly over the devices (padded with invalid rows)."""
  mesh = Mesh(np.asarray(devices), ("bank",))
  n, d = bank_NxD.shape
  per = -(-n // len(devices))
  padded = np.zeros((per * len(devices), d), np.float32)
  padded[:n] = bank_NxD
  valid = np.arange(per * len(devices)) < n
  rows = NamedSharding(mesh, P("bank"))
  return mesh, jax.device_put(padded, rows), jax.device_put(valid, rows)


def search(q_QxD: np.ndarray, bank_NxD: np.ndarray, k: int, devices=None) -> np.ndarray:
  """Indices (Q, k) of the best bank rows for each query, queries in fixed-size chunks so one
  compiled program serves any number of queries. With several devices (all local ones by
  default) the bank is sharded across them by rows."""
  q_QxD = np.asarray(q_QxD, np.float32)
  k = min(k, bank_NxD.shape[0])
  devices = jax.local_devices() if devices is None else list(devices)
  if len(devices) > 1 and bank_NxD.shape[0] >= k * len(devices):
    mesh, bank, valid = shard_bank(np.asarray(bank_NxD, np.float32), devices)
    top_k = _sharded_top_k(mesh, k)
    run = lambda q: top_k(q, bank, valid)  # noqa: E731
  else:
    # The bank padded to a power of two (pads never chosen): conversations of every size share
    # a few compiled programs, where each one costs seconds on an accelerator.
    n = bank_NxD.shape[0]
    size = max(BANK_ROWS, 1 << (n - 1).bit_length())
    padded = np.zeros((size, bank_NxD.shape[1]), np.float32)  # (on the host: no compile per n)
    padded[:n] = bank_NxD
    bank, valid = jnp.asarray(padded), jnp.asarray(np.arange(size) < n)
    wanted = size if k == n else k  # a whole ranking: every row, the pads last, cut below
    run = lambda q: masked_top_k(q, bank, valid, wanted)  # noqa: E731
  out = []
  for start in range(0, len(q_QxD), QUERY_CHUNK):
    chunk = q_QxD[start:start + QUERY_CHUNK]
    padded = np.zeros((QUERY_CHUNK, q_QxD.shape[1]), np.float32)
    padded[:len(chunk)] = chunk
    out.append(np.asarray(run(padded)[1])[:len(chunk), :k])
  return np.concatenate(out) if out else np.zeros((0, k), np.int32)


class DenseRetriever:
  """Ranks a fixed list of texts by the inner product of their embeddings with the query's (a
  fine-tuned query encoder may embed the queries; the bank keeps its own embeddings)."""

  def __init__(self, texts: list[str], encoder, query_encoder=None):
    self._encoder = query_encoder or encoder
    self._bank = encoder.encode(texts)

  def rank(self, queries: list[str], k: int) -> np.ndarray:
    return search(self._encoder.encode(queries), self._bank, k)


class FusionRetriever:
  """Reciprocal-rank fusion of BM25 and dense search (`retrieve/fusion.py`)."""

  def __init__(self, bm25, dense: DenseRetriever, size: int):
    self._bm25, self._dense, self._size = bm25, dense, size

  def rank(self, queries: list[str], k: int) -> np.ndarray:
    k = min(k, self._size)
    dense = self._dense.rank(queries, self._size)
    matched = self._bm25.matched(queries, self._size)
    # Dense search ranks every text, so every row below has k entries.
    return np.stack([rrf_top([m, d], k) for m, d in zip(matched, dense, strict=True)]
                    ) if len(queries) else np.zeros((0, k), np.int64)
