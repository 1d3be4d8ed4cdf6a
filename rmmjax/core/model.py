"""What the core asks of a scoring model (CoreSpec.model), whatever its family.

The core's selection, log-probability, losses and steps see only the scores a model gives; a
learner subclasses `Model` and hands an instance to the spec (static and hashable, so a spec
that holds it keys one compiled program).
"""

from __future__ import annotations

import abc
from typing import Callable

import jax
import jax.numpy as jnp


class Model(abc.ABC):
  """A family's scorer: `scores` is its one required part."""

  @abc.abstractmethod
  def scores(self, params, batch, spec) -> jax.Array:
    """scores_BxK of a batch's candidates (its embeddings, or the learner's own inputs)."""

  def init_params(self, key: jax.Array, spec):
    """The parameters a fresh model starts from."""
    raise ValueError(f"variant={spec.variant!r}: its parameters come from its learner; pass "
                     "them to init_state")

  def lr_scales(self, params):
    """Each parameter's learning-rate multiplier (None: all 1)."""
    del params
    return None

  def scores_and_pullback(self, params, batch, spec) -> tuple[jax.Array, Callable]:
    """scores_BxK, and a function taking d(loss)/d(scores) to parameter gradients (autodiff,
    unless a model knows a cheaper form: the linear reranker's low-rank factors)."""
    scores_BxK, vjp = jax.vjp(lambda p: self.scores(p, batch, spec), params)
    return scores_BxK, lambda g_BxK: vjp(g_BxK)[0]


def rank_prior_init(k: int, scale: float) -> jax.Array:
  """A prior over the K base positions: -scale * log(1 + position), flat at scale 0. Where a
  model's own scores are flat (the cross reranker's head at zero) or spread less than it, the
  scores follow the base order; in units of the temperature, `scale` sets how concentrated the
  first samples are."""
  return -jnp.float32(scale) * jnp.log1p(jnp.arange(k, dtype=jnp.float32))
