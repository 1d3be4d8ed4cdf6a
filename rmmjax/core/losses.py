"""Objectives: REINFORCE from citation rewards, and a supervised listwise loss."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
import rax

from rmmjax.core.selection import selection_log_prob_terms
from rmmjax.core.types import BASELINE_KINDS


def citation_rewards(cited_BxM: jax.Array, selected_BxM: jax.Array) -> jax.Array:
  """+1 for a selected memory the generator cited, -1 for one it did not, 0 for no selection."""
  return jnp.where(selected_BxM >= 0, jnp.where(cited_BxM, 1.0, -1.0), 0.0)


def set_reward(rewards_BxM: jax.Array, selected_BxM: jax.Array) -> jax.Array:
  """One reward per query: the mean over its selected positions (0 when nothing was selected)."""
  num_taken_B = jnp.sum(selected_BxM >= 0, -1).astype(rewards_BxM.dtype)
  return jnp.sum(rewards_BxM, -1) / jnp.maximum(num_taken_B, 1.0)


def present_queries(mask_BxK: jax.Array) -> jax.Array:
  """present_B: the queries that have at least one candidate (the rest are padding)."""
  return jnp.any(mask_BxK, -1)


def masked_mean(values_B: jax.Array, present_B: jax.Array) -> jax.Array:
  """Mean over the present entries (0 when none is)."""
  count = jnp.sum(present_B).astype(values_B.dtype)
  return jnp.sum(jnp.where(present_B, values_B, 0.0)) / jnp.maximum(count, 1.0)


def baseline_values(kind: jax.Array, constant: jax.Array, running_mean: jax.Array,
                    reward_B: jax.Array, present_B: jax.Array | None = None) -> jax.Array:
  """b_B by `kind` (an index into BASELINE_KINDS): constant b; running mean of past rewards;
  batch mean of the other present queries' rewards (leave-one-out, so a query's own reward
  never enters its baseline; 0 when it has no company)."""
  if present_B is None:
    present_B = jnp.ones(reward_B.shape, bool)
  others_B = jnp.sum(present_B).astype(reward_B.dtype) - present_B.astype(reward_B.dtype)
  own_B = jnp.where(present_B, reward_B, 0.0)
  leave_one_out_B = jnp.where(others_B > 0,
                              (jnp.sum(own_B) - own_B) / jnp.maximum(others_B, 1.0), 0.0)
  options = jnp.stack([jnp.full_like(reward_B, constant), jnp.full_like(reward_B, running_mean),
                       leave_one_out_B])
  assert options.shape[0] == len(BASELINE_KINDS)
  return options[kind]


def reinforce_loss(scores_BxK: jax.Array, selected_BxM: jax.Array, rewards_BxM: jax.Array,
                   baseline_B: jax.Array, tau: jax.Array, mask_BxK: jax.Array,
                   credit: str = "set", surrogate: bool = False):
  """REINFORCE loss -(R - b) log P(selection), averaged over the batch's present queries;
  returns (loss, aux: the mean advantage and the mean log-probability). Gradients flow into
  scores_BxK alone. `credit` "set" weights the whole selection's log-probability by the set
  reward (mean over the selected), "position" each position's term by its own reward.
  `surrogate`: the paper's sum-of-log-softmax instead of the Plackett-Luce log-probability."""
  terms_BxM = jax.vmap(selection_log_prob_terms, in_axes=(0, 0, None, 0, None))(
      scores_BxK, selected_BxM, tau, mask_BxK, surrogate)
  taken_BxM = selected_BxM >= 0
  present_B = present_queries(mask_BxK)
  if credit == "set":
    adv_B = jax.lax.stop_gradient(set_reward(rewards_BxM, selected_BxM) - baseline_B)
    per_query_B = adv_B * jnp.sum(terms_BxM, -1)
    mean_adv = masked_mean(adv_B, present_B)
  else:  # position (CoreSpec checked the choice)
    adv_BxM = jax.lax.stop_gradient(jnp.where(taken_BxM, rewards_BxM - baseline_B[:, None], 0.0))
    per_query_B = jnp.sum(adv_BxM * terms_BxM, -1)
    mean_adv = jnp.sum(adv_BxM) / jnp.maximum(jnp.sum(taken_BxM).astype(jnp.float32), 1.0)
  loss = -masked_mean(per_query_B, present_B)
  return loss, {"advantage": mean_adv,
                "log_prob": masked_mean(jnp.sum(terms_BxM, -1), present_B)}


def listwise_loss(scores_BxK: jax.Array, relevant_BxK: jax.Array, mask_BxK: jax.Array,
                  tau: jax.Array | float = 1.0) -> jax.Array:
  """Softmax cross-entropy with several positives (labels spread evenly over the relevant);
  queries without a valid relevant candidate contribute nothing."""
  labels_BxK = (relevant_BxK & mask_BxK).astype(jnp.float32)
  has_pos_B = jnp.sum(labels_BxK, -1) > 0
  labels_BxK = labels_BxK / jnp.maximum(jnp.sum(labels_BxK, -1, keepdims=True), 1.0)
  # Masked logits become a large negative number rather than -inf so no gradient turns NaN.
  logits_BxK = jnp.where(mask_BxK, scores_BxK / tau, -1e30)
  per_query_B = optax.losses.ranking_softmax_loss(
      logits_BxK, labels_BxK, where=mask_BxK, reduce_fn=None)
  return masked_mean(per_query_B, has_pos_B)


def lambda_loss(scores_BxK: jax.Array, relevant_BxK: jax.Array, mask_BxK: jax.Array,
                tau: jax.Array | float = 1.0) -> jax.Array:
  """LambdaLoss (Wang et al., 2018, the NDCG-Loss2 weighting, through rax): the logistic loss
  of every (relevant, irrelevant) pair of a query's candidates, each weighted by how much NDCG
  swapping the two would change at their present ranks, so the order at the top of the list
  counts most; a mean over the pairs. Queries without a valid relevant candidate contribute
  nothing."""
  labels_BxK = (relevant_BxK & mask_BxK).astype(jnp.float32)
  weights = functools.partial(rax.dcg2_lambdaweight, normalize=True)
  # (rax discounts integer ranks as floats: standard promotion, wherever strict is set)
  with jax.numpy_dtype_promotion("standard"):
    return rax.pairwise_logistic_loss(scores_BxK / tau, labels_BxK, where=mask_BxK,
                                      lambdaweight_fn=weights, reduce_fn=jnp.mean)


def weakest_piece_loss(scores_BxK: jax.Array, relevant_BxK: jax.Array, mask_BxK: jax.Array,
                       tau: jax.Array | float = 1.0) -> jax.Array:
  """Each relevant candidate's softmax cross-entropy against the irrelevant ones alone (not
  its fellow relevant ones), the largest of a query's: a question whose evidence is several
  turns is found only when its hardest piece is, and that piece takes the whole gradient. With
  one relevant candidate it is `listwise_loss`. Queries without a valid relevant candidate
  contribute nothing."""
  logits_BxK = jnp.where(mask_BxK, scores_BxK / tau, -1e30)
  relevant_BxK = relevant_BxK & mask_BxK
  negatives_B = jax.nn.logsumexp(jnp.where(relevant_BxK, -1e30, logits_BxK), -1)
  # -log(e^s / (e^s + sum of the irrelevant's e^s)) of each relevant candidate
  piece_BxK = jnp.logaddexp(logits_BxK, negatives_B[:, None]) - logits_BxK
  has_pos_B = jnp.any(relevant_BxK, -1)
  return masked_mean(jnp.max(jnp.where(relevant_BxK, piece_BxK, -1e30), -1), has_pos_B)


# The supervised losses pretraining may take (cross.pretrain_loss), by name.
PRETRAIN_LOSSES = {"softmax": listwise_loss, "lambda": lambda_loss, "weakest": weakest_piece_loss}


def grouped_listwise_loss(scores_BxK: jax.Array, covers_BxKxE: jax.Array, mask_BxK: jax.Array,
                          tau: jax.Array | float = 1.0) -> jax.Array:
  """Listwise loss over evidence items that several candidates may cover (facts of one turn):
  -log sum_{k covers e} softmax_k, averaged over the items some valid candidate covers. Unlike
  `listwise_loss`, which spreads the labels over every relevant candidate, one good fact of a
  turn suffices: the turn's other clauses ("that's great!") are not pushed up with it."""
  logits_BxK = jnp.where(mask_BxK, scores_BxK / tau, -1e30)
  log_p_BxK = jax.nn.log_softmax(logits_BxK, -1)
  covers_BxKxE = covers_BxKxE & mask_BxK[:, :, None]
  log_p_BxKxE = jnp.where(covers_BxKxE, log_p_BxK[:, :, None], -1e30)
  return -masked_mean(jax.nn.logsumexp(log_p_BxKxE, axis=1), jnp.any(covers_BxKxE, axis=1))
