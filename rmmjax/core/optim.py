"""Adam as an optax transformation that also accepts gradients in low-rank form.

A batch of B queries gives the linear reranker gradients that are sums of B outer products.
Passed as factors (`LowRank`), the dense gradient is formed by `densify`, whose broadcasts XLA
fuses into Adam's elementwise update: it is never written to memory, and one step reads and
writes the parameters and both moments once, the floor for Adam. The rest is optax's own Adam.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
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


def densify() -> optax.GradientTransformation:
  """Forms each LowRank gradient leaf (the others pass through)."""
  return optax.stateless(lambda updates, params=None: jax.tree.map(
      lambda g: g.dense() if _is_low_rank(g) else g, updates, is_leaf=_is_low_rank))


def scale_by_tree(scales) -> optax.GradientTransformation:
  """Multiplies each leaf's update by its float in `scales` (None: all 1): a head that starts at
  zero can learn faster than the encoder below it."""
  if scales is None:
    return optax.identity()
  return optax.stateless(lambda updates, params=None: jax.tree.map(
      lambda u, s: u if s == 1.0 else u * jnp.float32(s), updates, scales))


def adam(lr: jax.Array | float, lr_scales=None) -> optax.GradientTransformation:
  """optax's Adam at rate `lr` (a traced value in a sweep: each configuration's own), over
  gradients that may be LowRank, each leaf's rate times its `lr_scales`."""
  return optax.chain(densify(), optax.scale_by_adam(), scale_by_tree(lr_scales),
                     optax.scale_by_learning_rate(lr))


def adam_init(params):
  """The optimizer state of `adam` for `params` (its rate and scales keep no state)."""
  return adam(1.0).init(params)


def adam_update(params, state, grads, lr: jax.Array, active: jax.Array | bool = True,
                lr_scales=None):
  """One `adam` step; returns (params, state). With active False the step is skipped:
  parameters, moments and count stay as they were (the selects fuse into the update)."""
  updates, new_state = adam(lr, lr_scales).update(grads, state, params)
  new_params = optax.apply_updates(params, updates)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(active, n, o), new, old)  # noqa: E731
  return keep(new_params, params), keep(new_state, state)


def global_norm(grads) -> jax.Array:
  """The L2 norm of all gradients together (LowRank leaves without forming them)."""
  leaves = jax.tree.leaves(grads, is_leaf=_is_low_rank)
  return jnp.sqrt(sum(g.sq_norm() if _is_low_rank(g) else jnp.sum(g * g) for g in leaves))
