"""Cross-validated sweeps of the embedding rerankers' rates on the dev file, by `rmmjax sweep`.

Every setting the rows rely on is pinned below; the grid is the online temperature x the online
learning rate, 4 folds of the conversations x 2 seeds. A workdir already holding the same sweep
is reused (its finished folds are not rerun).

    python experiments/sweep_rerankers.py [--data PATH] [--workdir DIR]
        [--sweeps linear,mlp,linear_rl,linear_rl_prior]

linear_rl is the linear reranker without pretraining, learning from simulated citations alone
(mode=rl), over its online rate; linear_rl_prior the same with its rank prior started at its
candidates' order (reranker.prior_scale), against the flat start. Writes experiments/results/sweep_<name>.md (the sweep's table,
its command and commit).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from published import relative_data, sweep_command_runs, write_record
from replay_common import RESULTS, write_markdown
from rmmjax.cli import main as rmmjax_main

# The linear reranker's settings as `train --config locomo --set learner=linear` has them,
# pinned so that a default changing later cannot change what a row means.
PINNED = ("retriever=hybrid", "units=turn", "k=20", "m=5", "batch=4",
          "dim=384", "baseline=0.0", "baseline_kind=running", "mode=pretrain+rl", "seed=0",
          "reranker.rank_prior=true", "reranker.pretrain_epochs=10",
          "reranker.pretrain_lr=1e-4", "reranker.pretrain_tau=0.05", "reranker.steps=600",
          "log_every=10")
GRID = ("tau=0.05,0.25,1.0", "lr=3e-6,1e-5,3e-5,1e-4")
FOLDS, SEEDS = 4, 2
# linear_rl: the linear reranker learning from simulated citations alone (no pretraining on
# labels), at the best row's temperature: what online learning does where it is all there is.
SWEEPS = {"linear": ((), GRID), "mlp": ((), GRID),
          "linear_rl": (("mode=rl", "tau=1.0"), ("lr=3e-5,1e-4,3e-4,1e-3",)),
          # Expected: a start at the hybrid order (0.487) instead of the embeddings' own
          # (0.384) keeps citations-only learning at or above the order it reranks.
          "linear_rl_prior": (("mode=rl", "tau=1.0"),
                              ("reranker.prior_scale=0,1,3,10", "lr=1e-4,3e-4"))}
TITLES = {"linear": "Sweep of the linear reranker's online rates (4-fold cross-validation)",
          "mlp": "Sweep of the MLP reranker's online rates (4-fold cross-validation)",
          "linear_rl": "The linear reranker learning from citations alone, no pretraining "
                       "(4-fold cross-validation)",
          "linear_rl_prior": "Citations alone from the candidates' order: the linear reranker's "
                             "rank prior started at -prior_scale * log(1 + position) "
                             "(4-fold cross-validation)"}


def sweep_args(data: Path, workdir: Path, name: str) -> list[str]:
  extra, grid = SWEEPS[name]
  sets = [f"data={data}", *PINNED, f"learner={name.partition('_')[0]}", *extra]
  return (["sweep", "--config", "locomo", "--workdir", str(workdir), "--quiet", "--folds",
           str(FOLDS), "--seeds", str(SEEDS)] + [a for g in grid for a in ("--grid", g)]
          + [a for s in sets for a in ("--set", s)])


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  # Relative to where it runs: the command written into the results names no machine path.
  parser.add_argument("--data", default=relative_data())
  parser.add_argument("--workdir", default="checkpoints/sweeps")
  parser.add_argument("--sweeps", default="linear", help=f"of {', '.join(SWEEPS)}")
  parser.add_argument("--rewrite", action="store_true",
                      help="write the .md again from the workdirs' finished sweeps, running "
                           "nothing")
  args = parser.parse_args(argv)
  for name in args.sweeps.split(","):
    if name not in SWEEPS:
      raise SystemExit(f"--sweeps: {name!r} is not one of {', '.join(SWEEPS)}")
  return args


def configs(argv: list[str]) -> dict:
  """The runs the command line trains (see published.py)."""
  args = parse(argv)
  return {f"{name}: {label}": cfg for name in args.sweeps.split(",")
          for label, cfg in sweep_command_runs(
              sweep_args(Path(args.data), Path(args.workdir) / name, name)).items()}


def main() -> None:
  args = parse(sys.argv[1:])
  for name in args.sweeps.split(","):
    workdir = Path(args.workdir) / name
    command = sweep_args(Path(args.data), workdir, name)
    if not args.rewrite and rmmjax_main(command) != 0:
      raise SystemExit(f"the {name} sweep failed")
    table = (workdir / "sweep.md").read_text().strip().splitlines()
    lines = [f"# {TITLES[name]}", "",
             "`rmmjax " + " ".join(command) + "`", "", *table, "",
             "The workdir's best/ holds the best row's configuration trained on every "
             "conversation of the file."]
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_markdown(RESULTS / f"sweep_{name}.md", lines)
    argv = ["--sweeps", name] + (["--data", args.data] if args.data != relative_data() else [])
    write_record(RESULTS / f"sweep_{name}.md", "sweep_rerankers", argv, configs(argv))
    print("\n".join(lines))


if __name__ == "__main__":
  main()
