"""Whole runs as one `lax.scan`, and sweeps as `jit(vmap(run))` over hyperparameters."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rmmjax.core import simulate
from rmmjax.core.step import evaluate, init_state, train_step
from rmmjax.core.types import CoreSpec, HParams, TrainState

# Streams folded out of a run's root key (stream 0 initialises the parameters).
_DATA_STREAM, _STEP_STREAM = 1, 2


def run_steps(state: TrainState, world: simulate.World, sim: simulate.SimSpec,
              num_steps: int, batch_sharding=None) -> tuple[TrainState, dict]:
  """Advances a run by num_steps simulated steps; the state and per-step metrics. Step t sees the
  batch and noise of step t however the run is cut, so a resumed run repeats an uninterrupted
  one. `batch_sharding` (static) splits each batch over devices; the compiler reduces the
  gradient."""
  data_key = jax.random.fold_in(state.key, _DATA_STREAM)
  step_key = jax.random.fold_in(state.key, _STEP_STREAM)

  def body(state, _):
    batch = simulate.sample_batch(world, jax.random.fold_in(data_key, state.step), sim,
                                  state.spec)
    if batch_sharding is not None:
      batch = jax.lax.with_sharding_constraint(batch, batch_sharding)
    return train_step(state, batch, step_key)

  return jax.lax.scan(body, state, None, length=num_steps)


def make_run(spec: CoreSpec, sim: simulate.SimSpec, steps: int,
             eval_sessions: int) -> Callable[[HParams, simulate.World], dict]:
  """run(hparams, world) -> {"metrics": per-step metrics, "eval_first", "eval_final"}."""

  def run(hparams: HParams, world: simulate.World) -> dict:
    eval_batch = simulate.sample_eval_batch(world, sim, spec, eval_sessions)
    state = init_state(spec, hparams)
    eval_first = evaluate(state.params, eval_batch, spec)
    state, metrics = run_steps(state, world, sim, steps)
    return {"metrics": metrics, "eval_first": eval_first,
            "eval_final": evaluate(state.params, eval_batch, spec)}

  return run


def stack_hparams(points: list[HParams]) -> HParams:
  """Stacks scalar HParams into one with a leading sweep axis."""
  return jax.tree.map(lambda *xs: jnp.stack(xs), *points)


def make_sweep(spec: CoreSpec, sim: simulate.SimSpec, steps: int, eval_sessions: int):
  """jit(vmap(run)): runs a chunk of configurations (leading axis of hparams) in one program."""
  return jax.jit(jax.vmap(make_run(spec, sim, steps, eval_sessions), in_axes=(0, None)))
