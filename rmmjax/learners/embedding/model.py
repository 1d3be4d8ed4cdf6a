"""The embedding rerankers' pure model (docs/implemented.md): residual transforms of query and
memories, starting as the identity. Embeddings are row vectors, weights apply on the right."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from rmmjax.core import Batch, CoreSpec, LowRank, Model, rank_prior_init


def init_params(key: jax.Array, spec: CoreSpec) -> dict:
  """Parameters that make the reranker the identity map."""
  d = spec.dim
  prior = {"rank_bias": rank_prior_init(spec.k, spec.prior_scale)} if spec.rank_prior else {}
  if spec.variant == "linear":
    return {"wq": jnp.zeros((d, d), jnp.float32), "wm": jnp.zeros((d, d), jnp.float32)} | prior
  kq, km = jax.random.split(key)

  def mlp(k, out_bias):
    # The output layer starts at zero so the residual branch adds nothing at first.
    w1 = jax.random.normal(k, (d, spec.hidden), jnp.float32) / jnp.sqrt(d)
    p = {"w1": w1, "b1": jnp.zeros((spec.hidden,), jnp.float32),
         "w2": jnp.zeros((spec.hidden, d), jnp.float32)}
    return p | ({"b2": jnp.zeros((d,), jnp.float32)} if out_bias else {})

  # Only the query side has an output bias: one on every memory shifts a query's scores alike,
  # so its gradient is rounding noise, which Adam would amplify.
  return {"q_mlp": mlp(kq, True), "m_mlp": mlp(km, False)} | prior


def _add_rank_prior(params: dict, scores_xK: jax.Array) -> jax.Array:
  """Adds the learnt bias of each candidate position (base rank), when the reranker has one."""
  if "rank_bias" not in params:
    return scores_xK
  bias = params["rank_bias"]
  if bias.shape[0] != scores_xK.shape[-1]:
    raise ValueError(f"{scores_xK.shape[-1]} candidates, but the rank prior was trained for "
                     f"k={bias.shape[0]}")
  return scores_xK + (bias if scores_xK.ndim == 1 else bias[None, :])


def _residual_mlp(p: dict, x_D: jax.Array) -> jax.Array:
  h = jax.nn.gelu(x_D @ p["w1"] + p["b1"])
  return x_D + h @ p["w2"] + (p["b2"] if "b2" in p else 0.0)


def _check_shapes(params: dict, q_D: jax.Array, m_KxD: jax.Array, variant: str) -> None:
  if q_D.ndim != 1 or m_KxD.ndim != 2:
    raise ValueError(f"expected q of shape (D,) and m of shape (K, D), got {q_D.shape} and "
                     f"{m_KxD.shape}; vmap over batches at the call site")
  if q_D.shape[0] != m_KxD.shape[1]:
    raise ValueError(f"query dimension {q_D.shape[0]} != memory dimension {m_KxD.shape[1]}")
  want = params["wq"].shape[0] if variant == "linear" else params["q_mlp"]["w1"].shape[0]
  if q_D.shape[0] != want:
    raise ValueError(f"embedding dimension {q_D.shape[0]} != reranker dimension {want}")


def _linear_query_map(params: dict, q_BxD: jax.Array) -> tuple[jax.Array, jax.Array]:
  """u = q (I + wq) and v = u (I + wm)^T for each query, so that s_i = m_i . v."""
  u_BxD = q_BxD + q_BxD @ params["wq"]
  v_BxD = u_BxD + jnp.einsum("bj,ij->bi", u_BxD, params["wm"])
  return u_BxD, v_BxD


def score(params: dict, q_D: jax.Array, m_KxD: jax.Array, variant: str = "linear") -> jax.Array:
  """scores_K of K candidate memories for one query. The linear variant never transforms the
  memories: s_i = m_i . q (I+wq)(I+wm)^T costs O(D^2 + K D) instead of O(K D^2)."""
  _check_shapes(params, q_D, m_KxD, variant)
  if variant == "linear":
    _, v_D = _linear_query_map(params, q_D[None, :])
    return _add_rank_prior(params, m_KxD @ v_D[0])
  q_D = _residual_mlp(params["q_mlp"], q_D)
  m_KxD = jax.vmap(_residual_mlp, in_axes=(None, 0))(params["m_mlp"], m_KxD)
  return _add_rank_prior(params, m_KxD @ q_D)


def score_naive(params: dict, q_D: jax.Array, m_KxD: jax.Array) -> jax.Array:
  """The linear reranker as the paper states it, all K memories transformed (formulation naive)."""
  _check_shapes(params, q_D, m_KxD, "linear")
  q_D = q_D + q_D @ params["wq"]
  m_KxD = m_KxD + m_KxD @ params["wm"]
  return _add_rank_prior(params, m_KxD @ q_D)


def batch_scores(params: dict, q_BxD: jax.Array, mem_BxKxD: jax.Array,
                 spec: CoreSpec) -> jax.Array:
  """Scores for a batch of queries, scores_BxK, with the formulation the spec names."""
  if spec.variant == "linear" and spec.formulation == "naive":
    return jax.vmap(score_naive, in_axes=(None, 0, 0))(params, q_BxD, mem_BxKxD)
  if spec.variant == "linear":  # the whole batch's queries in one pass over the weights
    _check_shapes(params, q_BxD[0], mem_BxKxD[0], "linear")
    _, v_BxD = _linear_query_map(params, q_BxD)
    return _add_rank_prior(params, jnp.einsum("bkd,bd->bk", mem_BxKxD, v_BxD))
  return jax.vmap(score, in_axes=(None, 0, 0, None))(params, q_BxD, mem_BxKxD, spec.variant)


def linear_grad_factors(params: dict, q_BxD: jax.Array, mem_BxKxD: jax.Array,
                        g_scores_BxK: jax.Array) -> dict:
  """Gradients of sum(g_scores * scores) for the fast linear scorer, as low-rank factors
  (and the rank prior's dense gradient, when there is one).

  With u = q (I+wq) and v = u (I+wm)^T, s_k = m_k . v. Back-propagating g_v = sum_k g_k m_k:
  dwm = sum_b outer(g_v_b, u_b) and dwq = sum_b outer(q_b, g_v_b (I+wm)), as LowRank so the
  dense D x D gradients are formed only inside the optimizer's fused update. Every product reads
  a weight matrix in its stored layout (x @ w), the fast case for CPU matmul kernels.
  """
  u_BxD, _ = _linear_query_map(params, q_BxD)
  g_v_BxD = jnp.einsum("bk,bkd->bd", g_scores_BxK, mem_BxKxD)
  g_u_BxD = g_v_BxD + g_v_BxD @ params["wm"]
  grads = {"wq": LowRank(q_BxD, g_u_BxD), "wm": LowRank(g_v_BxD, u_BxD)}
  if "rank_bias" in params:
    grads["rank_bias"] = jnp.sum(g_scores_BxK, 0)
  return grads


@dataclasses.dataclass(frozen=True)
class EmbeddingModel(Model):
  """The linear and MLP rerankers as the core sees them (CoreSpec.model)."""

  def init_params(self, key: jax.Array, spec: CoreSpec) -> dict:
    return init_params(key, spec)

  def scores(self, params: dict, batch: Batch, spec: CoreSpec) -> jax.Array:
    return batch_scores(params, batch.q_BxD, batch.mem_BxKxD, spec)

  def scores_and_pullback(self, params: dict, batch: Batch, spec: CoreSpec):
    if spec.variant == "linear" and spec.formulation == "fast":
      scores_BxK = batch_scores(params, batch.q_BxD, batch.mem_BxKxD, spec)
      return scores_BxK, lambda g_BxK: linear_grad_factors(params, batch.q_BxD,
                                                           batch.mem_BxKxD, g_BxK)
    return super().scores_and_pullback(params, batch, spec)


EMBEDDING = EmbeddingModel()

