"""The cross reranker against the retrievers and the linear reranker (LoCoMo dev file, 8
conversations, cross-validation by conversation), each model trained by the command a user runs.

On each fold the training conversations are written to a file of their own, and

- `rmmjax train --config locomo --set variant=cross --set holdout=0 --set steps=0` pretrains
  the cross reranker on the training conversations' evidence labels (the supervised row);
- the same workdir extended to 60 steps learns online by REINFORCE from simulated citations
  (the "after REINFORCE" row: what `--set steps=60` makes). It lowered recall on both folds, so
  the variant's default became steps=0 (pretraining alone, the "supervised only" row);
- `--set variant=linear --set learner=reranker --set retriever=hybrid` trains the paper's
  reranker over the same candidates (the locomo config's settings otherwise);

and every model is evaluated as `rmmjax eval --units turn --reranker W` does, on the held-out
conversations only (the evaluation leaves out what a model trained on). BM25 and hybrid are the
base retrievers' orders; "top-20 ceiling" orders the hybrid's 20 candidates perfectly (it uses
the labels: a bound, not a method). Latency is the cross reranker's scoring of one question's
20 candidates on the CPU it runs on, p50 / p95 over 100 questions, compiled beforehand.

Intervals: a fold's conversations share one model, so the honest resampling unit is the fold;
with 2 folds that gives 3 distinct draws and no interval worth printing, so the paired
differences resample conversations (95% bootstrap, 2,000 draws), which understates the
uncertainty a little. The cross reranker's settings (1 pretraining epoch over 8 candidates
per question, up to half of them evidence, lr 2e-5; 60 online steps at lr 1e-5, tau 1.0; the
scoring layer at 50 times those rates) were set before these folds, not tuned on them.

    python experiments/cross_reranker.py [--data PATH] [--folds 2] [--workdirs DIR]
    python experiments/cross_reranker.py --rewrite   # the .md again from the saved .json

Writes experiments/results/cross_reranker.md and .json (every question's recall per row).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from replay_common import CATEGORIES, DEFAULT_DATA, RESULTS, paired
from rmmjax import core
from rmmjax.config import VARIANT_DEFAULTS, apply_overrides, get_config
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.eval.retrieval import evaluate_retrieval
from rmmjax.io.query_encoders import load_query_encoder
from rmmjax.io.reranker_load import load_reranker
from rmmjax.replay.candidates import build_replay, folds
from rmmjax.replay.cross_pairs import pair_tokens
from rmmjax.train.loop import train

OUT = RESULTS / "cross_reranker"
ONLINE_STEPS = 60  # the online phase measured (the variant's default is now none: see below)
METRIC = "recall_all@5"
ROWS = ("BM25", "hybrid", "linear reranker (hybrid candidates)", "cross, supervised only",
        "cross, after REINFORCE", "top-20 ceiling (hybrid; uses labels)")
# learner=both: the query encoder tuned first, the cross reranker over its candidates.
TUNED_ROWS = ("tuned query encoder (hybrid)", "cross over the tuned encoder's candidates",
              "top-20 ceiling (tuned hybrid; uses labels)")


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
  loaded = load_reranker(workdir)
  convs, _ = load_locomo(data)
  replay = build_replay(convs[-1:], "turn", "hybrid", encoder, loaded.spec.k)[0]
  max_length = loaded.record["cross"]["max_length"]
  score = jax.jit(lambda p, t, m: core.cross_scores(p, t, m, loaded.spec.bert))
  times = []
  texts = replay.candidate_texts()
  for n in range(min(questions + 1, len(replay.questions))):
    start = time.perf_counter()
    pairs = pair_tokens(encoder.tokenizer, replay.questions[n:n + 1], texts[n:n + 1], max_length,
                        length=max_length)
    score(loaded.params, pairs.ids_NxKxL, pairs.mask_NxKxL).block_until_ready()
    if n:  # the first call compiles
      times.append(time.perf_counter() - start)
  return {"p50_ms": 1e3 * float(np.percentile(times, 50)),
          "p95_ms": 1e3 * float(np.percentile(times, 95)), "questions": len(times)}


def fold_files(raw: list, heldout: list[int], fold_dir: Path) -> tuple[Path, Path]:
  """The fold's training and held-out conversations, each in a file of its own."""
  fold_dir.mkdir(parents=True, exist_ok=True)
  train_file = subset_file(raw, [i for i in range(len(raw)) if i not in heldout],
                           fold_dir / "train.json")
  return train_file, subset_file(raw, heldout, fold_dir / "heldout.json")


def run_tuned(args, saved: dict) -> dict:
  """The rows of learner=both (`train --set variant=cross --set learner=both --set
  holdout=0`: the query encoder tuned first, then the cross reranker pretrained over the tuned
  hybrid's candidates), added to a saved run of the other rows on the same folds."""
  raw = json.loads(Path(args.data).read_text())
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  base = get_config("locomo")
  results = {name: {"per_question": [], "categories": [], "conversations": []}
             for name in TUNED_ROWS}
  workdirs = Path(args.workdirs or tempfile.mkdtemp(prefix="cross_reranker."))
  for f, heldout in enumerate(folds(len(raw), saved["folds"])):
    fold_dir = workdirs / f"fold{f}"
    train_file, test_file = fold_files(raw, heldout, fold_dir)
    start = time.perf_counter()
    train(apply_overrides(base, [f"data={train_file}", "holdout=0", "variant=cross",
                                 "learner=both"]), fold_dir / "both", progress=True,
          encoder=encoder)
    saved["timing"][f"fold{f} learner=both training s"] = time.perf_counter() - start
    stage = fold_dir / "both" / "query_encoder"
    tuned = load_query_encoder(str(stage), encoder)
    evaluate = lambda **kw: per_question(evaluate_retrieval(  # noqa: E731
        "locomo", test_file, "turn", "hybrid", (5, 10), encoder=encoder, per_question=True,
        **kw))
    fold = {"tuned query encoder (hybrid)": evaluate(query_encoder=str(stage))}
    start = time.perf_counter()
    fold["cross over the tuned encoder's candidates"] = evaluate(reranker=fold_dir / "both")
    saved["timing"][f"fold{f} learner=both evaluation s"] = time.perf_counter() - start
    fold["top-20 ceiling (tuned hybrid; uses labels)"] = ceiling(test_file, encoder, tuned)
    for name in TUNED_ROWS:
      for key in ("per_question", "categories", "conversations"):
        results[name][key] += fold[name][key]
    print(f"fold {f}: " + ", ".join(f"{n} {np.mean(fold[n]['per_question']):.3f}"
                                    for n in TUNED_ROWS), flush=True)
  saved["results"] |= results
  saved["tuned_defaults"] = VARIANT_DEFAULTS["cross"]
  return saved


def epochs_row(epochs: int) -> str:
  return f"cross over the tuned encoder's candidates, {epochs} pretraining epochs"


def run_epochs(args, saved: dict, epochs: int) -> dict:
  """A row of the cross reranker pretrained for `epochs` epochs over each fold's tuned encoder
  (the learner=both runs' own, `query_encoder=` their stage: the same as learner=both with
  pretrain_epochs set), added to the saved rows. The one setting searched over, on these folds."""
  raw = json.loads(Path(args.data).read_text())
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  base = get_config("locomo")
  name = epochs_row(epochs)
  row = {"per_question": [], "categories": [], "conversations": []}
  workdirs = Path(args.workdirs)
  for f, heldout in enumerate(folds(len(raw), saved["folds"])):
    fold_dir = workdirs / f"fold{f}"
    train_file, test_file = fold_files(raw, heldout, fold_dir)
    stage = fold_dir / "both" / "query_encoder"
    start = time.perf_counter()
    train(apply_overrides(base, [f"data={train_file}", "holdout=0", "variant=cross",
                                 "learner=reranker", f"query_encoder={stage}",
                                 f"pretrain_epochs={epochs}"]), fold_dir / f"cross{epochs}",
          progress=True, encoder=encoder)
    saved["timing"][f"fold{f} {epochs} epochs training s"] = time.perf_counter() - start
    fold = per_question(evaluate_retrieval("locomo", test_file, "turn", "hybrid", (5, 10),
                                           encoder=encoder, per_question=True,
                                           reranker=fold_dir / f"cross{epochs}"))
    for key in row:
      row[key] += fold[key]
    print(f"fold {f}: {name} {np.mean(fold['per_question']):.3f}", flush=True)
  saved["results"][name] = row
  return saved


def run(args) -> dict:
  raw = json.loads(Path(args.data).read_text())
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  base = get_config("locomo")
  results = {name: {"per_question": [], "categories": [], "conversations": []} for name in ROWS}
  timing, summaries = {}, []
  workdirs = Path(args.workdirs or tempfile.mkdtemp(prefix="cross_reranker."))
  for f, heldout in enumerate(folds(len(raw), args.folds)):
    fold_dir = workdirs / f"fold{f}"
    # The runs see the training conversations alone (holdout=0, as the target command runs);
    # the evaluation reads the held-out ones.
    train_file, test_file = fold_files(raw, heldout, fold_dir)
    common = [f"data={train_file}", "holdout=0"]
    evaluate = lambda **kw: per_question(evaluate_retrieval(  # noqa: E731
        "locomo", test_file, "turn", kw.pop("retriever", "hybrid"), (5, 10), encoder=encoder,
        per_question=True, **kw))
    fold = {"BM25": evaluate(retriever="bm25"), "hybrid": evaluate()}
    train(apply_overrides(base, common + ["variant=linear", "learner=reranker",
                                          "retriever=hybrid"]), fold_dir / "linear",
          progress=False, encoder=encoder)
    fold["linear reranker (hybrid candidates)"] = evaluate(reranker=fold_dir / "linear")
    start = time.perf_counter()
    steps = args.steps or ONLINE_STEPS
    cross = apply_overrides(base, common + ["variant=cross", f"steps={steps}"] + (
        [f"log_every={steps}", f"checkpoint_every={steps}"] if steps % 5 else []))
    train(dataclasses.replace(cross, steps=0), fold_dir / "cross", progress=True,
          encoder=encoder)
    timing[f"fold{f} pretraining s"] = time.perf_counter() - start
    start = time.perf_counter()
    fold["cross, supervised only"] = evaluate(reranker=fold_dir / "cross")
    timing[f"fold{f} evaluation s"] = time.perf_counter() - start
    start = time.perf_counter()
    summaries.append(train(cross, fold_dir / "cross", progress=True, encoder=encoder))
    timing[f"fold{f} online s"] = time.perf_counter() - start
    fold["cross, after REINFORCE"] = evaluate(reranker=fold_dir / "cross")
    fold["top-20 ceiling (hybrid; uses labels)"] = ceiling(test_file, encoder)
    for name in ROWS:
      for key in ("per_question", "categories", "conversations"):
        results[name][key] += fold[name][key]
    print(f"fold {f}: " + ", ".join(f"{n} {np.mean(fold[n]['per_question']):.3f}"
                                    for n in ROWS), flush=True)
  timing["latency"] = latency(workdirs / "fold0" / "cross", encoder, Path(args.data))
  return {"results": results, "timing": timing, "summaries": summaries, "folds": args.folds,
          "defaults": VARIANT_DEFAULTS["cross"]}


def write(saved: dict) -> None:
  results = saved["results"]
  lines = ["# The cross reranker on LoCoMo (dev file, cross-validation by conversation)", "",
           f"Turn Recall@5 (every evidence turn), {saved['folds']} folds by conversation, "
           f"{len(results['BM25']['per_question'])} held-out questions; written by "
           "experiments/cross_reranker.py.", "",
           "| row | overall | " + " | ".join(CATEGORIES) + " |",
           "|---|---|" + "---|" * len(CATEGORIES)]
  for name in [n for n in ROWS + TUNED_ROWS if n in results] + [
      n for n in results if n not in ROWS + TUNED_ROWS]:
    r = results[name]
    cats = np.array(r["categories"])
    vals = np.array(r["per_question"])
    lines.append(f"| {name} | {vals.mean():.3f} | " + " | ".join(
        f"{vals[cats == c].mean():.3f}" if (cats == c).any() else "-" for c in CATEGORIES)
        + " |")
  lines += ["", "Paired differences (95% bootstrap over conversations):", ""]
  for a, b in (("cross, supervised only", "hybrid"),
               ("cross, after REINFORCE", "cross, supervised only"),
               ("cross, after REINFORCE", "linear reranker (hybrid candidates)"),
               ("cross, after REINFORCE", "hybrid"),
               ("cross over the tuned encoder's candidates", "tuned query encoder (hybrid)"),
               ("cross over the tuned encoder's candidates", "cross, supervised only"),
               (epochs_row(2), "cross over the tuned encoder's candidates"),
               (epochs_row(2), "tuned query encoder (hybrid)")):
    if a in results and b in results:
      lines.append(f"- {a} - {b}: {paired(results, a, b)}")
  t = saved["timing"]
  lines += ["", f"Latency of scoring one question's 20 candidates (on the CPU it ran on): p50 "
            f"{t['latency']['p50_ms']:.0f} ms, p95 {t['latency']['p95_ms']:.0f} ms.", "",
            "Training time per fold: " + ", ".join(f"{k} {v:.0f}" for k, v in t.items()
                                                   if k != "latency"),
            "", f"Defaults of variant=cross when this ran: {json.dumps(saved['defaults'])}"
            + ("; the learner=both rows set learner=both, with the variant's other defaults "
               "then: " + json.dumps({k: v for k, v in saved["tuned_defaults"].items()
                                     if k != "learner"})
               if "tuned_defaults" in saved else ""),
            "", "The online phase lowered recall on both folds: the variant's default is now "
            "steps=0 (pretraining alone, the \"supervised only\" row)."]
  if epochs_row(2) in results:
    lines += ["", "Two pretraining epochs, the one setting searched on these folds (so its "
              "number is optimistic), became the variant's default."]
  OUT.with_suffix(".md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--folds", type=int, default=2)
  parser.add_argument("--workdirs", default=None, help="where the runs go (default: a temp dir)")
  parser.add_argument("--steps", type=int, default=None,
                      help=f"online steps of the cross reranker (default {ONLINE_STEPS}; a "
                           "smaller number only to try the script)")
  parser.add_argument("--rewrite", action="store_true")
  parser.add_argument("--add-tuned", action="store_true",
                      help="run the learner=both rows alone, added to the saved .json")
  parser.add_argument("--add-epochs", type=int, default=None,
                      help="add a row pretrained this many epochs over the learner=both runs' "
                           "tuned encoders (in --workdirs)")
  args = parser.parse_args()
  if args.rewrite:
    write(json.loads(OUT.with_suffix(".json").read_text()))
    return
  if args.add_epochs:
    saved = run_epochs(args, json.loads(OUT.with_suffix(".json").read_text()), args.add_epochs)
  elif args.add_tuned:
    saved = run_tuned(args, json.loads(OUT.with_suffix(".json").read_text()))
  else:
    saved = run(args)
  OUT.with_suffix(".json").write_text(json.dumps(saved, default=float))
  write(saved)


if __name__ == "__main__":
  main()
