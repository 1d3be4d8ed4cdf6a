"""Replay of recorded conversations (docs/implemented.md, Replay). A stream is a Batch with a
leading step axis, stream_SxB: step s holds the B questions asked s-th, each with its K
candidates and evidence labels; absent queries (no candidate) pad streams to one length."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rmmjax.core import optim
from rmmjax.core.step import scores, supervised_step, top_m_recall, train_step
from rmmjax.core.types import Batch, TrainState

# Streams folded out of a run's root key (0 initialises the parameters, 1 and 2 the latent
# simulator's data and steps).
_PRETRAIN_STREAM, _REPLAY_STREAM, _HELDOUT_STREAM = 3, 4, 5


def step_batch(stream_SxB, index: jax.Array):
  """The batch of step `index` (taken modulo the stream's length, so epochs wrap around) of a
  stream: any pytree whose leaves have the step axis first."""
  num_steps = jax.tree.leaves(stream_SxB)[0].shape[0]
  return jax.tree.map(lambda x: jnp.asarray(x)[index % num_steps], stream_SxB)


def stream_steps(step: Callable, state: TrainState, stream_SxB,
                 num_steps: int) -> tuple[TrainState, dict]:
  """num_steps of `step(state, batch) -> (state, metrics)`, step t on stream step t (the
  state's step counts them), so a run cut into segments equals an uninterrupted one. The one
  scan of every online loop over a stream: the training loop's (rmmjax.fit.Online) and the
  vmapped replay sweeps'."""
  return jax.lax.scan(lambda s, _: step(s, step_batch(stream_SxB, s.step)), state, None,
                      length=num_steps)


def rerank_recall(params, batch: Batch, spec) -> tuple[jax.Array, jax.Array]:
  """Deterministic top-M recall of each query, recall_B, and the reranker's scores_BxK."""
  scores_BxK = scores(params, batch, spec)
  return top_m_recall(scores_BxK, batch, spec.m), scores_BxK


def replay_step(state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
  """One online REINFORCE update from simulated citations; its forward pass also ranks the batch
  with the reranker as it stands, so `recall_sum_before` / `present` is the prequential recall:
  what a user would have received."""
  state, metrics = train_step(state, batch, jax.random.fold_in(state.key, _REPLAY_STREAM),
                              prequential=True)
  present_B = jnp.any(batch.mask_BxK, -1)
  metrics["recall_sum_before"] = jnp.sum(jnp.where(present_B, metrics.pop("recall_B"), 0.0))
  metrics["present"] = jnp.sum(present_B).astype(jnp.float32)
  del metrics["scores_BxK"]
  return state, metrics


def replay_steps(state: TrainState, stream_SxB: Batch, num_steps: int) -> tuple[TrainState, dict]:
  """num_steps `replay_step`s, step t on stream step t."""
  return stream_steps(replay_step, state, stream_SxB, num_steps)


def prequential(state: TrainState, stream_SxB: Batch, adapt: bool,
                 stream_id: jax.Array | int = 0) -> dict:
  """recall_SxB (top-M recall, 0 for absent questions) and scores_SxBxK of every question of a
  stream under the reranker as it stands; with adapt, it then learns from each batch's simulated
  citations before the next arrives. `stream_id` gives streams vmapped side by side their own
  Gumbel noise and citations."""
  key = jax.random.fold_in(jax.random.fold_in(state.key, _HELDOUT_STREAM), stream_id)

  def body(state, batch):
    if not adapt:
      recall_B, scores_BxK = rerank_recall(state.params, batch, state.spec)
      return state, {"recall_B": recall_B, "scores_BxK": scores_BxK}
    # One forward pass: the update's own scores rank the batch before it learns from it.
    state, metrics = train_step(state, batch, key, prequential=True)
    return state, {"recall_B": metrics["recall_B"], "scores_BxK": metrics["scores_BxK"]}

  _, out = jax.lax.scan(body, state, stream_SxB)
  return {"recall_SxB": out["recall_B"], "scores_SxBxK": out["scores_BxK"]}


def pretrain(state: TrainState, questions_N: Batch, epochs: int,
             batch_sharding=None) -> tuple[TrainState, jax.Array]:
  """Supervised listwise pretraining under the state's lr and tau: `epochs` shuffled passes over
  N questions in batches of spec.batch (each pass's last partial batch dropped); the state and
  every step's loss. `batch_sharding` (static) places a pass's (steps, batch, ...) batches."""
  b = state.spec.batch
  num = questions_N.mask_BxK.shape[0]
  per_epoch = num // b
  if per_epoch < 1:
    raise ValueError(f"{num} questions cannot fill one batch of {b}")
  key = jax.random.fold_in(state.key, _PRETRAIN_STREAM)

  def epoch(state, e):
    order = jax.random.permutation(jax.random.fold_in(key, e), num)[:per_epoch * b]
    batches = jax.tree.map(lambda x: jnp.asarray(x)[order].reshape((per_epoch, b) + x.shape[1:]),
                           questions_N)
    if batch_sharding is not None:
      batches = jax.lax.with_sharding_constraint(batches, batch_sharding)
    return jax.lax.scan(lambda s, batch: supervised_step(s, batch), state, batches)

  state, metrics = jax.lax.scan(epoch, state, jnp.arange(epochs))
  return state, metrics["loss"].reshape(-1)


def restart_optimizer(state: TrainState, hparams) -> TrainState:
  """The same parameters under new hyperparameters, with fresh Adam moments and step 0 (the
  switch from offline pretraining to online learning)."""
  return state.replace(step=jnp.zeros((), jnp.int32), opt_state=optim.adam_init(state.params),
                       hparams=hparams, reward_mean=jnp.zeros((), jnp.float32))
