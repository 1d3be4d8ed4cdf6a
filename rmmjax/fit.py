"""The one supervised fit loop: epochs over a learner's batches, data parallel over a mesh.

Every learner's supervised fit (the cross reranker's and the query encoder's pretraining, IRIS's
anchor, refinement encoder and judge) runs here; the learner says what a step is and what the
batches of an epoch are (its order, its candidate subsets, its packing, all drawn from the seed
and the epoch alone), and this loop owns the rest: compiling the step, placing the state on the
devices and each batch split over them, running consecutive batches of one shape as one scan,
the progress bar, and the host's waits, which happen only where the bar shows the loss.
The online loop is the training loop's (rmmjax.train.loop); the embedding rerankers' pretraining
stays one compiled program (rmmjax.core.replay.pretrain), since the replay experiments vmap it
over configurations and folds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np
from tqdm import tqdm

from rmmjax import distributed


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
  """Runs `step(state, batch) -> (state, metrics)` (pure; metrics hold the step's "loss") over
  the batches `epoch_batches(epoch)` lists (host arrays, the batch axis first) for each epoch.
  With a mesh of several devices the state is replicated and each batch split over them.
  Returns the state (on the devices) and every step's loss."""
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


def _runs_of_one_shape(batches: Iterable, chunk: int) -> list[list]:
  """Consecutive batches grouped while their shapes agree, at most `chunk` to a group."""
  groups: list[list] = []
  for batch in batches:
    shapes = [np.shape(x) for x in jax.tree.leaves(batch)]
    last = groups[-1] if groups else None
    if (last is not None and len(last) < chunk
        and [np.shape(x) for x in jax.tree.leaves(last[0])] == shapes):
      last.append(batch)
    else:
      groups.append([batch])
  return groups
