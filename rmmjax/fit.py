"""The two loops learners train in: the supervised fit (epochs over a learner's batches, data
parallel over a mesh) and the online loop (`Online`). The embedding rerankers' pretraining and
the latent simulator's runs stay one compiled program each (rmmjax.core), since sweeps vmap them."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np
from tqdm import tqdm

from rmmjax import distributed
from rmmjax.core.replay import stream_steps


@dataclasses.dataclass(frozen=True)
class Fit:
  """How a fit runs: `epochs` passes; up to `chunk` consecutive batches of one shape per compiled
  call (a scan: fewer dispatches for small steps); the progress bar's loss (the one place the
  host waits for the devices) every `log_every` calls."""

  epochs: int
  chunk: int = 1
  log_every: int = 10
  desc: str = "fit"


def fit(state: Any, step: Callable, epoch_batches: Callable[[int], Sequence], plan: Fit,
        mesh=None, progress: bool = False, compiler_options: dict | None = None
        ) -> tuple[Any, np.ndarray]:
  """Runs the pure `step(state, batch) -> (state, metrics with "loss")` over each epoch's host
  batches (batch axis first); the state (on the devices) and every step's loss."""
  parallel = mesh is not None and mesh.devices.size > 1
  if parallel:
    state = distributed.replicate(state, mesh)
  one = jax.jit(step, compiler_options=compiler_options)
  scan = jax.jit(lambda s, xs: jax.lax.scan(step, s, xs), compiler_options=compiler_options)
  losses, calls = [], 0
  with tqdm(desc=f"pretrain ({plan.desc})", unit="step", disable=not progress) as bar:
    for epoch in range(plan.epochs):
      batches = epoch_batches(epoch)
      if epoch == 0:
        bar.total = plan.epochs * len(batches)
        bar.refresh()
      for group in _runs_of_one_shape(batches, plan.chunk):
        stacked = len(group) > 1
        xs = jax.tree.map(lambda *x: np.stack(x), *group) if stacked else group[0]
        if parallel:
          xs = distributed.shard_leading(xs, mesh, axis=1 if stacked else 0)
        state, metrics = (scan if stacked else one)(state, xs)
        losses.append(metrics["loss"])
        calls += 1
        bar.update(len(group))
        if progress and calls % plan.log_every == 0:
          recent = jax.device_get(losses[-plan.log_every:])
          bar.set_postfix(loss=f"{np.mean([np.mean(x) for x in recent]):.3f}")
  if not losses:
    return state, np.zeros(0, np.float32)
  return state, np.concatenate([np.reshape(np.asarray(distributed.gather(x), np.float32), -1)
                                for x in losses])


class Online:
  """The online loop: a pure step compiled once, the state donated, over a stream on the devices
  (`run`: one scan) or batches built on the host (`run_from_host`: one call per batch)."""

  def __init__(self, step: Callable, compiler_options: dict | None = None):
    self._scan = jax.jit(functools.partial(stream_steps, step), static_argnums=2,
                         donate_argnums=0, compiler_options=compiler_options)
    self._one = jax.jit(step, donate_argnums=0, compiler_options=compiler_options)

  def run(self, state: Any, stream: Any, num_steps: int) -> tuple[Any, dict]:
    """The state and each step's metrics, (num_steps,) arrays; `stream`'s leaves step axis first."""
    state, metrics = self._scan(state, stream, num_steps)
    return state, distributed.gather(metrics)

  def run_from_host(self, state: Any, batch_at: Callable[[int], Any], num_steps: int,
                    on_step: Callable | None = None) -> tuple[Any, dict]:
    """num_steps steps, step t on `batch_at(t)` (t counted from the state's step, read once),
    each reported to `on_step(1)` as it is dispatched."""
    start, rows = int(state.step), []
    for t in range(start, start + num_steps):
      state, metrics = self._one(state, batch_at(t))
      rows.append(metrics)
      if on_step is not None:
        on_step(1)
    rows = distributed.gather(rows)
    return state, {name: np.stack([r[name] for r in rows]) for name in rows[0]}


def _runs_of_one_shape(batches: Iterable, chunk: int) -> list[list]:
  """Consecutive batches grouped while their shapes agree, at most `chunk` to a group."""
  shapes = lambda batch: [np.shape(x) for x in jax.tree.leaves(batch)]  # noqa: E731
  groups: list[list] = []
  for batch in batches:
    if groups and len(groups[-1]) < chunk and shapes(groups[-1][0]) == shapes(batch):
      groups[-1].append(batch)
    else:
      groups.append([batch])
  return groups
