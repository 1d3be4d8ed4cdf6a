"""The cross reranker against the retrievers and the linear reranker (LoCoMo dev file, 8
conversations, cross-validation by conversation), each model trained by the command a user runs.

On each fold the training conversations are written to a file of their own, and with every
setting a row names pinned below (so that a default changing later cannot change what a row
means):

- `train --set learner=cross --set pretrain_epochs=1 --set steps=0
  --set holdout=0` pretrains the cross reranker over the base hybrid's 20 candidates;
- a copy of that workdir extended to 60 steps learns online by REINFORCE from simulated
  citations;
- `train --set learner=query_encoder,cross --set pretrain_epochs=2` is the cross reranker's
  recipe at K = 20 over the questions alone (the defaults of then: K = 50 and the
  observations since, experiments/sweep_cross.py): the locomo config's query encoder tuned
  first (its stage's settings are checked
  below), then the cross reranker pretrained for 2 epochs over the tuned hybrid's candidates;
- the same cross reranker pretrained for 1 epoch over that run's tuned encoder
  (`learner=cross --set query_encoder=W/query_encoder`, what the two stages do with 1 epoch);
- the paper's linear reranker over the hybrid's candidates (`learner=linear
  retriever=hybrid`, the locomo config's settings, pinned);

and every model is evaluated as `rmmjax eval --units turn --reranker W` does, on the held-out
conversations only (the evaluation leaves out what a model trained on). BM25 and hybrid are the
base retrievers' orders; "top-20 ceiling" orders the 20 candidates perfectly (it uses the labels:
a bound, not a method). Latency is the cross reranker's scoring of one question's 20 candidates on
the CPU it runs on, p50 / p95 over 100 questions, compiled beforehand.

Intervals: a fold's conversations share one model, so the honest resampling unit is the fold;
with 2 folds that gives 3 distinct draws and no interval worth printing, so the paired
differences resample conversations (95% bootstrap, 2,000 draws), which understates the
uncertainty. The cross settings were set before these folds (a recipe kept), except the number
of pretraining epochs: 2 against 1 was chosen on these same folds, so the 2-epoch row is
optimistic.

    python experiments/cross_reranker.py [--data PATH] [--folds 2] [--workdirs DIR]
    python experiments/cross_reranker.py --rewrite   # the .md again from the saved .json

With --workdirs, a run killed part way resumes its finished models from there. Writes
experiments/results/cross_reranker.md and .json (every question's recall per row, every run's
settings, the command and the commit), and the record of every run's configuration beside the
table (cross_reranker.config.json, see published.py; `configs`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from published import write_record
from replay_common import (CATEGORIES, DEFAULT_DATA, RESULTS, fold_clusters, paired, provenance,
                           write_markdown)
from rmmjax.learners.cross import cross_scores
from rmmjax.config import apply_overrides, encoder_stage, get_config, get_value
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.eval.retrieval import evaluate_retrieval
from rmmjax.learners.query_encoder.files import load_query_encoder
from rmmjax.learners.loading import load_reranker
from rmmjax.io.workdir import read_config
from rmmjax.replay.candidates import build_replay, folds
from rmmjax.learners.cross.pairs import pair_tokens
from rmmjax.train.loop import train

OUT = RESULTS / "cross_reranker"
METRIC = "recall_all@5"
ONLINE_STEPS = 60

# Every setting of every run, pinned (the values of the recipe when the rows were first measured).
CROSS = ["retriever=hybrid", "units=turn", "k=20", "m=5", "batch=4",
         "mode=pretrain+rl", "max_length=128", "pretrain_candidates=8",
         "pretrain_lr=2e-5", "pretrain_tau=1.0", "head_lr_scale=50.0", "prior_scale=1.0",
         "observations=false",
         "compute_dtype=float32", "lr=1e-5", "tau=1.0", "checkpoint_every=20", "log_every=5",
         "seed=0"]
RUNS = {
    "linear": ["learner=linear", "retriever=hybrid", "units=turn", "k=20",
               "m=5", "batch=4", "rank_prior=true", "mode=pretrain+rl", "pretrain_epochs=10",
               "pretrain_lr=1e-4", "pretrain_tau=0.05", "tau=0.05", "lr=1e-4",
               "baseline=0.0", "baseline_kind=running", "steps=600", "seed=0"],
    "cross": CROSS + ["learner=cross", "pretrain_epochs=1", "steps=0"],
    "cross_online": CROSS + ["learner=cross", "pretrain_epochs=1", f"steps={ONLINE_STEPS}"],
    "both": CROSS + ["learner=query_encoder,cross", "pretrain_epochs=2", "steps=0"],
    "tuned1": CROSS + ["learner=cross", "pretrain_epochs=1", "steps=0"],  # + query_encoder
}
# The two stages train their query encoder as the locomo config's learner=query_encoder run; the
# stage's settings are read back from its config.json and must be these.
ENCODER_STAGE = {"learner": "query_encoder", "retriever": "hybrid", "k": 20,
                 "encoder_tuning.tune": "query", "encoder_tuning.pretrain_epochs": 2,
                 "encoder_tuning.pretrain_lr": 2e-5, "encoder_tuning.pretrain_tau": 0.05,
                 "encoder_tuning.pretrain_batch": 16, "encoder_tuning.lr": 1e-5,
                 "encoder_tuning.tau": 0.05, "encoder_tuning.steps": 600, "mode": "pretrain+rl",
                 "batch": 4, "seed": 0}

ROWS = {  # row -> (how it is made, the run it evaluates)
    "BM25": "the base order", "hybrid": "the base order",
    "linear reranker (hybrid candidates)": "linear",
    "cross, 1 epoch, over the hybrid's candidates": "cross",
    f"the same, then {ONLINE_STEPS} online REINFORCE steps": "cross_online",
    "top-20 ceiling (hybrid; uses labels)": "a bound",
    "tuned query encoder (hybrid)": "both/query_encoder",
    "cross, 1 epoch, over the tuned encoder's candidates": "tuned1",
    "cross, 2 epochs, over the tuned encoder's candidates (variant=cross)": "both",
    "top-20 ceiling (tuned hybrid; uses labels)": "a bound",
}
HEADLINE = "cross, 2 epochs, over the tuned encoder's candidates (variant=cross)"
# The row each trained run makes (the tuned query encoder's row is the stage of "both").
RUN_ROWS = {run: row for row, run in ROWS.items() if run in RUNS}
STAGE_ROW = "tuned query encoder (hybrid)"
# How the record names the runs' per-fold paths, the same on every machine: their data stays the
# dev file (each run reads that fold's training conversations, written to FOLD/train.json), and
# tuned1's encoder is the "both" run's stage under the script's workdirs.
WORKDIRS = Path("WORKDIR")
PAIRS = (("cross, 1 epoch, over the hybrid's candidates", "hybrid"),
         (f"the same, then {ONLINE_STEPS} online REINFORCE steps",
          "cross, 1 epoch, over the hybrid's candidates"),
         (f"the same, then {ONLINE_STEPS} online REINFORCE steps",
          "linear reranker (hybrid candidates)"),
         ("cross, 1 epoch, over the tuned encoder's candidates", "tuned query encoder (hybrid)"),
         ("cross, 1 epoch, over the tuned encoder's candidates",
          "cross, 1 epoch, over the hybrid's candidates"),
         (HEADLINE, "cross, 1 epoch, over the tuned encoder's candidates"),
         (HEADLINE, "tuned query encoder (hybrid)"))


def subset_file(raw: list, which: list[int], path: Path) -> Path:
  """A data file of some of the conversations, in the file's order."""
  path.write_text(json.dumps([raw[i] for i in which]))
  return path


def per_question(result: dict) -> dict:
  rows = result["per_question"]
  return {"per_question": [r[METRIC] for r in rows], "categories": [r["category"] for r in rows],
          "conversations": [r["conversation"] for r in rows]}


def ceiling(data: Path, encoder, query_encoder=None) -> dict:
  """The hybrid's top 20 in a perfect order: every evidence turn among them first."""
  convs, _ = load_locomo(data)
  convs = [c for c in convs if c.questions]
  out = {"per_question": [], "categories": [], "conversations": []}
  for conv, replay in zip(convs, build_replay(convs, "turn", "hybrid", encoder, 20,
                                              query_encoder=query_encoder)):
    for n, q in enumerate(conv.questions):
      # Evidence turns among the 20: a perfect order puts up to 5 of them in the top 5.
      found = replay.evidence_NxKxE[n].any(0)
      out["per_question"].append(min(int(found.sum()), 5) / len(set(q.evidence)))
      out["categories"].append(q.category)
      out["conversations"].append(conv.conversation_id)
  return out


def latency(workdir: Path, encoder, data: Path, questions: int = 100) -> dict:
  """Tokenising, packing and scoring one question's candidates, as serving does, timed per
  question after a first pass over the same questions has compiled every packed shape."""
  loaded = load_reranker(workdir)
  convs, _ = load_locomo(data)
  replay = build_replay(convs[-1:], "turn", "hybrid", encoder, loaded.spec.k)[0]
  max_length = loaded.record["cross"]["max_length"]
  score = jax.jit(lambda p, pairs: cross_scores(p, pairs, loaded.spec.model.bert))
  texts = replay.candidate_texts()

  def one(n: int) -> float:
    start = time.perf_counter()
    pairs = pair_tokens(encoder.tokenizer, replay.questions[n:n + 1], texts[n:n + 1], max_length,
                        length=max_length)
    score(loaded.params, pairs.packed(serving=True)).block_until_ready()
    return time.perf_counter() - start

  chosen = range(min(questions, len(replay.questions)))
  for n in chosen:  # compiles each shape once
    one(n)
  times = [one(n) for n in chosen]
  return {"p50_ms": 1e3 * float(np.percentile(times, 50)),
          "p95_ms": 1e3 * float(np.percentile(times, 95)), "questions": len(times)}


def fold_files(raw: list, heldout: list[int], fold_dir: Path) -> tuple[Path, Path]:
  """The fold's training and held-out conversations, each in a file of its own."""
  fold_dir.mkdir(parents=True, exist_ok=True)
  train_file = subset_file(raw, [i for i in range(len(raw)) if i not in heldout],
                           fold_dir / "train.json")
  return train_file, subset_file(raw, heldout, fold_dir / "heldout.json")


def check_stage(stage: Path) -> None:
  """Refuses an encoder stage trained with other settings than the rows name."""
  cfg = read_config(stage)
  wrong = {k: (get_value(cfg, k), v) for k, v in ENCODER_STAGE.items()
           if get_value(cfg, k) != v}
  if wrong:
    raise SystemExit(f"{stage} trained its query encoder with {wrong} (found, pinned): the "
                     "locomo config's encoder settings changed; pin them in ENCODER_STAGE's "
                     "place or relabel the rows")


def run_config(name: str, data: Path, fold_dir: Path):
  """The configuration run `name` of the fold in `fold_dir` trains on `data` (its training
  conversations), what `run` trains and `configs` records."""
  extra = [f"query_encoder={fold_dir / 'both' / 'query_encoder'}"] if name == "tuned1" else []
  return apply_overrides(get_config("locomo"), [f"data={data}", "holdout=0", *RUNS[name],
                                                *extra])


def configs(argv: list[str]) -> dict:
  """Every run `run` trains with this command line, {table row, fold F: its Config} (see
  published.py), the per-fold paths named as WORKDIRS says; the tuned query encoder's row is the
  "both" run's first stage, recorded as that stage's own configuration. The base orders and the
  ceilings train nothing."""
  args = parse(argv)
  out = {}
  for f in range(args.folds):  # (folds() splits the file's conversations into args.folds)
    fold_dir = WORKDIRS / f"fold{f}"
    for name, row in RUN_ROWS.items():
      out[f"{row}, fold {f}"] = run_config(name, Path(args.data), fold_dir)
      if name == "both":
        out[f"{STAGE_ROW}, fold {f}"] = encoder_stage(out[f"{row}, fold {f}"])
  return out


def run(args) -> dict:
  raw = json.loads(Path(args.data).read_text())
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  results = {name: {"per_question": [], "categories": [], "conversations": []} for name in ROWS}
  timing, summaries = {}, {}
  workdirs = Path(args.workdirs or tempfile.mkdtemp(prefix="cross_reranker."))

  def trained(name: str, fold_dir: Path, data: Path):
    start = time.perf_counter()
    summary = train(run_config(name, data, fold_dir), fold_dir / name, progress=not args.quiet,
                    encoder=encoder)
    timing[f"{fold_dir.name} {name} training s"] = time.perf_counter() - start
    summaries[f"{fold_dir.name} {name}"] = summary
    return fold_dir / name

  for f, heldout in enumerate(folds(len(raw), args.folds)):
    fold_dir = workdirs / f"fold{f}"
    # The runs see the training conversations alone (holdout=0, as the target command runs);
    # the evaluation reads the held-out ones.
    train_file, test_file = fold_files(raw, heldout, fold_dir)

    def evaluate(name, **kw):
      start = time.perf_counter()
      out = per_question(evaluate_retrieval(
          "locomo", test_file, "turn", kw.pop("retriever", "hybrid"), (5, 10), encoder=encoder,
          per_question=True, progress=not args.quiet, **kw))
      timing[f"fold{f} {name} evaluation s"] = time.perf_counter() - start
      return out

    fold = {"BM25": evaluate("BM25", retriever="bm25"), "hybrid": evaluate("hybrid")}
    fold["linear reranker (hybrid candidates)"] = evaluate(
        "linear", reranker=trained("linear", fold_dir, train_file))
    fold["cross, 1 epoch, over the hybrid's candidates"] = evaluate(
        "cross", reranker=trained("cross", fold_dir, train_file))
    # A copy of that workdir extended: its checkpoint of step 0 is the pretrained model above
    # (a copy, so that a rerun of this script resumes both where they are).
    if not (fold_dir / "cross_online").exists():
      shutil.copytree(fold_dir / "cross", fold_dir / "cross_online")
    fold[f"the same, then {ONLINE_STEPS} online REINFORCE steps"] = evaluate(
        "cross_online", reranker=trained("cross_online", fold_dir, train_file))
    fold["top-20 ceiling (hybrid; uses labels)"] = ceiling(test_file, encoder)
    both = trained("both", fold_dir, train_file)
    stage = both / "query_encoder"
    check_stage(stage)
    fold[HEADLINE] = evaluate("both", reranker=both)
    fold["tuned query encoder (hybrid)"] = evaluate("tuned encoder", query_encoder=str(stage))
    fold["cross, 1 epoch, over the tuned encoder's candidates"] = evaluate(
        "tuned1", reranker=trained("tuned1", fold_dir, train_file))  # over `stage`
    fold["top-20 ceiling (tuned hybrid; uses labels)"] = ceiling(
        test_file, encoder, load_query_encoder(str(stage), encoder))
    for name in ROWS:
      for key in ("per_question", "categories", "conversations"):
        results[name][key] += fold[name][key]
    print(f"fold {f}: " + ", ".join(f"{n} {np.mean(fold[n]['per_question']):.3f}"
                                    for n in ROWS), flush=True)
  timing["latency"] = latency(workdirs / "fold0" / "cross", encoder, Path(args.data))
  return {"results": results, "timing": timing, "summaries": summaries, "folds": args.folds,
          "runs": RUNS, "encoder_stage": ENCODER_STAGE, "rows": ROWS,
          "provenance": provenance()}


def write(saved: dict) -> None:
  results = saved["results"]
  lines = ["# The cross reranker on LoCoMo (dev file, cross-validation by conversation)", "",
           f"Turn Recall@5 (every evidence turn), K = 20 candidates, {saved['folds']} folds by "
           f"conversation, {len(results['BM25']['per_question'])} held-out questions; written "
           "by experiments/cross_reranker.py.", "",
           "| row | overall | " + " | ".join(CATEGORIES) + " | run |",
           "|---|---|" + "---|" * len(CATEGORIES) + "---|"]
  rows = saved.get("rows", ROWS)
  for name, r in results.items():
    cats = np.array(r["categories"])
    vals = np.array(r["per_question"])
    lines.append(f"| {name} | {vals.mean():.3f} | " + " | ".join(
        f"{vals[cats == c].mean():.3f}" if (cats == c).any() else "-" for c in CATEGORIES)
        + f" | {rows.get(name, '')} |")
  lines += ["", "Paired differences, 95% paired bootstrap (rmmjax.eval.intervals; a fold's "
            "conversations share its models, so with 2 folds it resamples conversations, which "
            "understates the uncertainty: indicative):", ""]
  folds = fold_clusters(results["BM25"]["conversations"], saved["folds"])
  for a, b in PAIRS:
    if a in results and b in results:
      lines.append(f"- {a} - {b}: {paired(results, a, b, folds)}")
  per_fold = {}
  for name in (HEADLINE, "cross, 1 epoch, over the hybrid's candidates"):
    if name in results:
      convs = np.array(results[name]["conversations"])
      vals = np.array(results[name]["per_question"])
      ids = list(dict.fromkeys(convs))
      parts = np.array_split(np.arange(len(ids)), saved["folds"])
      per_fold[name] = [float(vals[np.isin(convs, [ids[i] for i in p])].mean()) for p in parts]
  lines += [""] + [f"Per fold, {name}: " + ", ".join(f"{v:.3f}" for v in vals)
                   for name, vals in per_fold.items()]
  t = saved["timing"]
  lines += ["", f"Latency of scoring one question's 20 candidates (on the CPU it ran on): p50 "
            f"{t['latency']['p50_ms']:.0f} ms, p95 {t['latency']['p95_ms']:.0f} ms.", "",
            "Seconds per fold: " + ", ".join(f"{k} {v:.0f}" for k, v in t.items()
                                             if k != "latency")]
  if "runs" in saved:
    lines += ["", "Every run's settings (`--set` overrides of the locomo config, with "
              "data=FOLD/train.json and holdout=0):", ""]
    lines += [f"- {name}: {' '.join(overrides)}" for name, overrides in saved["runs"].items()]
    lines += ["- tuned1 adds query_encoder=both/query_encoder (that fold's tuned encoder)",
              "- both's query-encoder stage was checked to have trained with "
              + json.dumps(saved["encoder_stage"])]
  if "defaults" in saved:  # (a run made before every row's settings were recorded)
    lines += ["", f"Defaults of the cross reranker when this ran: {json.dumps(saved['defaults'])}; "
              "the two-stage rows set two stages over its other defaults then: "
              + json.dumps(saved["tuned_defaults"])]
  lines += ["", "Chosen on these folds: the 2 pretraining epochs (against 1), so that row is "
            "optimistic; the other cross settings were set before them."]
  write_markdown(OUT.with_suffix(".md"), lines, saved)
  print("\n".join(lines))


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--folds", type=int, default=2)
  parser.add_argument("--workdirs", default=None, help="where the runs go (default: a temp dir)")
  parser.add_argument("--quiet", action="store_true", help="no progress bars")
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
  # What selects the table's runs (where they were written and the progress bars do not).
  argv = ((["--data", args.data] if args.data != str(DEFAULT_DATA) else [])
          + (["--folds", str(args.folds)] if args.folds != 2 else []))
  write_record(OUT.with_suffix(".md"), "cross_reranker", argv, configs(argv))


if __name__ == "__main__":
  main()
