"""The query encoder's pretraining rate and online steps, by `rmmjax sweep` on the dev file:
2 folds of the conversations (those of experiments/cross_reranker.py) x 1 seed, a training
run of its own per configuration and fold (the encoder's shapes are not shared), each measured
by `eval --query-encoder` on its held-out fold.

Every other setting is pinned below (the locomo config's `learner=query_encoder` run, which is
also the first stage of `--config locomo_cross`). The grid asks two things: whether the 600 online
REINFORCE steps from simulated citations after the supervised pretraining add anything
(`encoder_tuning.steps=0` is pretraining alone), and whether a larger pretraining rate does
better than the one set by the earlier ablation's exploratory runs. The row of the present
defaults is compared question by question with experiments/cross_reranker.py's "tuned query
encoder (hybrid)" row, the same recipe trained by `train` on the same folds. A workdir already
holding the same sweep is reused (finished runs are not rerun).

    python experiments/sweep_encoder.py [--data PATH] [--workdir DIR]
    python experiments/sweep_encoder.py --rewrite   # the .md again from the finished runs

Writes experiments/results/sweep_encoder.md (the sweep's table and command, and the check).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from published import relative_data, sweep_command_runs, write_record
from replay_common import RESULTS, fold_clusters, write_markdown
from rmmjax.cli import main as rmmjax_main
from rmmjax.eval.intervals import paired_interval

PINNED = ("learner=query_encoder", "retriever=hybrid", "units=turn", "k=20", "m=5", "batch=4",
          "mode=pretrain+rl", "seed=0", "encoder_tuning.tune=query",
          "encoder_tuning.pretrain_epochs=2", "encoder_tuning.pretrain_tau=0.05",
          "encoder_tuning.pretrain_batch=16", "encoder_tuning.lr=1e-5",
          "encoder_tuning.tau=0.05")
GRID = ("encoder_tuning.pretrain_lr=2e-5,5e-5", "encoder_tuning.steps=0,600")
FOLDS, SEEDS = 2, 1
DEFAULTS = {"encoder_tuning.pretrain_lr": 2e-5, "encoder_tuning.steps": 600}
STORED_ROW = "tuned query encoder (hybrid)"  # experiments/cross_reranker.py's row


def sweep_args(data: Path, workdir: Path) -> list[str]:
  sets = [f"data={data}", *PINNED]
  return (["sweep", "--config", "locomo", "--workdir", str(workdir), "--quiet", "--no-best",
           "--folds", str(FOLDS), "--seeds", str(SEEDS)] + [a for g in GRID for a in ("--grid", g)]
          + [a for s in sets for a in ("--set", s)])


def against_stored(workdir: Path) -> list[str]:
  """The present defaults' row against the same recipe trained and evaluated by
  cross_reranker.py, question by question (both in the file's order)."""
  ours = []
  for f in range(FOLDS):
    runs = [json.loads(p.read_text())
            for p in sorted(workdir.glob(f"runs/*/fold_{f}/heldout.json"))]
    ours += next(r for r in runs if all(r["settings"][k] == v for k, v in DEFAULTS.items())
                 )["per_question"]
  stored = json.loads((RESULTS / "cross_reranker.json").read_text())["results"][STORED_ROW]
  if ([q["conversation"] for q in ours] != stored["conversations"]
      or [q["category"] for q in ours] != stored["categories"]):
    raise SystemExit("the sweep's held-out questions are not those of cross_reranker.json")
  a = np.array([q["recall_all@5"] for q in ours])
  b = np.array(stored["per_question"])
  folds = fold_clusters(stored["conversations"], FOLDS)
  interval = paired_interval(a - b, stored["conversations"],
                             [folds[c] for c in stored["conversations"]])
  same = float(np.mean(np.isclose(a, b)))
  defaults = ", ".join(f"{k}={v}" for k, v in DEFAULTS.items())
  return ["", f"The row of the present defaults ({defaults}) "
          f"against `experiments/cross_reranker.py`'s row \"{STORED_ROW}\" (the same recipe "
          "trained by `train` on each fold's training conversations, made by the code of its "
          f"own commit): Recall@5 all {a.mean():.3f} here, {b.mean():.3f} there, difference "
          f"{interval} (95% paired bootstrap); "
          f"{same:.1%} of the questions score the same."]


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  # Relative to where it runs: the command written into the results names no machine path.
  parser.add_argument("--data", default=relative_data())
  parser.add_argument("--workdir", default="checkpoints/sweeps/encoder")
  parser.add_argument("--rewrite", action="store_true",
                      help="write the .md again from the workdir's finished runs, running nothing")
  return parser.parse_args(argv)


def configs(argv: list[str]) -> dict:
  """The runs the command line trains (see published.py)."""
  args = parse(argv)
  return sweep_command_runs(sweep_args(Path(args.data), Path(args.workdir)))


def main() -> None:
  args = parse(sys.argv[1:])
  workdir = Path(args.workdir)
  command = sweep_args(Path(args.data), workdir)
  if not args.rewrite and rmmjax_main(command) != 0:
    raise SystemExit("the query encoder's sweep failed")
  table = (workdir / "sweep.md").read_text().strip().splitlines()
  lines = ["# The query encoder's pretraining rate and online steps (2-fold cross-validation)",
           "", "`rmmjax " + " ".join(command) + "`", "", *table, *against_stored(workdir)]
  RESULTS.mkdir(parents=True, exist_ok=True)
  write_markdown(RESULTS / "sweep_encoder.md", lines)
  argv = ["--data", args.data] if args.data != relative_data() else []
  write_record(RESULTS / "sweep_encoder.md", "sweep_encoder", argv, configs(argv))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
