"""What a training run learns from: the latent simulator, or a replayed labelled dataset.

A task gives the training loop its first state, a compiled way to advance it by n online steps,
and an evaluation; the loop (loop.py) does the logging, checkpointing and resuming for both.
"""

from __future__ import annotations

import jax

from rmmjax import core, distributed
from rmmjax.config import Config
from rmmjax.io.record import latent_record
from rmmjax.train.cross_task import CrossRerankerTask
from rmmjax.train.encoder_task import QueryEncoderTask
from rmmjax.train.iris_models_task import IrisLearnedTask
from rmmjax.train.iris_reranker_task import IrisTask
from rmmjax.train.replay_task import ReplayTask
from rmmjax.train.task import Task


class LatentTask(Task):
  """Sessions drawn from the latent simulator; evaluation on held-out simulated sessions."""

  def __init__(self, cfg: Config):
    self.spec, self.sim, hp = cfg.core_spec(), cfg.sim_spec(), cfg.hparams()
    self.world = core.make_world(self.sim, self.spec.dim)
    self.eval_batch = core.sample_eval_batch(self.world, self.sim, self.spec, cfg.eval_sessions)
    self.template = core.init_state(self.spec, hp)
    self.eval_queries = cfg.eval_sessions * cfg.batch
    self.record = latent_record(cfg)
    # Data parallel over the mesh: each drawn batch split over its devices, the rest replicated.
    self._data_parallel(cfg.devices, {"batch": cfg.batch})
    self._sharding = None
    if self._parallel:
      self._sharding = distributed.batch_sharding(self.mesh)
      self.world = distributed.replicate(self.world, self.mesh)
      self.eval_batch = distributed.replicate(self.eval_batch, self.mesh)
    self._evaluate = jax.jit(core.evaluate, static_argnums=2)
    self._advance = jax.jit(core.run_steps, static_argnums=(2, 3, 4), donate_argnums=0)

  def initial_state(self) -> core.TrainState:
    return self.template

  def advance(self, state: core.TrainState, n: int):
    return self._advance(self._replicated(state), self.world, self.sim, n, self._sharding)

  def evaluate(self, state: core.TrainState) -> dict:
    return {k: float(v) for k, v in distributed.gather(
        self._evaluate(self._replicated(state).params, self.eval_batch, self.spec)).items()}


# How each reranker family trains on replayed conversations (the learners' registry says how
# each serves, exports and loads).
REPLAY_TASKS: dict[str, type[Task]] = {"linear": ReplayTask, "mlp": ReplayTask,
                                       "cross": CrossRerankerTask}


def task_class(cfg: Config) -> type[Task]:
  """The task `cfg` learns from. learner=both trains the reranker here (its query encoder, the
  first stage, is trained by the loop before)."""
  if cfg.config == "latent":
    return LatentTask
  if cfg.learner == "query_encoder":
    return QueryEncoderTask
  if cfg.learner == "iris":
    return IrisLearnedTask
  if cfg.units == "lace":
    return IrisTask
  return REPLAY_TASKS[cfg.variant]


def make_task(cfg: Config, encoder=None, progress: bool = False, workdir=None) -> Task:
  """The task of `cfg`, built (its data embedded: see task_class)."""
  kind = task_class(cfg)
  if kind is LatentTask:
    return LatentTask(cfg)
  if kind is IrisLearnedTask:
    return IrisLearnedTask(cfg, encoder, progress, workdir)
  return kind(cfg, encoder, progress)
