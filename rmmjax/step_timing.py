"""Timing a compiled step for an estimate made before a run: its first call holds the compile,
the calls after it are the steps a run repeats."""

from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np


def compile_and_step(run: Callable, inputs: Sequence) -> tuple[float, float]:
  """(the first call's time beyond a step's, taken as the compile; the median step) of `run`
  called on inputs[0] and then on each input in turn. `run` waits for its result."""
  start = time.perf_counter()
  run(inputs[0])
  first = time.perf_counter() - start
  times = []
  for x in inputs:
    start = time.perf_counter()
    run(x)
    times.append(time.perf_counter() - start)
  step = float(np.median(times))
  return max(first - step, 0.0), step
