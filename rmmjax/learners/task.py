"""What the training loop asks of every task (the latent simulator, reranker replay, the query
encoder, the reranker inside IRIS, IRIS's learned models), and the mesh its batches split over."""

from __future__ import annotations

import abc

import numpy as np

from rmmjax import core, distributed


class Task(abc.ABC):
  """A source of training steps and an evaluation, for `rmmjax.train.loop.train`."""

  template: core.TrainState  # the state before any training (restores go into its structure)
  record: dict  # what the run trains on (record.json), checked on every resume
  eval_queries: int
  train_convs: list = []  # the conversations trained on (replay tasks)
  test_convs: list = []  # those held out
  pretrain_loss: np.ndarray | None = None  # per pretraining step (pretrain.json)
  # Whether the pretrained state is checkpointed as step 0 (a resume should not redo it).
  checkpoint_pretrained: bool = False
  # What the run's summary reports of its inputs beyond the metrics (pairs cut to length, say),
  # and of its pretraining (kept in pretrain.json, so a resumed run reports them too).
  input_notes: dict = {}
  pretrain_notes: dict = {}
  # Whether `advance` takes its steps one at a time from the host, each reported to an
  # `on_step(1)` callback (a progress bar), rather than as one compiled scan.
  steps_from_host: bool = False
  model = None  # its CoreSpec.model where the config alone fixes it

  @classmethod
  def check_run(cls, cfg, encoder, workdir) -> None:
    """The checks its config cannot make alone (the encoder, the data, the device's memory),
    before anything of the run is written (before a two-stage run tunes its query encoder)."""

  def _data_parallel(self, devices: int, batches: dict[str, int]) -> None:
    """The mesh every batch is split over; each named batch size must divide over it."""
    self.mesh = distributed.data_mesh(devices)
    self._parallel = self.mesh.devices.size > 1
    if self._parallel:
      for name, size in batches.items():
        distributed.check_divisible(size, self.mesh, name)

  def _replicated(self, state: core.TrainState) -> core.TrainState:
    return distributed.replicate(state, self.mesh) if self._parallel else state

  def _host(self, tree):
    return distributed.gather(tree) if self._parallel else tree

  @abc.abstractmethod
  def initial_state(self) -> core.TrainState:
    """The state online training starts from (after any pretraining or fitting)."""

  @abc.abstractmethod
  def advance(self, state: core.TrainState, n: int) -> tuple[core.TrainState, dict]:
    """n online steps: the new state and each step's metrics, (n,) arrays."""

  @abc.abstractmethod
  def evaluate(self, state: core.TrainState) -> dict:
    """Held-out metrics of a state ({} when nothing is held out)."""

  def evaluate_first(self) -> dict:
    """Held-out metrics before any training (known without computing, for some tasks)."""
    return self.evaluate(self.template)

  def finish(self, state: core.TrainState) -> None:
    """Work after the last step (the learned judge of learner=iris fits here)."""
