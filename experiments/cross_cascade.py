"""A cascade for serving the cross reranker at less cost: it reads only the first N of its K
candidates in the tuned retriever's order (`rmmjax eval --candidates N`), and the other K - N
follow in that order. Nothing is trained: the rerankers are the ones a sweep of `sweep_cross.py`
trained on each of its 2 folds (the defaults' arm, K = 50, by default), and each held-out
question is measured read whole (the sweep's own heldout.json) and read in part.

What each reading costs a question is its pairs: N instead of K, which `rmmjax bench cross`
times at serving (served ms per question at K = 50 and 20); the evaluation's wall time is
printed beside it, on whatever else this machine runs. Intervals: 95% paired bootstrap over
conversations (2 folds: indicative).

    python experiments/cross_cascade.py [--arm k50-observations-prior0] [--candidates 20,30]
        [--data PATH] [--workdir DIR]

Writes experiments/results/cross_cascade_<arm>.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from published import relative_data, write_record
from replay_common import RESULTS, fold_clusters, write_markdown
import sweep_cross
from rmmjax.eval.intervals import paired_interval
from rmmjax.eval.retrieval import evaluate_retrieval

METRICS = {"recall_all@5": "R@5 all", "recall_all@10": "R@10 all", "ndcg@10": "NDCG@10",
           "mrr": "MRR"}


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  parser.add_argument("--arm", default="k50-observations-prior0", choices=sorted(sweep_cross.ARMS))
  parser.add_argument("--candidates", default="20,30",
                      help="the N read of each question's K, comma-separated")
  parser.add_argument("--data", default=relative_data())
  parser.add_argument("--workdir", help="the arm's sweep (default: sweep_cross.py's)")
  return parser.parse_args(argv)


def fold_readings(run: Path, data: Path, n: int) -> dict:
  """The run's held-out questions read from their first n candidates (saved beside the run: a
  fold read before is not read again), with the wall time of the evaluation."""
  saved = run / f"cascade_{n}.json"
  if not saved.exists():
    start = time.perf_counter()
    result = evaluate_retrieval("locomo", data, "turn", "hybrid", (5, 10), reranker=run,
                                per_question=True, candidates=n)
    saved.write_text(json.dumps({"per_question": result["per_question"],
                                 "seconds": time.perf_counter() - start}))
  return json.loads(saved.read_text())


def main() -> None:
  args = parse(sys.argv[1:])
  workdir = Path(args.workdir or f"checkpoints/sweeps/cross_{args.arm}")
  ns = [int(n) for n in args.candidates.split(",")]
  runs = [workdir / "runs" / "000" / f"fold_{f}" for f in range(sweep_cross.FOLDS)]
  for run in runs:
    if not (run / "heldout.json").is_file():
      raise SystemExit(f"{run} holds no finished run: `python experiments/sweep_cross.py --arm "
                       f"{args.arm}` trains and measures it first")
  whole = [q for run in runs
           for q in json.loads((run / "heldout.json").read_text())["per_question"]]
  readings, seconds = {}, {}
  for n in ns:
    folds = [fold_readings(run, Path(args.data), n) for run in runs]
    readings[n] = [q for fold in folds for q in fold["per_question"]]
    seconds[n] = [fold["seconds"] for fold in folds]
    if [q["conversation"] for q in readings[n]] != [q["conversation"] for q in whole]:
      raise SystemExit(f"the reading of {n} candidates is not of the sweep's held-out questions")
  convs = [q["conversation"] for q in whole]
  cats = np.array([q["category"] for q in whole])
  clusters = fold_clusters(convs, sweep_cross.FOLDS)
  k = json.loads((runs[0] / "config.json").read_text())["k"]
  names = sorted(set(cats))
  argv = ["--arm", args.arm, "--candidates", args.candidates] + (
      ["--data", args.data] if args.data != relative_data() else [])
  lines = [f"# The cross reranker reading the first N of its K = {k} candidates "
           f"({args.arm} arm's rerankers, 2-fold cross-validation)", "",
           f"`python experiments/cross_cascade.py {' '.join(argv)}`, over the runs of "
           f"`python experiments/sweep_cross.py --arm {args.arm}`; "
           "held-out questions of both folds. Intervals: 95% paired bootstrap over "
           "conversations (2 folds: indicative), each reading against the whole one.", ""]
  rows = [(f"all K = {k} (the sweep's)", whole, None)] + [
      (f"first N = {n}", readings[n], n) for n in ns]
  for metric, title in METRICS.items():
    lines += [f"{title} by category:", "", "| reading | overall | " + " | ".join(names)
              + " | - whole |", "|---|---|" + "---|" * (len(names) + 1)]
    full = np.array([q[metric] for q in whole])
    for name, qs, n in rows:
      v = np.array([q[metric] for q in qs])
      diff = "" if n is None else str(paired_interval(v - full, convs,
                                                       [clusters[c] for c in convs]))
      lines.append(f"| {name} | {v.mean():.3f} | " + " | ".join(
          f"{v[cats == c].mean():.3f}" for c in names) + f" | {diff} |")
    lines.append("")
  lines += ["Every evidence turn among the candidates read (R all of all N): " + ", ".join(
      f"N = {n} {np.mean([q['ceiling'] for q in readings[n]]):.3f}" for n in ns)
      + f", all K = {k} {np.mean([q['ceiling'] for q in whole]):.3f}. Evaluation wall time "
      "per fold (seconds, this machine as it was): " + "; ".join(
          f"N = {n} " + ", ".join(f"{s:.0f}" for s in seconds[n]) for n in ns) + "."]
  out = RESULTS / f"cross_cascade_{args.arm}.md"
  write_markdown(out, lines)
  write_record(out, "cross_cascade", argv, configs(argv))
  print("\n".join(lines))


def configs(argv: list[str]) -> dict:
  """The runs whose rerankers it reads (see published.py): the arm's sweep's."""
  args = parse(argv)
  return sweep_cross.configs(["--arm", args.arm, "--data", args.data])


if __name__ == "__main__":
  main()
