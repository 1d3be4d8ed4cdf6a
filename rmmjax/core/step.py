"""Pure update steps: REINFORCE from citation rewards, and supervised listwise pretraining."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rmmjax.core import losses, optim, selection
from rmmjax.core.simulate import simulate_citations
from rmmjax.core.types import Batch, CoreSpec, HParams, TrainState


def init_state(spec: CoreSpec, hparams: HParams, params=None) -> TrainState:
  """A fresh run: the model's initial parameters (or the given ones: a cross reranker's come
  from a pretrained encoder), Adam state, root key from hparams.seed."""
  key = jax.random.PRNGKey(hparams.seed)
  if params is None:
    if spec.model is None:  # a spec built by hand, not through its learner's registry entry
      raise ValueError(f"variant={spec.variant!r}: the spec has no scoring model; its learner "
                       "supplies one (rmmjax.learners.registry.with_model)")
    params = spec.model.init_params(jax.random.fold_in(key, 0), spec)
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optim.adam_init(params), hparams=hparams,
                    reward_mean=jnp.zeros((), jnp.float32), key=key, spec=spec)


def scores_and_pullback(params, batch: Batch, spec: CoreSpec) -> tuple[jax.Array, Callable]:
  """scores_BxK, and a function taking d(loss)/d(scores) to parameter gradients, as the spec's
  model computes them (`Model.scores_and_pullback`)."""
  return spec.model.scores_and_pullback(params, batch, spec)


def scores(params, batch: Batch, spec: CoreSpec) -> jax.Array:
  """The spec's model's scores of a batch's candidates, scores_BxK."""
  return spec.model.scores(params, batch, spec)


def sample_selection(scores_BxK: jax.Array, mask_BxK: jax.Array, gumbel_BxK: jax.Array,
                     spec: CoreSpec, tau: jax.Array) -> jax.Array:
  """Gumbel top-M for each query of a batch, selected_BxM, from the given Gumbel noise."""
  return jax.vmap(selection.perturbed_top_m, in_axes=(0, 0, None, None, 0, None))(
      scores_BxK, gumbel_BxK, spec.m, tau, mask_BxK, spec.sampling == "paper")


def gather_positions(values_BxK: jax.Array, selected_BxM: jax.Array) -> jax.Array:
  """values at the selected candidates, False/0 where a position holds -1."""
  picked = jnp.take_along_axis(values_BxK, jnp.maximum(selected_BxM, 0), axis=-1)
  return jnp.where(selected_BxM >= 0, picked, jnp.zeros_like(picked))


def recall_per_query(selected_BxM: jax.Array, batch: Batch) -> jax.Array:
  """recall_B: evidence items (batch.evidence_BxKxE) covered by a selected candidate / the
  query's evidence items; without evidence labels, relevant memories selected / relevant
  memories in the bank (the same number when every candidate is one evidence item)."""
  if batch.evidence_BxKxE is None:
    hits_B = jnp.sum(gather_positions(batch.relevant_BxK, selected_BxM), -1)
  else:
    taken_BxM = selected_BxM >= 0
    picked_BxMxE = jnp.take_along_axis(batch.evidence_BxKxE,
                                       jnp.maximum(selected_BxM, 0)[..., None], axis=1)
    covered_BxE = jnp.any(picked_BxMxE & taken_BxM[..., None], axis=1)
    hits_B = jnp.sum(covered_BxE, -1)
  return hits_B.astype(jnp.float32) / jnp.maximum(batch.num_relevant_B.astype(jnp.float32), 1.0)


def top_m_recall(scores_BxK: jax.Array, batch: Batch, m: int) -> jax.Array:
  """Recall of each query's deterministic top M under these scores, recall_B."""
  top_BxM = jax.vmap(selection.top_m, in_axes=(0, None, 0))(scores_BxK, m, batch.mask_BxK)
  return recall_per_query(top_BxM, batch)


def recall_at_m(selected_BxM: jax.Array, batch: Batch) -> jax.Array:
  """Mean recall over the present queries (see `recall_per_query`)."""
  return losses.masked_mean(recall_per_query(selected_BxM, batch),
                            losses.present_queries(batch.mask_BxK))


def _apply(state: TrainState, grads, active: jax.Array) -> TrainState:
  """Adam on the gradients; a batch without any present query leaves the state as it was. The
  model's learning-rate multipliers apply (none without a model: a scorer given to the step
  trains the parameters, such as the encoder's own)."""
  model = state.spec.model
  scales = None if model is None else model.lr_scales(state.params)
  params, opt_state = optim.adam_update(state.params, state.opt_state, grads, state.hparams.lr,
                                        active, scales)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state)


def _reinforce(state: TrainState, batch: Batch, scores_BxK: jax.Array, pullback: Callable,
               selected_BxM: jax.Array, rewards_BxM: jax.Array) -> tuple[TrainState, dict]:
  spec, hp = state.spec, state.hparams
  # The mean reward of a query's selected memories: the set reward, and under per-position
  # credit the quantity the running and batch baselines track.
  reward_B = losses.set_reward(rewards_BxM, selected_BxM)
  present_B = losses.present_queries(batch.mask_BxK)
  active = jnp.any(present_B)
  baseline_B = losses.baseline_values(hp.baseline_kind, hp.baseline, state.reward_mean, reward_B,
                                      present_B)
  (loss, aux), g_scores_BxK = jax.value_and_grad(losses.reinforce_loss, has_aux=True)(
      scores_BxK, selected_BxM, rewards_BxM, baseline_B, hp.tau, batch.mask_BxK, spec.credit,
      spec.log_prob == "surrogate")
  grads = pullback(g_scores_BxK)
  entropy_B = jax.vmap(selection.selection_entropy, in_axes=(0, None, 0))(
      scores_BxK, hp.tau, batch.mask_BxK)
  mean_reward = losses.masked_mean(reward_B, present_B)
  metrics = {"loss": loss, "grad_norm": optim.global_norm(grads),
             "entropy": losses.masked_mean(entropy_B, present_B), "reward": mean_reward, **aux}
  decay = jnp.where(active, spec.running_decay, 1.0)
  state = state.replace(reward_mean=decay * state.reward_mean + (1 - decay) * mean_reward)
  return _apply(state, grads, active), metrics


def reinforce_update(state: TrainState, batch: Batch, selected_BxM: jax.Array,
                     rewards_BxM: jax.Array) -> tuple[TrainState, dict]:
  """One REINFORCE update from rewards the caller observed (a real generator's citations)."""
  scores_BxK, pullback = scores_and_pullback(state.params, batch, state.spec)
  return _reinforce(state, batch, scores_BxK, pullback, selected_BxM, rewards_BxM)


def train_step(state: TrainState, batch: Batch, key: jax.Array,
               scorer: Callable | None = None,
               prequential: bool = False) -> tuple[TrainState, dict]:
  """Select with the current reranker, draw simulated citations, update with REINFORCE.

  `key` is the run's step stream (the step number is folded in here). `scorer(params, batch)`
  -> (scores_BxK, pullback) stands in for the reranker when the parameters are another's (the
  encoder's, for REINFORCE on the retriever). With `prequential` (static) the metrics add, from
  the same forward pass, what the reranker as it stands would have served: `recall_B` (top M)
  and `scores_BxK`."""
  spec, hp = state.spec, state.hparams
  # One draw of uniforms for the whole step: Gumbel noise for selection, then citation coins.
  num_queries, k = batch.mask_BxK.shape
  u_BxKM = jax.random.uniform(jax.random.fold_in(key, state.step), (num_queries, k + spec.m),
                              minval=jnp.finfo(jnp.float32).tiny)
  del key
  gumbel_BxK = -jnp.log(-jnp.log(u_BxKM[:, :k]))
  scorer = scorer or (lambda params, batch: scores_and_pullback(params, batch, spec))
  scores_BxK, pullback = scorer(state.params, batch)
  selected_BxM = sample_selection(scores_BxK, batch.mask_BxK, gumbel_BxK, spec, hp.tau)
  relevant_BxM = gather_positions(batch.relevant_BxK, selected_BxM)
  cited_BxM = simulate_citations(u_BxKM[:, k:], relevant_BxM, selected_BxM, hp.p_rel,
                                 hp.p_irr)
  rewards_BxM = losses.citation_rewards(cited_BxM, selected_BxM)
  state, metrics = _reinforce(state, batch, scores_BxK, pullback, selected_BxM, rewards_BxM)
  taken = jnp.maximum(jnp.sum(selected_BxM >= 0).astype(jnp.float32), 1.0)
  metrics["citation_rate"] = jnp.sum(cited_BxM).astype(jnp.float32) / taken
  metrics["recall_at_m"] = recall_at_m(selected_BxM, batch)
  if prequential:
    metrics["recall_B"] = top_m_recall(scores_BxK, batch, spec.m)
    metrics["scores_BxK"] = scores_BxK
  return state, metrics


def supervised_step(state: TrainState, batch: Batch, scorer: Callable | None = None,
                    loss_fn: Callable = losses.listwise_loss) -> tuple[TrainState, dict]:
  """One step of listwise pretraining on labelled relevance (`loss_fn`: one of
  `losses.PRETRAIN_LOSSES`; `scorer` as in `train_step`)."""
  scorer = scorer or (lambda params, batch: scores_and_pullback(params, batch, state.spec))
  scores_BxK, pullback = scorer(state.params, batch)
  loss, g_scores_BxK = jax.value_and_grad(loss_fn)(
      scores_BxK, batch.relevant_BxK, batch.mask_BxK, state.hparams.tau)
  grads = pullback(g_scores_BxK)
  active = jnp.any(batch.relevant_BxK & batch.mask_BxK)
  return _apply(state, grads, active), {"loss": loss, "grad_norm": optim.global_norm(grads)}


def evaluate(params, batch: Batch, spec: CoreSpec) -> dict:
  """Deterministic top-M recall of the reranker, the base order, and all K candidates."""
  scores_BxK = scores(params, batch, spec)
  reranked_BxM = jax.vmap(selection.top_m, in_axes=(0, None, 0))(scores_BxK, spec.m,
                                                                  batch.mask_BxK)
  base_BxM = jnp.where(batch.mask_BxK[:, :spec.m], jnp.arange(spec.m)[None, :], -1)
  all_BxK = jnp.where(batch.mask_BxK, jnp.arange(spec.k)[None, :], -1)
  return {"recall_at_m": recall_at_m(reranked_BxM, batch),
          "recall_at_m_base": recall_at_m(base_BxM, batch),
          "recall_at_k": recall_at_m(all_BxK, batch)}
