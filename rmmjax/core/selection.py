"""Stochastic top-M selection (Gumbel top-M) and its Plackett-Luce log-probability; why the
paper's literal recipe (`paper=True`) differs: docs/implemented.md, Selection."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# A finite stand-in for -inf: exp() of it is exactly 0, and its gradients are never NaN.
_NEG = -1e30


def _default_mask(scores_K: jax.Array, mask_K: jax.Array | None) -> jax.Array:
  # (the shapes and m are the library's own: CoreSpec checked m against K)
  return jnp.ones(scores_K.shape, bool) if mask_K is None else mask_K.astype(bool)


def gumbel_top_m(key: jax.Array, scores_K: jax.Array, m: int, tau: jax.Array | float,
                 mask_K: jax.Array | None = None, paper: bool = False) -> jax.Array:
  """Samples m (static) of the valid candidates without replacement, in selection order: int32
  indices (m,), every valid one and then -1 when fewer than m are valid. `paper` ranks s + g
  instead of s/tau + g (the paper's literal recipe, which ignores tau)."""
  gumbel_K = jax.random.gumbel(key, scores_K.shape, jnp.float32)
  return perturbed_top_m(scores_K, gumbel_K, m, tau, mask_K, paper)


def perturbed_top_m(scores_K: jax.Array, gumbel_K: jax.Array, m: int, tau: jax.Array | float,
                    mask_K: jax.Array | None = None, paper: bool = False) -> jax.Array:
  """`gumbel_top_m` with the Gumbel noise given (a caller that draws all of a step's noise at
  once saves a random-number kernel per draw)."""
  mask_K = _default_mask(scores_K, mask_K)
  logits_K = scores_K if paper else scores_K / tau
  return top_m(logits_K + gumbel_K, m, mask_K)


def top_m(scores_K: jax.Array, m: int, mask_K: jax.Array | None = None) -> jax.Array:
  """Deterministic top-M of the valid candidates (evaluation), -1 where none is left."""
  mask_K = _default_mask(scores_K, mask_K)
  _, idx_M = jax.lax.top_k(jnp.where(mask_K, scores_K, -jnp.inf), m)
  taken_M = jnp.arange(m) < jnp.sum(mask_K)
  return jnp.where(taken_M, idx_M, -1).astype(jnp.int32)


def selection_log_prob_terms(scores_K: jax.Array, selected_M: jax.Array,
                             tau: jax.Array | float, mask_K: jax.Array | None = None,
                             surrogate: bool = False) -> jax.Array:
  """Per-position log-probability terms of an ordered selection (0 at -1 positions).
  Plackett-Luce: term_j = s_j/tau - logsumexp over the valid candidates not selected before j.
  Surrogate (paper): term_j = log_softmax(s/tau)_j over all valid candidates."""
  mask_K = _default_mask(scores_K, mask_K)
  k = scores_K.shape[0]
  logits_K = scores_K / tau
  taken_M = selected_M >= 0
  safe_M = jnp.where(taken_M, selected_M, 0)
  if surrogate:
    log_p_K = jax.nn.log_softmax(jnp.where(mask_K, logits_K, _NEG))
    return jnp.where(taken_M, log_p_K[safe_M], 0.0)
  # available_MxK[j] marks the valid candidates not chosen at positions before j.
  chosen_MxK = (safe_M[:, None] == jnp.arange(k)[None, :]) & taken_M[:, None]
  chosen_MxK = chosen_MxK.astype(jnp.int32)
  chosen_before_MxK = jnp.cumsum(chosen_MxK, axis=0) - chosen_MxK
  available_MxK = mask_K[None, :] & (chosen_before_MxK == 0)
  lse_M = jax.nn.logsumexp(jnp.where(available_MxK, logits_K[None, :], _NEG), axis=-1)
  return jnp.where(taken_M, logits_K[safe_M] - lse_M, 0.0)


def selection_log_prob(scores_K: jax.Array, selected_M: jax.Array, tau: jax.Array | float,
                       mask_K: jax.Array | None = None, surrogate: bool = False) -> jax.Array:
  """Log-probability of the ordered selection (Plackett-Luce, or the paper's surrogate)."""
  return jnp.sum(selection_log_prob_terms(scores_K, selected_M, tau, mask_K, surrogate))


def selection_entropy(scores_K: jax.Array, tau: jax.Array | float,
                      mask_K: jax.Array | None = None) -> jax.Array:
  """Entropy of the first pick, softmax(s/tau) over the valid candidates (0 when none is)."""
  mask_K = _default_mask(scores_K, mask_K)
  log_p_K = jax.nn.log_softmax(jnp.where(mask_K, scores_K / tau, _NEG))
  return -jnp.sum(jnp.where(mask_K, jnp.exp(log_p_K) * log_p_K, 0.0))
