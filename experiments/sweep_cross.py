"""A cross-validated sweep of the cross reranker on the dev file, by `rmmjax sweep`: how many
candidates it reads (K, in its pretraining and at serving time), 2 folds of the conversations x
1 seed (each run trains the query encoder stage and the cross reranker, about 20 minutes on 2 CPU
cores).

Every setting the rows rely on is pinned below (`variant=cross`'s recipe when this was first run:
the locomo config's query encoder tuned first, then the cross reranker pretrained for 2 epochs
over 8 of each question's K candidates, its relevant ones first and the others drawn at random
from the rest of the K). With K = 50 the drawn negatives come from ranks 1-50 of the tuned
retriever instead of 1-20, and serving reads 50 candidates, where the candidates' ceiling is
higher. A workdir already holding the same sweep is reused (finished runs are not rerun).

    python experiments/sweep_cross.py [--data PATH] [--workdir DIR]

Writes experiments/results/sweep_cross.md (the sweep's table, its command and commit).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from replay_common import DEFAULT_DATA, RESULTS, write_markdown
from rmmjax.cli import main as rmmjax_main

PINNED = ("variant=cross", "learner=both", "retriever=hybrid", "units=turn", "m=5", "batch=4",
          "mode=pretrain+rl", "seed=0", "log_every=5", "checkpoint_every=20",
          "cross.max_length=128", "cross.pretrain_candidates=8", "cross.pretrain_epochs=2",
          "cross.pretrain_lr=2e-5", "cross.pretrain_tau=1.0", "cross.head_lr_scale=50.0",
          "cross.prior_scale=1.0", "cross.compute_dtype=float32", "cross.lr=1e-5",
          "cross.tau=1.0", "cross.steps=0",
          "encoder_tuning.tune=query", "encoder_tuning.pretrain_epochs=2",
          "encoder_tuning.pretrain_lr=2e-5", "encoder_tuning.pretrain_tau=0.05",
          "encoder_tuning.pretrain_batch=16", "encoder_tuning.lr=1e-5",
          "encoder_tuning.tau=0.05", "encoder_tuning.steps=600")
GRID = ("k=50,20",)
FOLDS, SEEDS = 2, 1


def sweep_args(data: Path, workdir: Path) -> list[str]:
  sets = [f"data={data}", *PINNED]
  return (["sweep", "--config", "locomo", "--workdir", str(workdir), "--quiet", "--folds",
           str(FOLDS), "--seeds", str(SEEDS)] + [a for g in GRID for a in ("--grid", g)]
          + [a for s in sets for a in ("--set", s)])


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--workdir", default="checkpoints/sweeps/cross")
  args = parser.parse_args()
  workdir = Path(args.workdir)
  command = sweep_args(Path(args.data), workdir)
  if rmmjax_main(command) != 0:
    raise SystemExit("the cross reranker's sweep failed")
  table = (workdir / "sweep.md").read_text().strip().splitlines()
  lines = ["# Sweep of the cross reranker's candidates per question (2-fold cross-validation)", "",
           "`rmmjax " + " ".join(command) + "`", "", *table, "",
           "The workdir's best/ holds the best row's configuration trained on every "
           "conversation of the file."]
  RESULTS.mkdir(parents=True, exist_ok=True)
  write_markdown(RESULTS / "sweep_cross.md", lines)
  print("\n".join(lines))


if __name__ == "__main__":
  main()
