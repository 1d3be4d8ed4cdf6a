"""The cross reranker inside IRIS (LoCoMo dev file, 8 conversations, cross-validation by
conversation), each model trained by the command a user runs.

On each fold the training conversations are written to a file of their own, and

- `rmmjax train --config locomo --set variant=cross --set units=lace --set iris=wide
  --set holdout=0` pretrains the cross reranker on the logged IRIS episodes of the training
  conversations (their first K = 20 facts of the wide gathering, the question read with each
  fact's text; steps=0, the variant's default: pretraining alone);
- `--set variant=linear --set learner=reranker --set units=lace --set iris=wide --set k=20`
  trains the paper's reranker on the same episodes (the locomo config's settings otherwise:
  10 pretraining epochs, then 600 online steps from simulated citations);

and every model is evaluated as `rmmjax eval --units lace --iris wide --reranker W` does (its
order fused with IRIS's own, the default), on the held-out conversations only. "wide IRIS" is
IRIS's own order with the same settings and judge (the heuristic one); "single-pass" one search
of the question. Recall@10 counts the evidence turns among the first 10 distinct turns of the
final evidence.

Intervals: the paired differences resample conversations (95% bootstrap, 2,000 draws); a
fold's conversations share one model, so with 2 folds this understates the uncertainty a
little. The cross reranker's settings are the variant's defaults, set on the turn replay, not
tuned here.

    python experiments/iris_cross.py [--data PATH] [--folds 2] [--workdirs DIR]
    python experiments/iris_cross.py --rewrite   # the .md again from the saved .json

Writes experiments/results/iris_cross.md and .json (every question's Recall@10 per row).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from cross_reranker import fold_files
from replay_common import CATEGORIES, DEFAULT_DATA, RESULTS, paired
from rmmjax.config import VARIANT_DEFAULTS, apply_overrides, get_config
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.eval.retrieval import evaluate_retrieval
from rmmjax.replay.candidates import folds
from rmmjax.train.loop import train

OUT = RESULTS / "iris_cross"
METRIC = "recall_all@10"
ROWS = ("single-pass", "wide IRIS", "wide IRIS + linear reranker (fused)",
        "wide IRIS + cross reranker (fused)")
LACE = ["units=lace", "iris=wide", "holdout=0"]


def per_question(result: dict) -> dict:
  rows = result["per_question"]
  return {"per_question": [r[METRIC] for r in rows], "categories": [r["category"] for r in rows],
          "conversations": [r["conversation"] for r in rows],
          "p95_ms": result["metrics"]["overall"]["latency_p95_ms"]}


def run(args) -> dict:
  raw = json.loads(Path(args.data).read_text())
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  base = get_config("locomo")
  results = {name: {"per_question": [], "categories": [], "conversations": [], "p95_ms": []}
             for name in ROWS}
  timing = {}
  workdirs = Path(args.workdirs or tempfile.mkdtemp(prefix="iris_cross."))
  for f, heldout in enumerate(folds(len(raw), args.folds)):
    fold_dir = workdirs / f"fold{f}"
    train_file, test_file = fold_files(raw, heldout, fold_dir)
    evaluate = lambda **kw: per_question(evaluate_retrieval(  # noqa: E731
        "locomo", test_file, "lace", "hybrid", (5, 10), encoder=encoder, per_question=True,
        **kw))
    fold = {"single-pass": evaluate(), "wide IRIS": evaluate(iris="wide")}
    common = [f"data={train_file}", *LACE]
    train(apply_overrides(base, common + ["variant=linear", "learner=reranker", "k=20"]),
          fold_dir / "linear", progress=False, encoder=encoder)
    fold["wide IRIS + linear reranker (fused)"] = evaluate(iris="wide",
                                                            reranker=fold_dir / "linear")
    start = time.perf_counter()
    train(apply_overrides(base, common + ["variant=cross", "learner=reranker"]),
          fold_dir / "cross", progress=True, encoder=encoder)
    timing[f"fold{f} cross training s"] = time.perf_counter() - start
    start = time.perf_counter()
    fold["wide IRIS + cross reranker (fused)"] = evaluate(iris="wide",
                                                           reranker=fold_dir / "cross")
    timing[f"fold{f} cross evaluation s"] = time.perf_counter() - start
    for name in ROWS:
      for key in ("per_question", "categories", "conversations"):
        results[name][key] += fold[name][key]
      results[name]["p95_ms"].append(fold[name]["p95_ms"])
    print(f"fold {f}: " + ", ".join(f"{n} {np.mean(fold[n]['per_question']):.3f}"
                                    for n in ROWS), flush=True)
  return {"results": results, "timing": timing, "folds": args.folds,
          "defaults": VARIANT_DEFAULTS["cross"]}


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
  for name in ROWS:
    r = results[name]
    cats, vals = np.array(r["categories"]), np.array(r["per_question"])
    lines.append(f"| {name} | {vals.mean():.3f} | " + " | ".join(
        f"{vals[cats == c].mean():.3f}" for c in CATEGORIES) + f" | {max(r['p95_ms']):.0f} |")
  lines += ["", "Paired differences in Recall@10, overall and multi-hop (95% bootstrap over "
            "conversations):", ""]
  for a, b in (("wide IRIS + cross reranker (fused)", "wide IRIS"),
               ("wide IRIS + linear reranker (fused)", "wide IRIS"),
               ("wide IRIS + cross reranker (fused)", "wide IRIS + linear reranker (fused)")):
    lines.append(f"- {a} - {b}: {paired(results, a, b)} overall, "
                 f"{paired(results, a, b, 'multi-hop')} multi-hop")
  lines += ["", "Time per fold: " + ", ".join(f"{k} {v:.0f}" for k, v in
                                               saved["timing"].items()),
            "", f"Defaults of variant=cross when this ran: {json.dumps(saved['defaults'])}"]
  OUT.with_suffix(".md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--folds", type=int, default=2)
  parser.add_argument("--workdirs", default=None, help="where the runs go (default: a temp dir)")
  parser.add_argument("--rewrite", action="store_true")
  args = parser.parse_args()
  if args.rewrite:
    write(json.loads(OUT.with_suffix(".json").read_text()))
    return
  saved = run(args)
  OUT.with_suffix(".json").write_text(json.dumps(saved, default=float))
  write(saved)


if __name__ == "__main__":
  main()
