"""Adam as an optax transformation that also accepts gradients in low-rank form (`LowRank`);
why: docs/implemented.md, Optimizer."""

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
    """The squared Frobenius norm, through Gram matrices when cheaper: ||sum_b l_b r_b^T||^2 =
    sum_{b,c} (l_b . l_c)(r_b . r_c) costs B^2 (P + Q), not the B P Q of forming the matrix."""
    (rank, p), q = self.left_BxP.shape, self.right_BxQ.shape[1]
    if rank * (p + q) >= p * q:
      return jnp.sum(jnp.square(self.dense()))
    return jnp.sum((self.left_BxP @ self.left_BxP.T) * (self.right_BxQ @ self.right_BxQ.T))


def adam(lr: jax.Array | float, active: jax.Array | bool = True, lr_scales=None, b1: float = 0.9,
         b2: float = 0.999, eps: float = 1e-8) -> optax.GradientTransformation:
  """Adam at rate `lr` (a traced value in a sweep: each configuration's own) as an optax
  transformation (its state optax's `ScaleByAdamState`), over gradient leaves that may be
  LowRank, each leaf's rate times its float in `lr_scales` (None: all 1: a head that starts at
  zero can learn faster than the encoder below it). With `active` False the step is skipped:
  moments and count stay as they were and the update is zero. The switch and the bias
  corrections act through scalar factors, so the per-element work is one fused pass; the
  arithmetic is optax.adam's (tested against it)."""

  def init(params):
    zeros = lambda p: jnp.zeros_like(p)  # noqa: E731
    return optax.ScaleByAdamState(count=jnp.zeros((), jnp.int32),
                                  mu=jax.tree.map(zeros, params), nu=jax.tree.map(zeros, params))

  def update(grads, state, params=None):
    del params
    on = jnp.asarray(active, bool)
    count = state.count + on.astype(state.count.dtype)
    t = jnp.maximum(count, 1).astype(jnp.float32)
    step_size = jnp.where(on, lr / (1.0 - b1 ** t), 0.0)
    nu_scale = 1.0 / (1.0 - b2 ** t)
    decay1 = jnp.where(on, b1, 1.0)  # a skipped step keeps the moments: mu = 1 * mu + 0 * g
    decay2 = jnp.where(on, b2, 1.0)

    def leaf(mu, nu, g, scale):
      g = g.dense() if isinstance(g, LowRank) else g
      mu = decay1 * mu + (1.0 - decay1) * g
      nu = decay2 * nu + (1.0 - decay2) * (g * g)
      size = step_size if scale == 1.0 else step_size * jnp.float32(scale)
      return -(size * mu / (jnp.sqrt(nu * nu_scale) + eps)), mu, nu

    treedef = jax.tree.structure(state.mu)
    flat_mu, flat_nu = treedef.flatten_up_to(state.mu), treedef.flatten_up_to(state.nu)
    flat_g = treedef.flatten_up_to(grads)
    flat_s = treedef.flatten_up_to(lr_scales) if lr_scales is not None else [1.0] * len(flat_mu)
    new = [leaf(*xs) for xs in zip(flat_mu, flat_nu, flat_g, flat_s)]
    unflat = lambda i: treedef.unflatten([x[i] for x in new])  # noqa: E731
    return unflat(0), optax.ScaleByAdamState(count=count, mu=unflat(1), nu=unflat(2))

  return optax.GradientTransformation(init, update)


def adam_init(params) -> optax.ScaleByAdamState:
  """The state of `adam` for `params` (its rate, switch and scales keep none)."""
  return adam(1.0).init(params)


def adam_update(params, state, grads, lr: jax.Array, active: jax.Array | bool = True,
                lr_scales=None):
  """One `adam` step applied to `params`; returns (params, state)."""
  updates, state = adam(lr, active, lr_scales).update(grads, state, params)
  return optax.apply_updates(params, updates), state


def global_norm(grads) -> jax.Array:
  """The L2 norm of all gradients together (LowRank leaves without forming them)."""
  leaves = jax.tree.leaves(grads, is_leaf=lambda g: isinstance(g, LowRank))
  return jnp.sqrt(sum(g.sq_norm() if isinstance(g, LowRank) else jnp.sum(g * g) for g in leaves))
