"""Orbax checkpoints of a TrainState, restored into the structure of a template state."""

from __future__ import annotations

from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import serialization

from rmmjax.core import TrainState


class Checkpointer:
  """Saves and restores TrainStates under one directory, keeping the newest few."""

  def __init__(self, directory: Path, max_to_keep: int = 2):
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                           enable_async_checkpointing=False)
    self._manager = ocp.CheckpointManager(Path(directory).absolute(), options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state: TrainState) -> None:
    self._manager.save(step, args=ocp.args.StandardSave(serialization.to_state_dict(state)))
    self._manager.wait_until_finished()

  def restore(self, step: int, template: TrainState) -> TrainState:
    """The state saved at `step`, in the structure (and static spec) of `template`."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                          serialization.to_state_dict(template))
    restored = self._manager.restore(step, args=ocp.args.StandardRestore(target))
    return serialization.from_state_dict(template, restored)

  def close(self) -> None:
    self._manager.close()
