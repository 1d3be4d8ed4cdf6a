"""Convergence curves as PNG: mean over seeds with a band of one standard deviation."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

TITLES = {"reward": "reward (mean over selected)", "citation_rate": "citation rate",
          "recall_at_m": "recall@M of the sampled selection", "entropy": "selection entropy"}
CURVE_METRICS = tuple(TITLES)


def _smooth(x_SxT: np.ndarray, window: int) -> np.ndarray:
  if window <= 1:  # (also a run without rows: steps=0)
    return x_SxT
  # 'valid' keeps only full windows, so the ends are not dragged toward zero.
  return np.stack([np.convolve(row, np.ones(window) / window, mode="valid") for row in x_SxT])


def _save(fig, path: Path) -> None:
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_curves(path: Path, steps_T: np.ndarray, curves: dict[str, dict[str, np.ndarray]],
                title: str = "") -> None:
  """One panel per metric, one line per configuration (curves[label][metric] is seeds x T)."""
  steps_T = np.asarray(steps_T)
  window = max(1, len(steps_T) // 40)
  fig, axes = plt.subplots(1, len(TITLES), figsize=(4.2 * len(TITLES), 3.4), squeeze=False)
  for ax, metric in zip(axes[0], CURVE_METRICS):
    for label, by_metric in curves.items():
      y = _smooth(np.atleast_2d(by_metric[metric]), window)
      mean, std = y.mean(0), y.std(0)
      ax.plot(steps_T[window - 1:], mean, label=label, lw=1.4)
      if y.shape[0] > 1:
        ax.fill_between(steps_T[window - 1:], mean - std, mean + std, alpha=0.2)
    ax.set_title(TITLES[metric], fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  if len(curves) > 1:
    axes[0][-1].legend(fontsize=7, loc="best")
  if title:
    fig.suptitle(title, fontsize=10)
  _save(fig, path)


def plot_parts(path: Path, parts: dict[str, list[tuple[float, float, float]]], ylabel: str,
               title: str = "") -> None:
  """A (mean, low, high) per part of a sequence, one line and band per configuration."""
  fig, ax = plt.subplots(figsize=(5.5, 3.6))
  for label, values in parts.items():
    mean, low, high = np.array(values).T
    x = np.arange(1, len(mean) + 1)
    ax.plot(x, mean, marker="o", lw=1.4, label=label)
    ax.fill_between(x, low, high, alpha=0.15)
  ax.axhline(0.0, color="k", lw=0.8)
  ax.set_xlabel("part of the replay (each category's share, in order)")
  ax.set_ylabel(ylabel)
  ax.grid(alpha=0.3)
  if len(parts) > 1:
    ax.legend(fontsize=7, loc="best")
  if title:
    ax.set_title(title, fontsize=10)
  _save(fig, path)
