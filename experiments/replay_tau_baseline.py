"""Temperature x baseline sweep of online REINFORCE on LoCoMo replay, drawn as a heat map.

Online RL alone (no pretraining, lr 1e-4, the locomo config otherwise), every configuration of
the grid in one vmapped program per fold; 4-fold cross-validation over the dev conversations.
Cell: held-out prequential Recall@5 (all) minus the BM25 base order's.

    python experiments/replay_tau_baseline.py [--data PATH] [--seeds 2]

Writes experiments/results/replay_tau_baseline.md and .png.
"""

from __future__ import annotations

import argparse
import itertools

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from replay_common import DEFAULT_DATA, RESULTS, locomo_replays, write_markdown, locomo_config  # noqa: E402
from rmmjax import core  # noqa: E402
from rmmjax.config import with_values  # noqa: E402
from rmmjax.replay.protocols import Protocol, cross_validate  # noqa: E402

TAUS = (0.1, 0.25, 0.5, 1.0, 2.0)
BASELINES = (("b=0", 0.0, "constant"), ("b=0.5", 0.5, "constant"), ("running", 0.0, "running"),
             ("batch", 0.0, "batch"))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--seeds", type=int, default=2)
  parser.add_argument("--folds", type=int, default=4)
  args = parser.parse_args()
  cfg = locomo_config()
  replays = locomo_replays(args.data, "bm25", cfg.k)  # the reranker's BM25 candidates
  grid = list(itertools.product(TAUS, BASELINES, range(args.seeds)))
  hp = core.stack_hparams([with_values(cfg, {"tau": tau, "baseline": b, "baseline_kind": kind,
                                              "lr": 1e-4, "seed": seed}).hparams()
                           for tau, (_, b, kind), seed in grid])
  res = cross_validate(replays, args.folds, cfg.core_spec(), hp,
                       Protocol(mode="rl", online_epochs=2))
  gain = (res["heldout"].mean(1) - res["base"].mean()).reshape(len(TAUS), len(BASELINES),
                                                               args.seeds).mean(-1)
  fig, ax = plt.subplots(figsize=(6, 4.5))
  bound = np.abs(gain).max()
  image = ax.imshow(gain, cmap="RdBu", vmin=-bound, vmax=bound)
  ax.set_xticks(range(len(BASELINES)), [b[0] for b in BASELINES])
  ax.set_yticks(range(len(TAUS)), [str(t) for t in TAUS])
  ax.set_xlabel("baseline")
  ax.set_ylabel("temperature tau")
  for i, j in itertools.product(range(len(TAUS)), range(len(BASELINES))):
    ax.text(j, i, f"{gain[i, j]:+.3f}", ha="center", va="center", fontsize=8)
  fig.colorbar(image, label="held-out Recall@5 minus BM25 base")
  ax.set_title("online REINFORCE on LoCoMo replay (4-fold CV)")
  fig.tight_layout()
  RESULTS.mkdir(parents=True, exist_ok=True)
  fig.savefig(RESULTS / "replay_tau_baseline.png", dpi=110)
  lines = ["# Temperature x baseline, online REINFORCE on LoCoMo replay", "",
           f"`python experiments/replay_tau_baseline.py --seeds {args.seeds} --folds "
           f"{args.folds}`", "",
           f"Held-out prequential Recall@5 (all) minus the BM25 base order's "
           f"({res['base'].mean():.3f}); mean over {args.seeds} seeds; online RL alone, lr "
           "1e-4, two passes over the training conversations.", "",
           "| tau | " + " | ".join(b[0] for b in BASELINES) + " |",
           "|---|" + "---|" * len(BASELINES)]
  for tau, row in zip(TAUS, gain):
    lines.append(f"| {tau} | " + " | ".join(f"{v:+.3f}" for v in row) + " |")
  lines += ["", "![heat map](replay_tau_baseline.png)"]
  write_markdown(RESULTS / "replay_tau_baseline.md", lines)
  print("\n".join(lines))


if __name__ == "__main__":
  main()
