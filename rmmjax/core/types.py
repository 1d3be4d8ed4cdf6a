"""Pytrees the core passes around: `CoreSpec` fixes a compiled program (changing it
recompiles); `HParams` holds every value a sweep varies, as arrays a sweep vmaps over."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

FORMULATIONS = ("fast", "naive")
BASELINE_KINDS = ("constant", "running", "batch")
CREDITS = ("set", "position")
LOG_PROBS = ("plackett_luce", "surrogate")
SAMPLINGS = ("gumbel", "paper")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
  if value not in choices:
    raise ValueError(f"{name}={value!r} is not one of {', '.join(choices)}")


def check_positive_int(name: str, value: Any) -> None:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(f"{name}={value!r}: expected a positive integer")


@dataclasses.dataclass(frozen=True)
class CoreSpec:
  """Static description of the reranker and its objective."""

  variant: str = "linear"  # linear (paper Eq. 1) or mlp (residual MLP, paper appendix)
  formulation: str = "fast"  # linear only: fast transforms the query only; naive all K memories
  dim: int = 64  # embedding dimension D
  hidden: int = 256  # hidden width of the mlp variant
  k: int = 20  # candidates from the base retriever
  m: int = 5  # memories selected for the generator
  batch: int = 4  # queries per update
  credit: str = "set"  # set: one reward per query; position: each selected memory its own
  log_prob: str = "plackett_luce"  # or surrogate: sum of log-softmax of the selected
  sampling: str = "gumbel"  # gumbel: top-M of s/tau + g (exact); paper: top-M of s + g
  running_decay: float = 0.99  # decay of the running-mean baseline
  # A learnable bias per candidate position, added to every score. It lets the reranker keep
  # what the base retriever knew but the embeddings do not (BM25's term matches, say): the
  # identity reranker plus a rank prior can learn to follow the base order where it is right.
  rank_prior: bool = False
  # Where that prior starts: -prior_scale * log(1 + position) (core.rank_prior_init); flat at 0.
  # A scale above the spread of the model's own scores starts it at its candidates' order.
  prior_scale: float = 0.0
  # The learner's scoring model (a core.Model, hashable and static): the core's selection,
  # log-probability, losses and steps see only its scores, so a new family needs no change
  # here. None for a config checked before its learner supplies it.
  model: Any = None

  def __post_init__(self):
    _check_choice("formulation", self.formulation, FORMULATIONS)
    _check_choice("credit", self.credit, CREDITS)
    _check_choice("log_prob", self.log_prob, LOG_PROBS)
    _check_choice("sampling", self.sampling, SAMPLINGS)
    for name in ("dim", "hidden", "k", "m", "batch"):
      check_positive_int(name, getattr(self, name))
    if self.m > self.k:
      raise ValueError(f"m={self.m} > k={self.k}: cannot select more memories than candidates")
    if not 0.0 <= self.running_decay < 1.0:
      raise ValueError(f"running_decay={self.running_decay!r}: expected a value in [0, 1)")


class HParams(struct.PyTreeNode):
  """Sweepable hyperparameters; every leaf is an array (scalar per run, (C,) per sweep)."""

  tau: jax.Array  # Gumbel / softmax temperature
  baseline: jax.Array  # constant baseline b
  baseline_kind: jax.Array  # int32 index into BASELINE_KINDS
  lr: jax.Array  # Adam learning rate
  seed: jax.Array  # int32 seed of the run's randomness
  p_rel: jax.Array  # probability the generator cites a relevant selected memory
  p_irr: jax.Array  # probability the generator cites an irrelevant selected memory

  @classmethod
  def create(cls, *, tau=0.5, baseline=0.5, baseline_kind="constant", lr=1e-3, seed=0,
             p_rel=0.911, p_irr=0.154) -> "HParams":
    """Builds scalar hyperparameters from Python values (tau and lr as the config or the
    agent's settings checked them), validating the probabilities and the baseline kind."""
    for name, p in (("p_rel", p_rel), ("p_irr", p_irr)):
      if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}={p!r}: expected a probability in [0, 1]")
    _check_choice("baseline_kind", baseline_kind, BASELINE_KINDS)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return cls(tau=f32(tau), baseline=f32(baseline),
               baseline_kind=jnp.asarray(BASELINE_KINDS.index(baseline_kind), jnp.int32),
               lr=f32(lr), seed=jnp.asarray(seed, jnp.int32), p_rel=f32(p_rel), p_irr=f32(p_irr))


class Batch(struct.PyTreeNode):
  """B queries with their K base-retriever candidates, in base order (best first). A query whose
  mask row is all False is absent (padding of a replayed stream) and enters nothing. The labels
  (relevant_BxK, num_relevant_B, evidence_BxKxE) are None where serving learns from citations."""

  q_BxD: jax.Array
  mem_BxKxD: jax.Array
  mask_BxK: jax.Array  # bool: candidate exists (a bank may hold fewer than K memories)
  relevant_BxK: jax.Array | None = None  # bool: candidate is relevant to the query
  # The recall denominator: relevant memories in the whole bank, or, when evidence_BxKxE is
  # given, the query's evidence items (a labelled question's evidence turns).
  num_relevant_B: jax.Array | None = None
  # bool, optional: candidate k covers the query's evidence item e (padded with False). A unit
  # that spans several turns (a session, a topic) covers several; recall then counts evidence
  # items found, the definition every evaluation uses, not relevant units selected.
  evidence_BxKxE: jax.Array | None = None
  # A learner's own inputs for each candidate, beyond the embeddings, leading axes (B, K) (the
  # cross reranker's pair tokens as the host keeps them, then packed into rows for its model
  # by its reader: rmmjax.learners.cross.pairs); None for the embedding rerankers.
  inputs: Any = None
  # int32, optional: each candidate's position in the base order (default 0..K-1). A batch of
  # a subset of each query's candidates (pretraining on a few negatives) keeps their rank prior.
  positions_BxK: jax.Array | None = None


class TrainState(struct.PyTreeNode):
  """Everything a run carries from step to step."""

  step: jax.Array  # int32, completed updates
  params: Any
  opt_state: Any
  hparams: HParams
  reward_mean: jax.Array  # running mean of the reward (the running baseline)
  key: jax.Array  # the run's root key; each step folds in its step number
  spec: CoreSpec = struct.field(pytree_node=False)
