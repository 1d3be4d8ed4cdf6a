"""Orbax checkpoints of a TrainState, restored into the structure of a template state."""

from __future__ import annotations

import functools
import logging
import sys
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import serialization

from rmmjax.core import TrainState

REASON_CHARS = 300  # of an error's message, in a warning about an unreadable checkpoint


def _reason(err: Exception) -> str:
  """The gist of why a checkpoint did not read back (tensorstore appends a long spec)."""
  text = str(err).split(" [tensorstore_spec", 1)[0].strip().splitlines()
  text = text[0] if text else type(err).__name__
  return text if len(text) <= REASON_CHARS else text[:REASON_CHARS] + "..."


@functools.cache  # (installed once)
def _silence_closed_loop_noise() -> None:
  """Drops the 'Event loop is closed' errors of reads still in flight when a restore failed:
  they complete into the event loop Orbax has closed by then, and their tracebacks say nothing
  about the checkpoint. Every other unraisable error still goes to the previous hook."""
  previous = sys.unraisablehook

  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "Event loop is closed"):
      previous(unraisable)

  sys.unraisablehook = hook


def saved_steps(directory: Path) -> list[int]:
  """The steps of the checkpoints in a directory, read from its listing alone (no Orbax object:
  over several processes opening one is a collective, which every process must enter alike)."""
  directory = Path(directory)
  if not directory.is_dir():
    return []
  return sorted(int(p.name) for p in directory.iterdir() if p.is_dir() and p.name.isdigit())


class Checkpointer:
  """Saves and restores TrainStates under one directory, keeping the newest two. Opening one
  creates nothing: the directory appears with the first save; read_only=True never writes."""

  def __init__(self, directory: Path, read_only: bool = False):
    self._directory, self._read_only = Path(directory).absolute(), read_only
    self._manager = self._open() if self._directory.is_dir() else None

  def _open(self) -> ocp.CheckpointManager:
    absl = logging.getLogger("absl")
    level = absl.level
    if self._read_only:  # Orbax warns that a read-only manager will not save
      absl.setLevel(logging.ERROR)
    try:
      options = ocp.CheckpointManagerOptions(
          max_to_keep=None if self._read_only else 2,
          enable_async_checkpointing=False, create=not self._read_only,
          read_only=self._read_only)
      return ocp.CheckpointManager(self._directory, options=options)
    finally:
      absl.setLevel(level)

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps()) if self._manager is not None else []

  def save(self, step: int, state: TrainState) -> None:
    if self._manager is None:
      self._manager = self._open()
    self._manager.save(step, args=ocp.args.StandardSave(serialization.to_state_dict(state)))
    self._manager.wait_until_finished()

  def delete(self, step: int) -> None:
    self._manager.delete(step)

  def restore(self, step: int, template: TrainState) -> TrainState:
    """The state saved at `step`, in the structure (and static spec) of `template`."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct,
                          serialization.to_state_dict(template))
    restored = self._manager.restore(step, args=ocp.args.StandardRestore(target))
    state = serialization.from_state_dict(template, restored)
    if int(state.step) != step:
      raise ValueError(f"the state it holds is of step {int(state.step)}, not {step}")
    return state

  def restore_latest(self, template: TrainState) -> tuple[int, TrainState | None, list[int]]:
    """The newest checkpoint that reads back: (its step, the state, the newer steps skipped,
    each reported on stderr); (0, None, []) when there is none. When none reads back, refuses
    naming each and why."""
    failures = []
    for step in reversed(self.all_steps()):
      try:
        state = self.restore(step, template)
      except Exception as err:  # damage fails in any layer: JSON, zarr, tensorstore, shapes
        _silence_closed_loop_noise()
        failures.append((step, _reason(err)))
        continue
      for bad, reason in failures:
        print(f"warning: skipping unreadable checkpoint {self._directory / str(bad)} ({reason}); "
              f"resuming from step {step}", file=sys.stderr)
      return step, state, [bad for bad, _ in failures]
    if failures:
      shown = "; ".join(f"step {s}: {reason}" for s, reason in failures)
      raise ValueError(f"no checkpoint in {self._directory} reads back ({shown}); use a fresh "
                       "workdir")
    return 0, None, []

  def close(self) -> None:
    if self._manager is not None:
      self._manager.close()
