"""Convergence of online REINFORCE on replayed LoCoMo conversations, over seeds.

Trains on six dev conversations (the last two are held out, as in `train --config locomo`) for
four passes of the question stream, from scratch (online RL alone) and after pretraining, five
seeds each in one vmapped program. Per replay step: the citation rate of the sampled selection
and the prequential Recall@5 of the training stream (each batch ranked before its update).

    python experiments/replay_convergence.py [--data PATH] [--seeds 5]

Writes experiments/results/replay_convergence.md and .png.
"""

from __future__ import annotations

import argparse

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from replay_common import DEFAULT_DATA, RESULTS, locomo_replays  # noqa: E402
from rmmjax import core  # noqa: E402
from rmmjax.config import get_config  # noqa: E402
from rmmjax.replay import Protocol, run_fold  # noqa: E402

RUNS = [("online RL, lr 1e-4", "rl", 1e-4), ("online RL, lr 1e-3", "rl", 1e-3),
        ("pretraining + online RL, lr 1e-4", "pretrain+rl", 1e-4)]
SMOOTH = 25  # steps per plotted window


def _windows(values_SxT: np.ndarray) -> np.ndarray:
  """Means over consecutive windows of SMOOTH steps, seeds x windows."""
  n = values_SxT.shape[1] // SMOOTH
  return values_SxT[:, :n * SMOOTH].reshape(values_SxT.shape[0], n, SMOOTH).mean(-1)


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--seeds", type=int, default=5)
  parser.add_argument("--epochs", type=int, default=4)
  args = parser.parse_args()
  cfg = get_config("locomo")
  replays = locomo_replays(args.data, cfg.retriever, cfg.k)
  spec = cfg.core_spec()
  test_idx = list(range(len(replays) - cfg.holdout, len(replays)))
  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  lines = ["# Convergence of online REINFORCE on LoCoMo replay", "",
           f"`python experiments/replay_convergence.py --seeds {args.seeds} --epochs "
           f"{args.epochs}`", "",
           f"Training stream: {len(replays) - cfg.holdout} dev conversations, batches of "
           f"{cfg.batch} questions, {args.epochs} passes; BM25 top-{cfg.k} candidates, M={cfg.m}. "
           f"Mean +- std over {args.seeds} seeds of windows of {SMOOTH} steps.", "",
           "| run | citation rate, first window | last window | prequential Recall@5, first "
           "window | last window | held-out Recall@5 (base -> frozen -> prequential) |",
           "|---|---|---|---|---|---|"]
  for label, mode, lr in RUNS:
    hp = core.stack_hparams([core.HParams.create(
        tau=cfg.tau, baseline=cfg.baseline, baseline_kind=cfg.baseline_kind, lr=lr, seed=s)
        for s in range(args.seeds)])
    res = run_fold(replays, test_idx, spec, hp, Protocol(mode=mode, online_epochs=args.epochs),
                   cfg.pretrain_lr, cfg.pretrain_tau)
    online = res["logs"]["online"]
    cite = np.asarray(online["citation_rate"])  # seeds x steps
    recall = np.asarray(online["recall_sum_before"]) / np.maximum(online["present"], 1.0)
    cite_w, recall_w = _windows(cite), _windows(recall)
    windows = cite_w.shape[1]
    steps = (np.arange(windows) + 1) * SMOOTH
    for ax, values in zip(axes, (cite_w, recall_w)):
      mean, std = values.mean(0), values.std(0)
      ax.plot(steps, mean, label=label)
      ax.fill_between(steps, mean - std, mean + std, alpha=0.25)
    cell = lambda v, i: f"{v[:, i].mean():.3f} +- {v[:, i].std():.3f}"  # noqa: E731
    lines.append(f"| {label} | {cell(cite_w, 0)} | {cell(cite_w, -1)} | {cell(recall_w, 0)} | "
                 f"{cell(recall_w, -1)} | {res['base'].mean():.3f} -> "
                 f"{res['frozen'].mean():.3f} -> {res['heldout'].mean():.3f} |")
    print(lines[-1], flush=True)
  for ax, title in zip(axes, ("citation rate of the sampled selection",
                              "prequential Recall@5 (training stream)")):
    ax.set_title(title)
    ax.set_xlabel("replay step")
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=8)
  fig.tight_layout()
  RESULTS.mkdir(parents=True, exist_ok=True)
  fig.savefig(RESULTS / "replay_convergence.png", dpi=110)
  lines += ["", "![curves](replay_convergence.png)"]
  (RESULTS / "replay_convergence.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
