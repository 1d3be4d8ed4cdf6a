"""Changes to what the cross reranker learns from, each an arm of `rmmjax sweep` on the dev
file: 2 folds of the conversations (those of experiments/cross_reranker.py) x 1 seed, compared
question by question with that script's row of the same recipe unchanged. Each run tunes the
query encoder stage, pretrains the cross reranker and is measured by `eval` on its held-out
fold.

Every setting is pinned below (the cross reranker's recipe before these arms, at K = 20 over the
questions alone: the locomo config's query encoder
tuned first, then the cross reranker pretrained for 2 epochs over 8 of each question's K
candidates, its relevant ones first and the others drawn at random from the rest of the K).
The arms:

- k50: K = 50 candidates instead of 20, in pretraining and at serving time (about 55 minutes
  a run on 2 CPU cores, 20 of them the evaluation of 50 candidates per question). K is the
  run's K throughout: the query encoder stage also tunes over 50 candidates, so the arm changes
  the retriever a little as well as the cross reranker, whose drawn negatives come from ranks
  1-50 of that retriever instead of 1-20, whose training sees the evidence found at ranks
  21-50, and whose serving reads 50 candidates, where the ceiling is higher.
- negatives5: K = 20, the pretraining's negatives drawn from ranks 5-20 only
  (`cross.negatives_from_rank=5`): the retriever's top ranks hold evidence the annotators did
  not mark, which the recipe would otherwise teach as negative (about 30 minutes a run).
- encoder0: K = 20, the query encoder stage pretrained alone (`encoder_tuning.steps=0`, the
  best rows of experiments/sweep_encoder.py), so the cross reranker learns from and reranks
  that encoder's candidates (about 30 minutes a run).
- lr4e-5: K = 20, the cross reranker pretrained at 4e-5 instead of 2e-5 (its head and prior at
  50 times that, as in the recipe): the rate was set from fine-tuning practice, not searched
  (about 22 minutes a run).
- candidates16: K = 20, each pretraining step over 16 of each question's candidates instead of
  8 (`cross.pretrain_candidates=16`): twice the negatives beside each question's evidence in
  the listwise loss, at twice the pretraining's cost (about 40 minutes a run).
- lambda: K = 20, pretrained with LambdaLoss instead of the softmax's cross-entropy
  (`cross.pretrain_loss=lambda`): pairs of an evidence and another candidate, each weighted by
  the NDCG its swap would change, so the top of the list counts most (about 25 minutes a run).
- observations: K = 20, the training conversations' LoCoMo observations (2,046 in the dev file,
  statements of what each session established, each naming its turn) join their questions in
  pretraining (`cross.observations=true`): about twice the labelled pairs, from the same
  conversations; held-out conversations are measured on their questions alone (about 50
  minutes a run).
- k50-observations: the two arms that helped, together: K = 50 and the observations in
  pretraining (a grid of one value of each key).
- head10: K = 20, the scoring layer and the prior learning at 10 times the encoder's rate
  instead of 50 (`cross.head_lr_scale=10`): the 50 was set by reasoning about Adam's first
  steps on a head that starts at zero, not searched (about 22 minutes a run).
- prior0: K = 20, the prior over base positions starting flat (`cross.prior_scale=0`) instead
  of at -log(1 + position): whether the retriever's order, given as a starting prior, helps
  a reranker that reads every candidate's text (about 22 minutes a run).
- k50-observations-prior0: the three arms above the recipe, together: K = 50, the
  observations in pretraining and the flat starting prior (over an hour a run).
- k50-prior0: K = 50 and the flat starting prior, without the observations: what the
  observations add at K = 50.
- weakest: K = 20, each question's loss its hardest evidence turn's cross-entropy against the
  irrelevant candidates alone (`cross.pretrain_loss=weakest`): Recall@5 counts a question
  whose evidence is several turns only when all of them are found, which the softmax over
  every candidate does not ask for (about 30 minutes a run).
- defaults-weakest: the weakest loss over today's defaults (K = 50, the observations, the
  flat prior): whether its multi-hop gain at K = 20 holds where the defaults stand (over an
  hour a run); compared with the k50-observations-prior0 arm's own runs, which run first.
- previous-turn: K = 20, each candidate turn read followed by the turn before it in its
  session (`cross.previous_turn=true`, in pretraining and in the held-out evaluation): an
  answer ("Went hiking with Mel!") often says what it answers only beside the question before
  it ("What did you do last weekend?"), which the annotators do not mark as evidence. About
  1.6 times the pairs' tokens, so about 1.6 times a run's pretraining and reading.
- hard-negatives: K = 20, one epoch as the recipe's, then one whose negatives are the
  candidates that epoch's reranker ranks highest (`cross.pretrain_epochs=1`,
  `cross.hard_epochs=1`): the recipe's count of pretraining steps, the second epoch over the
  negatives the reranker confuses rather than random ones, for one scoring of every training
  question's K pairs (20 pairs read against an epoch's 8 read and trained: most of an epoch's
  cost again).
- defaults-hard: the hard-negatives arm over today's defaults (K = 50, the observations, the
  flat prior, `cross.pretrain_epochs=1`, `cross.hard_epochs=1`), compared with the defaults'
  own runs: at K = 50 the mining reads 50 pairs a question, about twice an epoch's cost, so
  the arm pretrains about twice as long as the defaults (well over an hour a run).
- second-reading: K = 20, pretraining also on each training question read beside one of its
  evidence turns among the K, the rest of its evidence the targets and that turn no longer a
  candidate (`cross.second_reading=true`): what a second reading beside the evidence ranked
  first needs to learn (experiments/cross_second_reading.py measures it on this arm's runs).
  About half as many rows again as questions, so about 1.5 times the pretraining.
- previous-turn-hard: K = 20, the two arms whose intervals left zero out together
  (`cross.previous_turn=true`, `cross.pretrain_epochs=1`, `cross.hard_epochs=1`): whether
  their gains add, before either is tried over the defaults (about 1.8 times a run).
- defaults-previous-turn-hard: the previous-turn-hard arm over today's defaults (K = 50, the
  observations, the flat prior), compared with the defaults' own runs: longer pairs and the
  mining of 50 pairs a question, about twice a defaults run (well over an hour a fold).

The k50-observations-prior0 arm's settings are the locomo_cross config's since (over turns;
tests/config/test_sections.py holds them together).

No best/ (--no-best): no row is chosen. A workdir already holding the same sweep is reused
(finished runs are not rerun).

    python experiments/sweep_cross.py [--arm k50|negatives5|encoder0|lr4e-5|observations|
                                             candidates16|lambda|k50-observations|
                                             head10|prior0|k50-observations-prior0|
                                             k50-prior0|weakest|defaults-weakest|
                                             previous-turn|hard-negatives|
                                             defaults-hard|second-reading|
                                             previous-turn-hard|
                                             defaults-previous-turn-hard]
        [--data PATH] [--workdir DIR]
    python experiments/sweep_cross.py --arm ARM --rewrite   # the .md again from finished runs

Writes experiments/results/sweep_cross.md (k50) or sweep_cross_<arm>.md: the sweep's table and
command, and the comparison.
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

# The same recipe at K = 20: the recipe arm's own held-out questions (baseline_file('recipe'),
# trained as every arm is), or, before it was rerun, experiments/cross_reranker.py's row of
# the same folds (made before the pairs were packed).
K20_ROW = "cross, 2 epochs, over the tuned encoder's candidates (variant=cross)"
# The arms others are compared with, each keeping its held-out questions in
# results/sweep_cross_<arm>.json: the recipe, and the defaults (k50-observations-prior0), the
# baseline of the arms that change one thing in the defaults.
BASELINES = ("recipe", "k50-observations-prior0")
BASELINE_OF = {"defaults-weakest": "k50-observations-prior0",
               "defaults-hard": "k50-observations-prior0",
               "defaults-previous-turn-hard": "k50-observations-prior0"}

RECIPE = ("learner=query_encoder,cross", "retriever=hybrid", "units=turn", "k=20", "m=5",
          "batch=4",
          "mode=pretrain+rl", "seed=0", "log_every=5", "checkpoint_every=20",
          "cross.max_length=128", "cross.pretrain_candidates=8", "cross.negatives_from_rank=1",
          "cross.pretrain_epochs=2",
          "cross.pretrain_lr=2e-5", "cross.pretrain_tau=1.0", "cross.head_lr_scale=50.0",
          "cross.prior_scale=1.0", "cross.observations=false", "cross.pretrain_loss=softmax",
          "cross.previous_turn=false", "cross.hard_epochs=0",
          "cross.second_reading=false",
          "cross.compute_dtype=float32",
          "cross.lr=1e-5",
          "cross.tau=1.0", "cross.steps=0",
          "encoder_tuning.tune=query", "encoder_tuning.pretrain_epochs=2",
          "encoder_tuning.pretrain_lr=2e-5", "encoder_tuning.pretrain_tau=0.05",
          "encoder_tuning.pretrain_batch=16", "encoder_tuning.lr=1e-5",
          "encoder_tuning.tau=0.05", "encoder_tuning.steps=600")
# Each arm is a grid of one value (the sweep's runs, measured as a sweep measures them) over
# the recipe above, whose own value of that key is left out.
ARMS = {"k50": "k=50", "negatives5": "cross.negatives_from_rank=5",
        "encoder0": "encoder_tuning.steps=0", "lr4e-5": "cross.pretrain_lr=4e-5",
        "observations": "cross.observations=true",
        "candidates16": "cross.pretrain_candidates=16", "lambda": "cross.pretrain_loss=lambda",
        "k50-observations": ("k=50", "cross.observations=true"),
        "head10": "cross.head_lr_scale=10.0", "prior0": "cross.prior_scale=0.0",
        "k50-observations-prior0": ("k=50", "cross.observations=true", "cross.prior_scale=0.0"),
        "k50-prior0": ("k=50", "cross.prior_scale=0.0"), "recipe": "k=20",
        "weakest": "cross.pretrain_loss=weakest",
        "defaults-weakest": ("k=50", "cross.observations=true", "cross.prior_scale=0.0",
                             "cross.pretrain_loss=weakest"),
        "previous-turn": "cross.previous_turn=true",
        "hard-negatives": ("cross.pretrain_epochs=1", "cross.hard_epochs=1"),
        "defaults-hard": ("k=50", "cross.observations=true", "cross.prior_scale=0.0",
                          "cross.pretrain_epochs=1", "cross.hard_epochs=1"),
        "second-reading": "cross.second_reading=true",
        "previous-turn-hard": ("cross.previous_turn=true", "cross.pretrain_epochs=1",
                               "cross.hard_epochs=1"),
        "defaults-previous-turn-hard": ("k=50", "cross.observations=true",
                                        "cross.prior_scale=0.0", "cross.previous_turn=true",
                                        "cross.pretrain_epochs=1", "cross.hard_epochs=1")}
RESULT_FILES = {"k50": "sweep_cross.md", "negatives5": "sweep_cross_negatives5.md",
                "encoder0": "sweep_cross_encoder0.md", "lr4e-5": "sweep_cross_lr4e-5.md",
                "observations": "sweep_cross_observations.md",
                "candidates16": "sweep_cross_candidates16.md",
                "lambda": "sweep_cross_lambda.md",
                "k50-observations": "sweep_cross_k50-observations.md",
                "head10": "sweep_cross_head10.md", "prior0": "sweep_cross_prior0.md",
                "k50-observations-prior0": "sweep_cross_k50-observations-prior0.md",
                "k50-prior0": "sweep_cross_k50-prior0.md", "recipe": "sweep_cross_recipe.md",
                "weakest": "sweep_cross_weakest.md",
                "defaults-weakest": "sweep_cross_defaults-weakest.md",
                "previous-turn": "sweep_cross_previous-turn.md",
                "hard-negatives": "sweep_cross_hard-negatives.md",
                "defaults-hard": "sweep_cross_defaults-hard.md",
                "second-reading": "sweep_cross_second-reading.md",
                "previous-turn-hard": "sweep_cross_previous-turn-hard.md",
                "defaults-previous-turn-hard": "sweep_cross_defaults-previous-turn-hard.md"}
TITLES = {"k50": "The cross reranker reading K = 50 candidates",
          "negatives5": "The cross reranker's pretraining negatives drawn from ranks 5-20",
          "encoder0": "The cross reranker over a query encoder pretrained without online steps",
          "lr4e-5": "The cross reranker pretrained at twice the rate",
          "observations": "The cross reranker also pretrained on LoCoMo's observations",
          "candidates16": "The cross reranker pretrained over 16 candidates per question",
          "lambda": "The cross reranker pretrained with LambdaLoss",
          "k50-observations": "The cross reranker reading K = 50 candidates, also pretrained on "
                              "LoCoMo's observations",
          "head10": "The cross reranker's head and prior learning at 10 times the rate, not 50",
          "prior0": "The cross reranker without the base order's starting prior",
          "k50-observations-prior0": "The cross reranker reading K = 50 candidates, also "
                                     "pretrained on LoCoMo's observations, without the "
                                     "starting prior",
          "k50-prior0": "The cross reranker reading K = 50 candidates without the starting prior",
          "recipe": "The recipe itself, trained again as the arms are trained",
          "weakest": "The cross reranker pretrained on each question's hardest evidence turn",
          "defaults-weakest": "The cross reranker's defaults pretrained on each question's "
                              "hardest evidence turn",
          "previous-turn": "The cross reranker reading each turn after the one before it",
          "hard-negatives": "The cross reranker's second epoch over the negatives its first "
                            "ranks highest",
          "defaults-hard": "The cross reranker's defaults with a second epoch over the "
                           "negatives their first ranks highest",
          "second-reading": "The cross reranker also pretrained on questions read beside one "
                            "of their evidence turns",
          "previous-turn-hard": "The cross reranker reading each turn after the one before "
                                "it, its second epoch over the negatives its first ranks "
                                "highest",
          "defaults-previous-turn-hard": "The cross reranker's defaults reading each turn after "
                                         "the one before it, their second epoch over the "
                                         "negatives their first ranks highest"}
FOLDS, SEEDS = 2, 1


def arm_settings(arm: str) -> tuple[str, ...]:
  """The arm's KEY=VALUE settings (one, or several changed together)."""
  return (ARMS[arm],) if isinstance(ARMS[arm], str) else ARMS[arm]


def arm_name(arm: str) -> str:
  return ", ".join(arm_settings(arm))


def sweep_args(data: Path, workdir: Path, arm: str) -> list[str]:
  grid = arm_settings(arm)
  keys = {g.partition("=")[0] for g in grid}
  sets = [f"data={data}", *(s for s in RECIPE if s.partition("=")[0] not in keys)]
  return (["sweep", "--config", "locomo", "--workdir", str(workdir), "--quiet", "--no-best",
           "--folds", str(FOLDS), "--seeds", str(SEEDS)] + [a for g in grid for a in ("--grid", g)]
          + [a for s in sets for a in ("--set", s)])


def baseline_file(arm: str) -> Path:
  return RESULTS / f"sweep_cross_{arm}.json"


def against_baseline(workdir: Path, arm: str) -> list[str]:
  """Each question's Recall@5 of the arm's runs against its baseline arm (the recipe unchanged
  at K = 20, or the defaults), paired question by question (both in the file's order), with the
  one interval (2 folds: conversations resampled, indicative). A baseline arm keeps its own."""
  ours = [q for f in range(FOLDS) for q in json.loads(
      (workdir / "runs" / "000" / f"fold_{f}" / "heldout.json").read_text())["per_question"]]
  if arm in BASELINES:
    baseline_file(arm).write_text(json.dumps({key: [q[field] for q in ours] for key, field in (
        ("per_question", "recall_all@5"), ("conversations", "conversation"),
        ("categories", "category"))}))
  base_arm = BASELINE_OF.get(arm, "recipe")
  if arm != base_arm and baseline_file(base_arm).exists():
    stored = json.loads(baseline_file(base_arm).read_text())
    source = f"`--arm {base_arm}`, {baseline_file(base_arm).name}"
  elif base_arm == "recipe":
    stored = json.loads((RESULTS / "cross_reranker.json").read_text())["results"][K20_ROW]
    source = f"`experiments/cross_reranker.py`'s row \"{K20_ROW}\""
  else:
    raise SystemExit(f"--arm {arm} is compared with --arm {base_arm}, whose held-out questions "
                     f"({baseline_file(base_arm)}) are not there: run that arm first")
  if ([q["conversation"] for q in ours] != stored["conversations"]
      or [q["category"] for q in ours] != stored["categories"]):
    raise SystemExit(f"the sweep's held-out questions are not those of {source}")
  a = np.array([q["recall_all@5"] for q in ours])
  b = np.array(stored["per_question"])
  conv, cats = stored["conversations"], np.array(stored["categories"])
  folds = fold_clusters(conv, FOLDS)
  interval = paired_interval(a - b, conv, [folds[c] for c in conv])
  lines = ["", f"Against {'the defaults' if base_arm != 'recipe' else 'the recipe unchanged'} "
           f"({source}, the same folds and questions; made "
           "by the code of its own commit), Recall@5 all:", "", "| | overall | " + " | ".join(sorted(set(cats))) + " |",
           "|---|---|" + "---|" * len(set(cats))]
  for name, v in ((arm_name(arm), a), ("unchanged", b)):
    lines.append(f"| {name} | {v.mean():.3f} | "
                 + " | ".join(f"{v[cats == c].mean():.3f}" for c in sorted(set(cats))) + " |")
  lines += ["", f"{arm_name(arm)} - unchanged: {interval} (95% paired bootstrap)."]
  for f in range(FOLDS):
    held = json.loads((workdir / "runs" / "000" / f"fold_{f}" / "heldout.json").read_text())
    convs = list(dict.fromkeys(q["conversation"] for q in held["per_question"]))
    keep = np.isin(conv, convs)
    lines.append(f"Fold {f} ({', '.join(convs)}): {arm_name(arm)} {a[keep].mean():.3f}, unchanged "
                 f"{b[keep].mean():.3f}.")
  return lines


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  # Relative to where it runs: the command written into the results names no machine path.
  parser.add_argument("--data", default=relative_data())
  parser.add_argument("--arm", default="k50", choices=sorted(ARMS))
  parser.add_argument("--workdir", help="default checkpoints/sweeps/cross_ARM")
  parser.add_argument("--rewrite", action="store_true",
                      help="write the .md again from the workdir's finished runs, running nothing")
  args = parser.parse_args(argv)
  args.workdir = Path(args.workdir or f"checkpoints/sweeps/cross_{args.arm}")
  return args


def configs(argv: list[str]) -> dict:
  """The runs the command line trains (see published.py)."""
  args = parse(argv)
  return sweep_command_runs(sweep_args(Path(args.data), args.workdir, args.arm))


def main() -> None:
  args = parse(sys.argv[1:])
  workdir = args.workdir
  command = sweep_args(Path(args.data), workdir, args.arm)
  if not args.rewrite and rmmjax_main(command) != 0:
    raise SystemExit("the cross reranker's sweep failed")
  table = (workdir / "sweep.md").read_text().strip().splitlines()
  lines = [f"# {TITLES[args.arm]} (2-fold cross-validation)", "",
           "`rmmjax " + " ".join(command) + "`", "", *table, *against_baseline(workdir, args.arm)]
  RESULTS.mkdir(parents=True, exist_ok=True)
  write_markdown(RESULTS / RESULT_FILES[args.arm], lines)
  argv = ["--arm", args.arm] + (["--data", args.data] if args.data != relative_data() else [])
  write_record(RESULTS / RESULT_FILES[args.arm], "sweep_cross", argv, configs(argv))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
