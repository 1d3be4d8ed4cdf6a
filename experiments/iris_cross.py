"""The cross reranker inside IRIS (LoCoMo dev file, 8 conversations, cross-validation by
conversation), each model trained by the command a user runs.

On each fold the training conversations are written to a file of their own, and

- `rmmjax train --config locomo --set learner=cross --set units=lace --set iris=wide
  --set holdout=0 --set pretrain_epochs=1 --set steps=0` pretrains the cross reranker for one
  epoch on the logged IRIS episodes of the training conversations (their first K = 20 facts of
  the wide gathering, the question read with each fact's text; pretraining alone);
- `--set learner=linear --set units=lace --set iris=wide --set k=20`
  trains the paper's reranker on the same episodes (10 pretraining epochs, then 600 online
  steps from simulated citations);

every setting either row names pinned below (a default changing later cannot change a row),

and every model is evaluated as `rmmjax eval --units lace --iris wide --reranker W
--rerank-mode fused` does (its order fused with IRIS's own), on the held-out conversations only.
"wide IRIS" is IRIS's own order with the same settings and judge (the heuristic one);
"single-pass" one search of the question. Recall@10 counts the evidence turns among the first
10 distinct turns of the final evidence.

Intervals: the paired differences resample conversations (95% bootstrap, 2,000 draws); a
fold's conversations share one model, so with 2 folds this understates the uncertainty. The
cross reranker's settings are the turn replay's recipe (one epoch, as it was when this ran
first), not tuned here.

    python experiments/iris_cross.py [--data PATH] [--folds 2] [--workdirs DIR]
    python experiments/iris_cross.py --rewrite   # the .md again from the saved .json

Writes experiments/results/iris_cross.md and .json (every question's Recall@10 per row), and the
record of every run's configuration beside the table (iris_cross.config.json, see published.py;
`configs`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import numpy as np

from cross_reranker import fold_files
from published import write_record
from replay_common import (CATEGORIES, DEFAULT_DATA, RESULTS, fold_clusters, paired, provenance,
                           write_markdown)
from rmmjax.config import apply_overrides, get_config
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.eval import iris_eval
from rmmjax.eval.retrieval import evaluate_retrieval
from rmmjax.replay.candidates import folds
from rmmjax.train.loop import train

OUT = RESULTS / "iris_cross"
METRIC = "recall_all@10"
KEPT = "wide IRIS + a reranker keeping the order it is handed (a fresh cross reranker)"
ROWS = ("single-pass", "wide IRIS", KEPT, "wide IRIS + linear reranker (fused)",
        "wide IRIS + cross reranker (fused)")
LACE = ["units=lace", "iris_evidence.preset=wide", "holdout=0", "retriever=hybrid", "k=20", "m=5",
        "batch=4", "mode=pretrain+rl", "citation_reward=1.0", "verdict_reward=0.0", "seed=0"]
# Every setting of each run, pinned.
RUNS = {"linear": ["learner=linear", "rank_prior=true",
                   "pretrain_epochs=10", "pretrain_lr=1e-4", "pretrain_tau=0.05", "tau=0.05",
                   "lr=1e-4", "baseline=0.0", "baseline_kind=running", "steps=600"],
        "cross": ["learner=cross", "pretrain_epochs=1", "steps=0",
                  "pretrain_lr=2e-5", "pretrain_tau=1.0", "tau=1.0", "lr=1e-5",
                  "checkpoint_every=20", "log_every=5", "max_length=128",
                  "pretrain_candidates=8", "head_lr_scale=50.0", "prior_scale=1.0",
                  "observations=false",
                  "compute_dtype=float32"]}


# The row each trained run makes (the row of a reranker keeping its order reads the cross run's
# workdir with its scores replaced, and trains nothing).
RUN_ROWS = {"linear": "wide IRIS + linear reranker (fused)",
            "cross": "wide IRIS + cross reranker (fused)"}


def run_config(name: str, data: Path):
  """The configuration run `name` trains on `data` (a fold's training conversations), what
  `run` trains and `configs` records."""
  return apply_overrides(get_config("locomo"), [f"data={data}", *LACE, *RUNS[name]])


def configs(argv: list[str]) -> dict:
  """Every run `run` trains with this command line, {table row, fold F: its Config} (see
  published.py). Each run reads its fold's training conversations (FOLD/train.json); the record
  names the dev file instead, the same on every machine."""
  args = parse(argv)
  return {f"{row}, fold {f}": run_config(name, Path(args.data))
          for f in range(args.folds) for name, row in RUN_ROWS.items()}


def per_question(result: dict) -> dict:
  rows = result["per_question"]
  return {"per_question": [r[METRIC] for r in rows], "categories": [r["category"] for r in rows],
          "conversations": [r["conversation"] for r in rows],
          "p95_ms": result["metrics"]["overall"]["latency_p95_ms"]}


def keep_order(question, facts):
  """A reranker that keeps the order it is given."""
  return [-float(i) for i in range(len(facts))]


def run(args) -> dict:
  raw = json.loads(Path(args.data).read_text())
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  results = {name: {"per_question": [], "categories": [], "conversations": [], "p95_ms": []}
             for name in ROWS}
  timing = {}
  workdirs = Path(args.workdirs or tempfile.mkdtemp(prefix="iris_cross."))
  for f, heldout in enumerate(folds(len(raw), args.folds)):
    fold_dir = workdirs / f"fold{f}"
    train_file, test_file = fold_files(raw, heldout, fold_dir)
    evaluate = lambda **kw: per_question(evaluate_retrieval(  # noqa: E731
        "locomo", test_file, "lace", "hybrid", (5, 10), encoder=encoder, per_question=True,
        rerank_mode="fused", **kw))
    fold = {"single-pass": evaluate(), "wide IRIS": evaluate(iris="wide")}
    train(run_config("linear", train_file), fold_dir / "linear", progress=False, encoder=encoder)
    fold["wide IRIS + linear reranker (fused)"] = evaluate(iris="wide",
                                                            reranker=fold_dir / "linear")
    start = time.perf_counter()
    train(run_config("cross", train_file), fold_dir / "cross", progress=True, encoder=encoder)
    timing[f"fold{f} cross training s"] = time.perf_counter() - start
    start = time.perf_counter()
    fold["wide IRIS + cross reranker (fused)"] = evaluate(iris="wide",
                                                           reranker=fold_dir / "cross")
    timing[f"fold{f} cross evaluation s"] = time.perf_counter() - start
    # IRIS hands a reranker its evidence fused over the searches before each verdict: with a
    # reranker that keeps that order (what a fresh cross reranker's prior does) the judge and
    # the final order already differ from IRIS's own. The like-for-like baseline.
    with mock.patch.object(iris_eval, "fact_reranker", lambda *args: keep_order):
      fold[KEPT] = evaluate(iris="wide", reranker=fold_dir / "cross")
    for name in ROWS:
      for key in ("per_question", "categories", "conversations"):
        results[name][key] += fold[name][key]
      results[name]["p95_ms"].append(fold[name]["p95_ms"])
    print(f"fold {f}: " + ", ".join(f"{n} {np.mean(fold[n]['per_question']):.3f}"
                                    for n in ROWS), flush=True)
  return {"results": results, "timing": timing, "folds": args.folds,
          "runs": {name: LACE + overrides for name, overrides in RUNS.items()},
          "provenance": provenance()}


def write(saved: dict) -> None:
  results = saved["results"]
  lines = ["# The cross reranker inside IRIS (LoCoMo dev file, cross-validation by "
           "conversation)", "",
           f"Evidence Recall@10 (all), {saved['folds']} folds by conversation, "
           f"{len(results['wide IRIS']['per_question'])} held-out questions, LaceMem facts, "
           "IRIS's wide settings with the heuristic judge; written by "
           "experiments/iris_cross.py. p95: retrieval latency per question, the worst fold's, "
           "on the 2-core CPU it ran on.", "",
           "| row | overall | " + " | ".join(CATEGORIES) + " | p95 ms |",
           "|---|---|" + "---|" * len(CATEGORIES) + "---|"]
  for name in [n for n in ROWS if n in results]:
    r = results[name]
    cats, vals = np.array(r["categories"]), np.array(r["per_question"])
    lines.append(f"| {name} | {vals.mean():.3f} | " + " | ".join(
        f"{vals[cats == c].mean():.3f}" for c in CATEGORIES) + f" | {max(r['p95_ms']):.0f} |")
  lines += ["", "Paired differences in Recall@10, overall and multi-hop (95% paired bootstrap, "
            "rmmjax.eval.intervals; a fold's conversations share its models, so with 2 folds it "
            "resamples conversations, which understates the uncertainty: indicative):", ""]
  folds = fold_clusters(results["wide IRIS"]["conversations"], saved["folds"])
  for a, b in (("wide IRIS + cross reranker (fused)", "wide IRIS"),
               ("wide IRIS + cross reranker (fused)", KEPT), (KEPT, "wide IRIS"),
               ("wide IRIS + linear reranker (fused)", "wide IRIS"),
               ("wide IRIS + cross reranker (fused)", "wide IRIS + linear reranker (fused)")):
    if a not in results or b not in results:
      continue
    lines.append(f"- {a} - {b}: {paired(results, a, b, folds)} overall, "
                 f"{paired(results, a, b, folds, 'multi-hop')} multi-hop")
  lines += ["", "Time per fold: " + ", ".join(f"{k} {v:.0f}" for k, v in
                                               saved["timing"].items()),
            ""] + (
      [f"Defaults of the cross reranker when this ran: {json.dumps(saved['defaults'])}"]
      if "defaults" in saved else
      ["Every run's settings (`--set` overrides of the locomo config, with "
       "data=FOLD/train.json):", ""] + [f"- {name}: {' '.join(overrides)}"
                                       for name, overrides in saved["runs"].items()])
  write_markdown(OUT.with_suffix(".md"), lines, saved)
  print("\n".join(lines))


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--folds", type=int, default=2)
  parser.add_argument("--workdirs", default=None, help="where the runs go (default: a temp dir)")
  parser.add_argument("--rewrite", action="store_true")
  return parser.parse_args(argv)


def main() -> None:
  args = parse(sys.argv[1:])
  if args.rewrite:  # (the runs, and so their record, are those of the saved results)
    write(json.loads(OUT.with_suffix(".json").read_text()))
    return
  saved = run(args)
  OUT.with_suffix(".json").write_text(json.dumps(saved, default=float))
  write(saved)
  argv = ((["--data", args.data] if args.data != str(DEFAULT_DATA) else [])
          + (["--folds", str(args.folds)] if args.folds != 2 else []))
  write_record(OUT.with_suffix(".md"), "iris_cross", argv, configs(argv))


if __name__ == "__main__":
  main()
