"""A learned sufficiency judge: does the gathered evidence cover everything a question needs?

Input: the question's embedding q (D,) and the N gathered facts' embeddings F (N x D), with a
mask for padding. Each fact becomes a feature row h_n = MLP([f_n, q * f_n, q . f_n]); attention
pooling over the rows (a learnt query vector, softmax over the valid facts) gives one summary,
beside max- and mean-pooled question similarities; an MLP over [q, summary, statistics] gives the
logit of "every evidence turn is among the facts' turns". Invariant to the facts' order and to
padding; trained with binary cross-entropy (`judge_loss`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

NEG = -1e30


def judge_init(key: jax.Array, dim: int, hidden: int = 64) -> dict:
  """Parameters for D = dim embeddings and `hidden` units; the logit starts near 0."""
  k1, k2, k3 = jax.random.split(key, 3)
  feat_in, head_in = 2 * dim + 1, dim + hidden + 4

  def dense(k, n_in, n_out, scale=1.0):
    return {"w": scale * jax.random.normal(k, (n_in, n_out), jnp.float32) / jnp.sqrt(n_in),
            "b": jnp.zeros((n_out,), jnp.float32)}

  return {"fact": dense(k1, feat_in, hidden), "attend": jnp.zeros((hidden,), jnp.float32),
          "head": dense(k2, head_in, hidden), "out": dense(k3, hidden, 1, scale=0.1)}


def _apply(layer: dict, x: jax.Array) -> jax.Array:
  return x @ layer["w"] + jnp.expand_dims(layer["b"], tuple(range(x.ndim - 1)))


def judge_logit(params: dict, q_D: jax.Array, facts_NxD: jax.Array,
                mask_N: jax.Array) -> jax.Array:
  """The logit (scalar) that the valid facts cover the question's evidence."""
  sims_N = facts_NxD @ q_D
  h_NxH = jax.nn.gelu(_apply(params["fact"], jnp.concatenate(
      [facts_NxD, facts_NxD * q_D[None, :], sims_N[:, None]], -1)))
  attn_N = jax.nn.softmax(jnp.where(mask_N, h_NxH @ params["attend"], NEG))
  any_valid = jnp.any(mask_N)
  pooled_H = jnp.where(any_valid, attn_N @ h_NxH, 0.0)
  count = jnp.sum(mask_N).astype(jnp.float32)
  top = jnp.where(any_valid, jnp.max(jnp.where(mask_N, sims_N, NEG)), 0.0)
  mean = jnp.sum(jnp.where(mask_N, sims_N, 0.0)) / jnp.maximum(count, 1.0)
  stats = jnp.stack([top, mean, jnp.log1p(count), any_valid.astype(jnp.float32)])
  z_H = jax.nn.gelu(_apply(params["head"], jnp.concatenate([q_D, pooled_H, stats])))
  return _apply(params["out"], z_H)[0]


def judge_logits(params: dict, q_BxD: jax.Array, facts_BxNxD: jax.Array,
                 mask_BxN: jax.Array) -> jax.Array:
  """judge_logit for a batch, logits_B."""
  return jax.vmap(judge_logit, in_axes=(None, 0, 0, 0))(params, q_BxD, facts_BxNxD, mask_BxN)


def judge_loss(params: dict, q_BxD: jax.Array, facts_BxNxD: jax.Array, mask_BxN: jax.Array,
               label_B: jax.Array, weight_B: jax.Array) -> jax.Array:
  """Weighted binary cross-entropy of the logits against the labels (weight 0: padding)."""
  logits_B = judge_logits(params, q_BxD, facts_BxNxD, mask_BxN)
  per_B = (jnp.maximum(logits_B, 0.0) - logits_B * label_B.astype(jnp.float32)
           + jnp.log1p(jnp.exp(-jnp.abs(logits_B))))
  return jnp.sum(per_B * weight_B) / jnp.maximum(jnp.sum(weight_B), 1e-9)
