"""A NumPy-only scorer of an exported reranker (docs/command-line.md, export)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from rmmjax.learners.embedding.format import read_reranker


def check_embeddings(x, name: str, dim: int, ndim: int) -> np.ndarray:
  """x as float32, refusing a wrong shape or non-finite values (before anything is scored:
  inside jit a NaN cannot be refused)."""
  x = np.asarray(x, np.float32)
  if x.ndim != ndim or x.shape[-1] != dim:
    want = {1: "(D,)", 2: "(K, D)", 3: "(B, K, D)"}.get(ndim, f"{ndim} axes")
    if ndim == 2 and name.startswith("q"):
      want = "(B, D)"
    raise ValueError(f"{name} has shape {x.shape}; expected {want} with D={dim}")
  bad = ~np.isfinite(x)
  if bad.any():
    raise ValueError(f"{name} holds {int(bad.sum())} NaN or infinite values "
                     f"(first at index {tuple(int(i) for i in np.argwhere(bad)[0])})")
  return x


def _gelu(x: np.ndarray) -> np.ndarray:
  # The tanh approximation, as jax.nn.gelu computes it by default.
  return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


class NumpyReranker:
  """Scores candidate memories for a query with exported reranker weights."""

  def __init__(self, weights: dict[str, np.ndarray], meta: dict):
    self.meta, self.variant, self.dim = meta, meta["variant"], int(meta["dim"])
    self.weights = {k: np.asarray(v, np.float32) for k, v in weights.items()}
    if self.variant == "linear":  # (read_reranker refused any variant but linear and mlp)
      # Precompute (I + wq)(I + wm)^T: one D x D matrix, so a query costs one product.
      eye = np.eye(self.dim, dtype=np.float32)
      self._query_map = (eye + self.weights["wq"]) @ (eye + self.weights["wm"]).T

  @classmethod
  def load(cls, path: str | Path) -> "NumpyReranker":
    """From an exported file alone (its header holds the description); checked on load."""
    return cls(*read_reranker(path))

  def _mlp(self, prefix: str, x: np.ndarray) -> np.ndarray:
    w = {k: self.weights[f"{prefix}/{k}"] for k in ("w1", "b1", "w2")}
    out_bias = self.weights.get(f"{prefix}/b2", 0.0)  # only the query side has one
    return x + _gelu(x @ w["w1"] + w["b1"]) @ w["w2"] + out_bias

  def score(self, q_D: np.ndarray, m_KxD: np.ndarray) -> np.ndarray:
    """Scores of K candidates for one query, scores_K."""
    q_D = check_embeddings(q_D, "query", self.dim, 1)
    m_KxD = check_embeddings(m_KxD, "memories", self.dim, 2)
    if self.variant == "linear":
      scores_K = m_KxD @ (q_D @ self._query_map)
    else:
      scores_K = self._mlp("m_mlp", m_KxD) @ self._mlp("q_mlp", q_D)
    if "rank_bias" in self.weights:  # candidates come in the order the prior was trained on
      bias = self.weights["rank_bias"]
      # Fewer than k candidates take the first biases, as training's padded, masked lists do.
      if len(scores_K) > len(bias):
        raise ValueError(f"{len(scores_K)} candidates, but the rank prior was trained for "
                         f"k={len(bias)}: pass at most k")
      scores_K = scores_K + bias[:len(scores_K)]
    return scores_K

  def top_m(self, q_D: np.ndarray, m_KxD: np.ndarray, m: int | None = None) -> np.ndarray:
    """Indices of the m best candidates, best first (m defaults to the trained M)."""
    m = int(self.meta["m"]) if m is None else m
    return np.argsort(-self.score(q_D, m_KxD), kind="stable")[:m]
