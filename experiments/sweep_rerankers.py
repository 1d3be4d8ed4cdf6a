"""Cross-validated sweeps of the embedding rerankers' rates on the dev file, by `rmmjax sweep`.

Every setting the rows rely on is pinned below; the grid is the online temperature x the online
learning rate, 4 folds of the conversations x 2 seeds. A workdir already holding the same sweep
is reused (its finished folds are not rerun).

    python experiments/sweep_rerankers.py [--data PATH] [--workdir DIR] [--variants linear,mlp]

Writes experiments/results/sweep_<variant>.md (the sweep's table, its command and commit).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from replay_common import DEFAULT_DATA, RESULTS, write_markdown
from rmmjax.cli import main as rmmjax_main

# The linear reranker's settings as `train --config locomo --set learner=reranker` has them,
# pinned so that a default changing later cannot change what a row means.
PINNED = ("learner=reranker", "retriever=hybrid", "units=turn", "k=20", "m=5", "batch=4",
          "dim=384", "baseline=0.0", "baseline_kind=running", "mode=pretrain+rl", "seed=0",
          "reranker.rank_prior=true", "reranker.pretrain_epochs=10",
          "reranker.pretrain_lr=1e-4", "reranker.pretrain_tau=0.05", "reranker.steps=600",
          "log_every=10")
GRID = ("tau=0.05,0.25,1.0", "lr=3e-6,1e-5,3e-5,1e-4")
FOLDS, SEEDS = 4, 2


def sweep_args(data: Path, workdir: Path, variant: str) -> list[str]:
  sets = [f"data={data}", *PINNED, f"variant={variant}"]
  return (["sweep", "--config", "locomo", "--workdir", str(workdir), "--quiet", "--folds",
           str(FOLDS), "--seeds", str(SEEDS)] + [a for g in GRID for a in ("--grid", g)]
          + [a for s in sets for a in ("--set", s)])


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--workdir", default="checkpoints/sweeps")
  parser.add_argument("--variants", default="linear")
  args = parser.parse_args()
  for variant in args.variants.split(","):
    workdir = Path(args.workdir) / variant
    command = sweep_args(Path(args.data), workdir, variant)
    if rmmjax_main(command) != 0:
      raise SystemExit(f"the {variant} sweep failed")
    table = (workdir / "sweep.md").read_text().strip().splitlines()
    lines = [f"# Sweep of the {variant} reranker's online rates (4-fold cross-validation)", "",
             "`rmmjax " + " ".join(command) + "`", "", *table, "",
             "The workdir's best/ holds the best row's configuration trained on every "
             "conversation of the file."]
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_markdown(RESULTS / f"sweep_{variant}.md", lines)
    print("\n".join(lines))


if __name__ == "__main__":
  main()
