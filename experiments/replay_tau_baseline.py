"""Temperature x baseline sweep of online REINFORCE on LoCoMo replay, drawn as a heat map.

Online RL alone (no pretraining, lr 1e-4, the locomo config otherwise), every configuration of
the grid in one vmapped program per fold; 4-fold cross-validation over the dev conversations.
Cell: held-out prequential Recall@5 (all) minus the BM25 base order's.

    python experiments/replay_tau_baseline.py [--data PATH] [--seeds 2] [--folds 4]

Writes experiments/results/replay_tau_baseline.md and .png, and the record of every run's
configuration beside the table (replay_tau_baseline.config.json, see published.py; `configs`).
"""

from __future__ import annotations

import argparse
import itertools
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from published import write_record  # noqa: E402
from replay_common import (DEFAULT_DATA, RESULTS, locomo_config, locomo_replays,  # noqa: E402
                           write_markdown)
from rmmjax import core  # noqa: E402
from rmmjax.config import with_values  # noqa: E402
from rmmjax.replay.protocols import Protocol, cross_validate  # noqa: E402

TAUS = (0.1, 0.25, 0.5, 1.0, 2.0)
BASELINES = (("b=0", 0.0, "constant"), ("b=0.5", 0.5, "constant"), ("running", 0.0, "running"),
             ("batch", 0.0, "batch"))
PROTOCOL = Protocol(mode="rl", online_epochs=2)  # online RL alone, two passes


def grid_configs(data: str, seeds: int) -> dict:
  """{cell, seed S: its run} in the grid's order: the locomo config's reranker over BM25's
  candidates of `data`, online RL alone (PROTOCOL's passes: reranker.steps is not read) at lr
  1e-4."""
  cfg = with_values(locomo_config(), {"data": data, "learner": "linear", "retriever": "bm25",
                                      "mode": PROTOCOL.mode})
  return {f"tau={tau}, {name}, seed {seed}": with_values(
              cfg, {"tau": tau, "baseline": b, "baseline_kind": kind, "lr": 1e-4, "seed": seed})
          for tau, (name, b, kind), seed in itertools.product(TAUS, BASELINES, range(seeds))}


def configs(argv: list[str]) -> dict:
  """Every run `main` trains with this command line, {cell, seed S, fold F: its Config} (see
  published.py), the fold as the run's folds/fold (the same split of the file's
  conversations)."""
  args = parse(argv)
  return {f"{label}, fold {f}": with_values(run, {"folds": args.folds, "fold": f})
          for label, run in grid_configs(args.data, args.seeds).items() for f in range(args.folds)}


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--seeds", type=int, default=2)
  parser.add_argument("--folds", type=int, default=4)
  return parser.parse_args(argv)


def main() -> None:
  args = parse(sys.argv[1:])
  runs = list(grid_configs(args.data, args.seeds).values())  # (configs: with each fold's key)
  cfg = runs[0]
  replays = locomo_replays(cfg.data, cfg.retriever, cfg.k)  # the reranker's BM25 candidates
  hp = core.stack_hparams([run.hparams() for run in runs])
  res = cross_validate(replays, args.folds, cfg.core_spec(), hp, PROTOCOL)
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
  argv = ((["--data", args.data] if args.data != str(DEFAULT_DATA) else [])
          + (["--seeds", str(args.seeds)] if args.seeds != 2 else [])
          + (["--folds", str(args.folds)] if args.folds != 4 else []))
  write_record(RESULTS / "replay_tau_baseline.md", "replay_tau_baseline", argv, configs(argv))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
