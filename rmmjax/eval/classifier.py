"""How well a probability separates and predicts a binary label (a sufficiency judge's): the
area under the ROC curve, and calibration in bins."""

from __future__ import annotations

import numpy as np
from scipy.stats import mannwhitneyu


def roc_auc(scores, labels) -> float:
  """P(a positive scores above a negative), a tie counting one half (the Mann-Whitney U of
  the positives); NaN without both classes. Heavily tied scores (a heuristic judge's few
  confidence levels) get 0.5 for their ties, not an order that depends on how the rows
  happen to be sorted."""
  s, y = np.asarray(scores, float), np.asarray(labels, bool)
  if y.all() or not y.any():
    return float("nan")
  return float(mannwhitneyu(s[y], s[~y]).statistic / (y.sum() * (~y).sum()))


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
