"""How well a probability separates and predicts a binary label (a sufficiency judge's): the
area under the ROC curve, and calibration in bins."""

from __future__ import annotations

import numpy as np


def average_ranks(values: np.ndarray) -> np.ndarray:
  """1-based ranks of values, ties sharing the mean of the ranks they span."""
  _, tie_N, counts = np.unique(np.asarray(values, float), return_inverse=True,
                               return_counts=True)
  last = np.cumsum(counts)  # each distinct value spans ranks last - count + 1 .. last
  return ((last - counts + 1 + last) / 2)[tie_N.reshape(-1)]


def roc_auc(scores, labels) -> float:
  """P(a positive scores above a negative), a tie counting one half (the Mann-Whitney
  statistic over tie-averaged ranks); NaN without both classes. Heavily tied scores (a
  heuristic judge's few confidence levels) get 0.5 for their ties, not an order that
  depends on how the rows happen to be sorted."""
  s, y = np.asarray(scores, float), np.asarray(labels, bool)
  pos, neg = int(y.sum()), int((~y).sum())
  if not (pos and neg):
    return float("nan")
  ranks = average_ranks(s)
  return float((ranks[y].sum() - pos * (pos + 1) / 2) / (pos * neg))


def reliability(probabilities, labels, bins: int = 10) -> tuple[float, list[tuple]]:
  """(expected calibration error, [(bin low, bin high, count, mean probability, observed
  rate)] of the non-empty bins) over `bins` equal-width bins of [0, 1]."""
  p, y = np.asarray(probabilities, float), np.asarray(labels, bool)
  edges = np.linspace(0, 1, bins + 1)
  which = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
  table, ece = [], 0.0
  for b in range(bins):
    sel = which == b
    if sel.any():
      table.append((float(edges[b]), float(edges[b + 1]), int(sel.sum()), float(p[sel].mean()),
                    float(y[sel].mean())))
      ece += sel.mean() * abs(p[sel].mean() - y[sel].mean())
  return float(ece), table
