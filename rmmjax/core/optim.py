"""Adam as an init/update pair that also accepts gradients in low-rank form.

A batch of B queries gives the linear reranker gradients that are sums of B outer products.
Passed as factors (`LowRank`), the dense gradient is formed inside Adam's elementwise update and
never written to memory: one step then reads and writes the parameters and both moments once,
the floor for Adam. The arithmetic is optax.adam's (a test checks it against optax).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

# Above this many factors the outer products are summed by a matmul, not unrolled in the update.
_UNROLL_MAX_RANK = 16


class LowRank(struct.PyTreeNode):
  """The matrix sum_b outer(left_BxP[b], right_BxQ[b]), of shape (P, Q)."""

  left_BxP: jax.Array
  right_BxQ: jax.Array

  def dense(self) -> jax.Array:
    rank = self.left_BxP.shape[0]
    if rank > _UNROLL_MAX_RANK:
      return self.left_BxP.T @ self.right_BxQ
    # Unrolled broadcasts stay elementwise, so XLA fuses them into the consumer.
    return sum(self.left_BxP[b][:, None] * self.right_BxQ[b][None, :] for b in range(rank))

  def sq_norm(self) -> jax.Array:
    """The squared Frobenius norm, through Gram matrices when that is cheaper.

    ||sum_b l_b r_b^T||^2 = sum_{b,c} (l_b . l_c)(r_b . r_c) costs B^2 (P + Q) instead of the
    B P Q of forming the matrix.
    """
    (rank, p), q = self.left_BxP.shape, self.right_BxQ.shape[1]
    if rank * (p + q) >= p * q:
      return jnp.sum(jnp.square(self.dense()))
    return jnp.sum((self.left_BxP @ self.left_BxP.T) * (self.right_BxQ @ self.right_BxQ.T))


def _is_low_rank(x) -> bool:
  return isinstance(x, LowRank)


class AdamState(struct.PyTreeNode):
  count: jax.Array  # int32, updates applied
  mu: object
  nu: object


def adam_init(params) -> AdamState:
  zeros = lambda p: jnp.zeros_like(p)  # noqa: E731
  return AdamState(count=jnp.zeros((), jnp.int32), mu=jax.tree.map(zeros, params),
                   nu=jax.tree.map(zeros, params))


def adam_update(params, state: AdamState, grads, lr: jax.Array, b1: float = 0.9,
                b2: float = 0.999, eps: float = 1e-8, active: jax.Array | bool = True,
                lr_scales=None):
  """One Adam step; grads leaves may be dense arrays or LowRank. Returns (params, state).

  With active False the step is skipped: parameters, moments and count stay as they were. The
  switch acts through scalar factors, so it costs no extra pass over the parameters.
  `lr_scales` (a tree of floats in the structure of params, or None) multiplies each leaf's
  learning rate: a head that starts at zero can learn faster than the encoder below it.
  """
  active = jnp.asarray(active, bool)
  count = state.count + active.astype(state.count.dtype)
  t = jnp.maximum(count, 1).astype(jnp.float32)
  # Bias corrections as scalar factors: the per-element work is one sqrt and one divide.
  step_size = jnp.where(active, lr / (1.0 - b1 ** t), 0.0)
  nu_scale = 1.0 / (1.0 - b2 ** t)
  b1 = jnp.where(active, b1, 1.0)  # a skipped step keeps the moments: mu = 1 * mu + 0 * g
  b2 = jnp.where(active, b2, 1.0)

  def leaf(p, mu, nu, g, scale):
    g = g.dense() if _is_low_rank(g) else g
    mu = b1 * mu + (1.0 - b1) * g
    nu = b2 * nu + (1.0 - b2) * (g * g)
    size = step_size if scale == 1.0 else step_size * jnp.float32(scale)
    p = p - size * mu / (jnp.sqrt(nu * nu_scale) + eps)
    return p, mu, nu

  flat_p, treedef = jax.tree.flatten(params)
  flat_mu, flat_nu = treedef.flatten_up_to(state.mu), treedef.flatten_up_to(state.nu)
  flat_g = treedef.flatten_up_to(grads)
  flat_s = treedef.flatten_up_to(lr_scales) if lr_scales is not None else [1.0] * len(flat_p)
  new = [leaf(*xs) for xs in zip(flat_p, flat_mu, flat_nu, flat_g, flat_s)]
  unflat = lambda i: treedef.unflatten([x[i] for x in new])  # noqa: E731
  return unflat(0), AdamState(count=count, mu=unflat(1), nu=unflat(2))


def global_norm(grads) -> jax.Array:
  """The L2 norm of all gradients together (LowRank leaves without forming them)."""
  leaves = jax.tree.leaves(grads, is_leaf=_is_low_rank)
  return jnp.sqrt(sum(g.sq_norm() if _is_low_rank(g) else jnp.sum(g * g) for g in leaves))
