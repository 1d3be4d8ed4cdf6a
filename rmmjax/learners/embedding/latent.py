"""The embedding rerankers trained on the latent simulator's sessions, evaluated on held-out
simulated sessions (the paper's own setting, and the vmapped latent sweeps' program)."""

from __future__ import annotations

import dataclasses

import jax

from rmmjax import core, distributed
from rmmjax.config import Config
from rmmjax.io.record import latent_record
from rmmjax.learners.embedding.model import EMBEDDING
from rmmjax.learners.task import Task


class LatentTask(Task):
  """Sessions drawn from the latent simulator; evaluation on held-out simulated sessions."""

  def __init__(self, cfg: Config, encoder=None, progress: bool = False, workdir=None):
    del encoder, progress, workdir  # (the simulator embeds its own sessions)
    self.spec = dataclasses.replace(cfg.core_spec(), model=EMBEDDING)
    self.sim, hp = cfg.sim_spec(), cfg.hparams()
    self.world = core.make_world(self.sim, self.spec.dim)
    self.eval_batch = core.sample_eval_batch(self.world, self.sim, self.spec, cfg.eval_sessions)
    self.template = core.init_state(self.spec, hp)
    self.eval_queries = cfg.eval_sessions * cfg.batch
    self.record = latent_record(cfg)
    self._data_parallel(cfg.devices, {"batch": cfg.batch})
    self._sharding = distributed.batch_sharding(self.mesh) if self._parallel else None
    if self._parallel:
      self.world, self.eval_batch = distributed.replicate((self.world, self.eval_batch), self.mesh)
    self._evaluate = jax.jit(core.evaluate, static_argnums=2)
    self._advance = jax.jit(core.run_steps, static_argnums=(2, 3, 4), donate_argnums=0)

  def initial_state(self) -> core.TrainState:
    return self.template

  def advance(self, state: core.TrainState, n: int):
    return self._advance(self._replicated(state), self.world, self.sim, n, self._sharding)

  def evaluate(self, state: core.TrainState) -> dict:
    return {k: float(v) for k, v in distributed.gather(
        self._evaluate(self._replicated(state).params, self.eval_batch, self.spec)).items()}
