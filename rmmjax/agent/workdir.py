"""Where the online agent's learning lives, so that a kill loses no answer that was shown
(**chat** in docs/command-line.md).

`W/checkpoints/`: the reranker after every update; `W/pending.npz`: the rewarded answers of the
unfinished batch with the step they build on (sealed with an encrypted bank's key: vectors can be
inverted back to text); `W/agent.json`: the counters and settings. Each is replaced whole.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path

import numpy as np

from rmmjax.core import TrainState
from rmmjax.io.checkpoint import Checkpointer
from rmmjax.io.manifest import another_version, read_json
from rmmjax.io.workdir import atomic_path, atomic_write_json, take_lock
from rmmjax.memory.crypto import Cipher

# The settings a workdir's reranker learnt with: a restart that learns must keep them; one that
# only serves must keep what the weights score (the candidates and where they come from).
FIXED_SETTINGS = ("retriever", "k", "m", "batch", "tau", "lr", "baseline", "baseline_kind",
                  "seed", "reranker", "query_encoder")
SERVING_SETTINGS = ("retriever", "k", "reranker", "query_encoder")
PENDING_FIELDS = ("q", "mem", "mask", "selected", "rewards")
CROSS_FIELDS = ("tokens", "token_segments")  # a cross reranker's answers keep their pair tokens


class AgentWorkdir:
  """The agent's files in one folder; `learning=False` reads them and never writes."""

  def __init__(self, path: Path, settings: dict, *, learning: bool, cipher: Cipher = Cipher()):
    self.path, self.settings, self.learning, self.cipher = Path(path), settings, learning, cipher
    self._lock = self._checkpointer = None
    if self.path.exists() and not self.path.is_dir():
      raise ValueError(f"--workdir {self.path} is a file; expected a folder for the agent's "
                       f"checkpoints")
    saved = self._read_json()
    if saved is None and self.path.is_dir() and any(self.path.iterdir()):
      raise ValueError(f"--workdir {self.path} holds other files and no agent.json: it is not an "
                       f"agent workdir (a training run's, or any folder); give a new or empty "
                       f"folder")
    if saved is not None:
      self._check_settings(saved.get("settings", {}))
    if learning:
      try:
        self.path.mkdir(parents=True, exist_ok=True)
        self._take_lock()
      except OSError as err:
        raise ValueError(f"--workdir {self.path} cannot be written ({err.strerror or err}); "
                         f"pick a folder this process can write") from None
      if saved is None:
        self.save_stats({}, 0)  # the settings are recorded from the start

  def _read_json(self) -> dict | None:
    file = self.path / "agent.json"
    return read_json(file, "it is not an agent workdir, or it was damaged: use another "
                     "--workdir") if file.is_file() else None

  def _check_settings(self, saved: dict) -> None:
    keys = FIXED_SETTINGS if self.learning else SERVING_SETTINGS
    diff = [f"{key}: {saved[key]!r} -> {self.settings.get(key)!r}" for key in keys
            if key in saved and saved[key] != self.settings.get(key)]
    if saved.get("encrypted", False) != self.settings.get("encrypted", False):
      raise ValueError(f"--workdir {self.path} belongs to an agent of an "
                       f"{'encrypted' if saved.get('encrypted') else 'unencrypted'} bank and this "
                       f"bank is {'encrypted' if self.settings.get('encrypted') else 'not'}: "
                       f"its pending answers hold memory vectors, which must not change "
                       f"protection; use the bank it was made with, or a new workdir")
    if diff:
      raise ValueError(f"--workdir {self.path} holds a reranker that learnt with other settings "
                       f"({'; '.join(diff)}); rerun with the same ones, or start a new workdir")

  def _take_lock(self) -> None:
    self._lock, holder = take_lock(self.path, str(os.getpid()))
    if self._lock is None:
      raise ValueError(f"--workdir {self.path} is in use by another learning agent (pid "
                       f"{holder or 'unknown'}); give each process its own workdir, or --serve")
    # Files a killed writer left half-written (the lock says no one else writes here).
    for stale in [*self.path.glob(".pending.npz.*.tmp"), *self.path.glob(".agent.json.*.tmp")]:
      stale.unlink(missing_ok=True)

  def restore(self, template: TrainState) -> tuple[TrainState, list[tuple], dict]:
    """(the newest checkpoint's state or the template, the pending rewarded answers that build
    on it, the saved counters)."""
    with contextlib.closing(Checkpointer(self.path / "checkpoints", read_only=True)) as ckpt:
      _, state, _ = ckpt.restore_latest(template)
    state = template if state is None else state
    saved = self._read_json() or {}
    return state, self._pending(int(state.step)), dict(saved.get("stats", {}))

  def _pending(self, step: int) -> list[tuple]:
    file = self.path / "pending.npz"
    if not file.is_file():
      return []
    try:
      sealed = self.cipher.open_bytes(file.read_bytes())
    except ValueError:
      raise ValueError(f"{file} does not open with this bank's key (written with another "
                       f"one, or damaged); use that key, or a new --workdir") from None
    with np.load(io.BytesIO(sealed)) as data:
      base = int(data["base_step"])
      if "token_mask" in data.files:
        raise another_version(str(file), "layout of pair tokens with a token_mask",
                              "their token_segments", "delete it (its rewarded answers are "
                              "lost) or use a new --workdir")
      names = PENDING_FIELDS + (CROSS_FIELDS if CROSS_FIELDS[0] in data.files else ())
      items = list(zip(*(data[name] for name in names)))
    if base == step:
      return items
    if base > step:
      print(f"warning: {file} builds on step {base} but the newest checkpoint that reads back "
            f"is step {step}; its {len(items)} rewarded answers are dropped", file=sys.stderr)
    return []  # base < step: a checkpoint already holds them

  def save_pending(self, step: int, pending: list[tuple]) -> None:
    """The rewarded answers of the unfinished batch, building on checkpoint `step`."""
    names = PENDING_FIELDS + (CROSS_FIELDS if pending and len(pending[0]) > 5 else ())
    arrays = {name: np.stack([item[i] for item in pending]) if pending else np.zeros((0,))
              for i, name in enumerate(names)}
    buffer = io.BytesIO()
    np.savez(buffer, base_step=np.int64(step), **arrays)
    with atomic_path(self.path / "pending.npz") as tmp:
      tmp.write_bytes(self.cipher.seal_bytes(buffer.getvalue()))

  def save_checkpoint(self, state: TrainState) -> None:
    if self._checkpointer is None:
      self._checkpointer = Checkpointer(self.path / "checkpoints")
    step = int(state.step)
    if step not in self._checkpointer.all_steps():
      self._checkpointer.save(step, state)

  def save_stats(self, stats: dict, step: int) -> None:
    atomic_write_json(self.path / "agent.json",
                      {"settings": self.settings, "stats": stats, "step": step})

  def close(self) -> None:
    for held in (self._checkpointer, self._lock):
      if held is not None:
        held.close()
    self._checkpointer = self._lock = None

