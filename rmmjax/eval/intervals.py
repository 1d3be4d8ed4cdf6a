"""The one interval every results table prints: a paired bootstrap that resamples what shares a
fitted model.

Questions of one conversation share a memory, and the conversations of one fold share a trained
model: it resamples folds where there are at least `MIN_FOLDS` (2 folds give 3 distinct draws),
else conversations, which understates the uncertainty (`over` says "indicative"). Each drawn
cluster also draws its seeds with replacement, so seed-to-seed variance is in the interval too.
"""

from __future__ import annotations

import dataclasses

import numpy as np

DRAWS = 2000
MIN_FOLDS = 4  # the fewest folds an interval resamples; with fewer, conversations


@dataclasses.dataclass(frozen=True)
class Interval:
  """A mean difference and its 95% percentile interval; `over` names what was resampled."""

  mean: float
  low: float
  high: float
  over: str  # "folds", "conversations, indicative", "folds x seeds", ...

  def __str__(self) -> str:
    return f"{self.mean:+.3f} [{self.low:+.3f}, {self.high:+.3f}] ({self.over})"

  def __iter__(self):  # mean, low, high = interval
    return iter((self.mean, self.low, self.high))


def paired_interval(diff: np.ndarray, conversations_Q, folds_Q) -> Interval:
  """The mean of a paired per-question difference and its 95% bootstrap interval. `diff` is
  (Q,), or (S, Q) one per seed (seed s of a row against seed s of the other, or against a base
  order that has no seed); `folds_Q` each question's fold (the model that scored it)."""
  diff_SxQ = np.atleast_2d(np.asarray(diff, float))
  seeds = diff_SxQ.shape[0]
  by_fold = len(set(np.asarray(folds_Q).tolist())) >= MIN_FOLDS
  clusters_Q = np.asarray(folds_Q if by_fold else conversations_Q)
  over = ("folds" if by_fold else "conversations") + (" x seeds" if seeds > 1 else "") + (
      "" if by_fold else ", indicative")
  ids, which = np.unique(clusters_Q, return_inverse=True)
  sums_SxC = np.stack([np.bincount(which, d, len(ids)) for d in diff_SxQ])
  counts_C = np.bincount(which, minlength=len(ids))
  rng = np.random.default_rng(0)
  drawn_DxC = rng.integers(0, len(ids), (DRAWS, len(ids)))
  if seeds == 1:
    sums_DxC = sums_SxC[0][drawn_DxC]
  else:  # each drawn cluster's seeds drawn with replacement, their sums averaged
    seed_DxCxS = rng.integers(0, seeds, (DRAWS, len(ids), seeds))
    sums_DxC = sums_SxC[seed_DxCxS, drawn_DxC[..., None]].mean(-1)
  means_D = sums_DxC.sum(1) / counts_C[drawn_DxC].sum(1)
  low, high = np.percentile(means_D, [2.5, 97.5])
  return Interval(float(diff_SxQ.mean()), float(low), float(high), over)
