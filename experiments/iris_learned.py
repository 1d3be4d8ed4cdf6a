"""IRIS with a learned gap diagnosis (LoCoMo dev file, 8 conversations, 4-fold cross-validation
by conversation), as `rmmjax train --config locomo --set learner=iris --set units=lace` trains
it: on each fold the command's own training run (`rmmjax.train.loop.train`, the config's
defaults: the tuned anchor query encoder, the refinement encoder fitted and then trained online
by REINFORCE from simulated citations, the sufficiency judge fitted at the end on the final
refiner's iterations) on a file of the fold's training conversations followed by its held-out
ones (holdout = their number), then measured on the held-out conversations, pooled.

Rows: single-pass with the base and the tuned query encoder; IRIS with the heuristic judge and
the rule refiner (EviMem's loop as rmmjax had it); the learned refinement, the learned judge
and both (each with the tuned anchor); the reranker inside the learned loop; never stopping
early; oracle stopping (the labels decide stop / continue / abstain, the note is empty: not a
bound, since a later iteration can push found evidence out of the top 10); one bound, the
perfect ranking of what the learned loop gathered (recall of every fact it gathered: the bound
on any reranker); and, marked as label leakage, the oracle whose note is the missing turns'
text. Latency counts everything a question costs (search, embedding every query afresh, the
refiner, the judge): single-pass embeds the question too.

Intervals resample the folds (each fold's conversations share its fitted models). Selected on
these folds: the `learned` preset (2 iterations, no edges), the judge's thresholds, the
refinement vector's weight (0.5), iris_k = 64 and iris_hard_share = 0.5 (one split), and the
encoder settings (from the query encoder's replay folds of the same file).

    python experiments/iris_learned.py [--data PATH] [--folds 4] [--only FOLD]
    python experiments/iris_learned.py --rewrite   # the .md again from the saved .json

Writes experiments/results/iris_learned.md and .json (per-question Recall@10 of every row, and
per-question judge scores and labels, so --rewrite recomputes every figure), and the record of
every run's configuration beside the table (iris_learned.config.json, see published.py;
`configs`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from published import write_record
from replay_common import (CATEGORIES, DEFAULT_DATA, RESULTS, fold_clusters,
                           locomo_config, paired, write_markdown)
from rmmjax import core
from rmmjax.config import apply_overrides, with_values
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.eval.classifier import reliability, roc_auc
from rmmjax.retrieve.iris import SINGLE_PASS_DEPTH, single_pass
from rmmjax.retrieve.metrics import turn_metrics
from rmmjax.retrieve.metrics import aggregate
from rmmjax.memory.lace import LaceMem
from rmmjax.replay.candidates import folds
from rmmjax.learners.iris.episodes import FactReranker, collect_episodes, pretrain_on_episodes
from rmmjax.learners.iris.files import load_iris_model
from rmmjax.learners.iris.fit import NeverSure
from rmmjax.retrieve.iris import IRIS_PRESETS, iris_retrieve
from rmmjax.retrieve.judges import HeuristicJudge, OracleJudge
from rmmjax.retrieve.learned import EmbeddingRefiner, LearnedJudge
from rmmjax.retrieve.refine import is_temporal
from rmmjax.learners.registry import with_model

OUT = RESULTS / "iris_learned.md"
SP_BASE, SP_TUNED = "single-pass, base encoder", "single-pass, tuned encoder"
IRIS_RULE = "IRIS, heuristic judge, rule refiner (base encoder)"
LEARNED_REFINE = "IRIS + learned refinement (heuristic judge)"
LEARNED_JUDGE = "IRIS + learned judge (rule refiner)"
BOTH = "IRIS + learned refinement + learned judge"
RERANKED = "IRIS + learned refinement + learned judge + reranker inside (fused)"
NEVER_STOP = "IRIS + learned refinement, never stopping early"
ORACLE_STOP = "oracle stopping, empty note, learned refinement (not a bound)"
GATHERED = "bound: perfect ranking of what the learned loop gathered"
LEAK = "label leakage: oracle note of the missing turns' text"
COMPARISONS = [(BOTH, SP_BASE), (BOTH, SP_TUNED), (LEARNED_REFINE, SP_TUNED),
               (SP_TUNED, SP_BASE), (IRIS_RULE, SP_BASE), (BOTH, NEVER_STOP),
               (RERANKED, BOTH)]
# The reranker inside the learned loop: the locomo config's linear reranker over the first
# RERANK_K facts the loop gathers, pretrained on the training conversations' labels (logged
# from the learned loop run to its end), fused with the loop's own order.
RERANK_K = 64
# The command's run: the locomo config with learner=iris over LaceMem, defaults otherwise.
TRAIN_SETTINGS = ("learner=iris", "units=lace", "iris_models.k=64", "iris_models.hard_share=0.5")
# What the record names the runs: the fold's learner=iris run gives every learned row its
# models (the anchor, the refinement encoder, the judge); the reranker inside is a run of its own.
IRIS_RUN = "learner=iris (the tuned anchor, learned refinement and learned judge of every row)"


def iris_config(data: Path, holdout: int):
  """The fold's learner=iris run: `rmmjax train` on `data`, a file of the fold's training
  conversations then its `holdout` held-out ones."""
  return apply_overrides(locomo_config(), [*TRAIN_SETTINGS, f"data={data}",
                                           f"holdout={holdout}"])


def reranker_config(data: Path, holdout: int):
  """The reranker inside the learned loop as a run's configuration: the locomo config's linear
  reranker over the first RERANK_K facts of IRIS's evidence (units=lace, the `learned` preset),
  pretrained alone (mode=pretrain) on the fold's training conversations (those of the fold's
  learner=iris run). Its episodes are logged by the loop of that run's models, which no key
  names."""
  return with_values(locomo_config(), {"data": str(data), "holdout": holdout, "units": "lace",
                                       "learner": "linear", "k": RERANK_K, "mode": "pretrain",
                                       "iris_evidence.preset": "learned"})


def fold_splits(data: Path, num_folds: int, only: int | None):
  """(fold, training indices, held-out indices) of the conversations with questions."""
  n = len([c for c in load_locomo(data)[0] if c.questions])
  return [(f, [i for i in range(n) if i not in held], held)
          for f, held in enumerate(folds(n, num_folds)) if only is None or f == only]


def configs(argv: list[str]) -> dict:
  """Every run `main` trains with this command line, {what it trains, fold F: its Config} (see
  published.py). Each fold's runs read a file of its conversations written in a temporary
  folder; the record names the dev file instead (the holdout is the fold's number of held-out
  conversations), the same on every machine. The rows without a learned model (single-pass and
  IRIS with the base encoder, the oracle with the missing turns' text) train nothing."""
  args = parse(argv)
  out = {}
  for f, _, held in fold_splits(Path(args.data), args.folds, args.only):
    out[f"{IRIS_RUN}, fold {f}"] = iris_config(Path(args.data), len(held))
    out[f"{RERANKED}, fold {f}"] = reranker_config(Path(args.data), len(held))
  return out


def train_fold(data: list, train: list[int], held: list[int], workdir: Path, encoder):
  """The learned models of `rmmjax train ... learner=iris` on the fold: a file of its training
  conversations, then its held-out ones (holdout = their number)."""
  path = workdir / "fold.json"
  path.write_text(json.dumps([data[i] for i in [*train, *held]]))
  cfg = iris_config(path, len(held))
  from rmmjax.train.loop import train as run  # noqa: PLC0415  (the command's own call)
  summary = run(cfg, workdir / "run", progress=False, encoder=encoder)
  return load_iris_model(workdir / "run", encoder), summary


def fit_reranker(stores, convs, encoder, fitted, cfg):
  """The reranker of `cfg` (reranker_config) pretrained on the learned loop's episodes of the
  training conversations; (params, spec)."""
  spec = with_model(cfg.core_spec())
  refiner = EmbeddingRefiner(fitted.refine)
  max_evidence = max(len(set(q.evidence)) for c in convs for q in c.questions)
  episodes = []
  for store, conv in zip(stores, convs):
    store.query_encoder = fitted.anchor
    episodes += collect_episodes(store, conv.questions, lambda q: NeverSure(),
                                 IRIS_PRESETS[cfg.iris_evidence.preset], cfg.k, max_evidence,
                                 refiner)
  state = core.init_state(spec, cfg.hparams())
  state, _ = pretrain_on_episodes(state, episodes, cfg.reranker.pretrain_epochs,
                                  cfg.reranker.pretrain_lr, cfg.reranker.pretrain_tau)
  return state.params, spec


def run_rows(conv, store, encoder, fitted, reranker) -> dict[str, list]:
  """name -> [(conversation, category, metrics)] for one held-out conversation; `reranker`
  is (params, spec) of the reranker inside."""
  fresh = encoder.with_cache(None)
  tuned = fitted.anchor
  refiner = EmbeddingRefiner(fitted.refine)
  learned = IRIS_PRESETS["learned"]
  inside = FactReranker(*reranker, store, "fused")
  setups = {  # name: (query encoder, settings or None, judge factory, refiner, reranker)
      SP_BASE: (fresh, None, None, None, None), SP_TUNED: (tuned, None, None, None, None),
      IRIS_RULE: (fresh, IRIS_PRESETS["default"], lambda q: HeuristicJudge(), None, None),
      LEARNED_REFINE: (tuned, learned, lambda q: HeuristicJudge(), refiner, None),
      LEARNED_JUDGE: (tuned, IRIS_PRESETS["default"],
                      lambda q: LearnedJudge(fitted.judge, store), None, None),
      BOTH: (tuned, learned, lambda q: LearnedJudge(fitted.judge, store), refiner, None),
      RERANKED: (tuned, learned, lambda q: LearnedJudge(fitted.judge, store), refiner, inside),
      NEVER_STOP: (tuned, learned, lambda q: NeverSure(), refiner, None),
      ORACLE_STOP: (tuned, learned, lambda q: OracleJudge(q.evidence, store, note=False),
                    refiner, None),
      LEAK: (fresh, IRIS_PRESETS["default"], lambda q: OracleJudge(q.evidence, store), None,
             None),
  }
  rows = {name: [] for name in [*setups, GATHERED]}
  for name, (query_encoder, settings, judge_for, refine, rerank) in setups.items():
    store.query_encoder = query_encoder
    for q in conv.questions:
      extra = {}
      if settings is None:
        turns, seconds = single_pass(store, q.question, SINGLE_PASS_DEPTH)
        extra = {"iterations": 1.0, "abstained": 0.0}
      else:
        start = time.perf_counter()
        result = iris_retrieve(store, q.question, category=q.category, judge=judge_for(q),
                               settings=settings, refiner=refine, reranker=rerank)
        seconds = time.perf_counter() - start
        turns = list(result.turn_ids)
        extra = {"iterations": float(result.iterations), "abstained": float(result.abstained)}
        if name == BOTH:
          all_turns = turn_metrics(store, turns, q.evidence, (len(turns) or 1,),
                                 len(set(q.evidence)))
          rows[GATHERED].append((conv.conversation_id, q.category, {
              "recall_all@10": all_turns[f"recall_all@{len(turns) or 1}"], "latency_ms": 0.0,
              "iterations": 0.0, "abstained": 0.0}))
      metrics = turn_metrics(store, turns, q.evidence, (5, 10), len(set(q.evidence)))
      rows[name].append((conv.conversation_id, q.category,
                         metrics | extra | {"latency_ms": 1e3 * seconds}))
  return rows


def summary(rows) -> dict:
  agg = aggregate([(c, {"recall_all@10": m["recall_all@10"]}) for _, c, m in rows])
  lat = np.array([m["latency_ms"] for _, _, m in rows])
  cats = [c for _, c, _ in rows]
  adversarial = [m["abstained"] for _, c, m in rows if c == "adversarial"]
  answerable = [m["abstained"] for _, c, m in rows if c != "adversarial"]
  return {"all@10": agg["overall"]["recall_all@10"],
          **{c: agg["by_category"][c]["recall_all@10"] for c in CATEGORIES},
          "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
          "iterations": float(np.mean([m["iterations"] for _, _, m in rows])),
          "abstain_adversarial": float(np.mean(adversarial)) if adversarial else 0.0,
          "abstain_answerable": float(np.mean(answerable)) if answerable else 0.0,
          "per_question": [m["recall_all@10"] for _, _, m in rows], "categories": cats,
          "conversations": [conv for conv, _, _ in rows]}


def judge_report(probabilities, labels, stopped, bins: int = 10) -> dict:
  """AUC (ties averaged), expected calibration error and a reliability table of a judge's
  probabilities, and the precision and recall of its decisions to stop."""
  p, y = np.asarray(probabilities, float), np.asarray(labels, bool)
  stop = np.asarray(stopped, bool)
  ece, table = reliability(p, y, bins)
  return {"auc": roc_auc(p, y), "ece": ece, "reliability": table, "positives": int(y.sum()),
          "examples": int(len(p)),
          "stop_precision": float(y[stop].mean()) if stop.any() else float("nan"),
          "stop_recall": float(stop[y].mean()) if y.any() else float("nan"),
          "stops": int(stop.sum())}


def stops(settings, verdict, question, category) -> bool:
  """Whether the loop stops on this verdict (its tiered confidence against the threshold)."""
  threshold = (settings.temporal_stop_confidence if is_temporal(question, category)
               else settings.stop_confidence)
  return verdict.label != "PARTIAL" and settings.calibrate(verdict) >= threshold


def judge_scores(conv, store, fitted, encoder) -> dict[str, list]:
  """Learned and heuristic probabilities of sufficiency after iteration 1 of the learned loop
  and whether each would stop there, with the label (every evidence turn among the judged
  facts)."""
  store.query_encoder = fitted.anchor
  out = {key: [] for key in ("learned", "heuristic", "label", "learned_stop", "heuristic_stop")}
  judge, rule = LearnedJudge(fitted.judge, store), HeuristicJudge()
  settings = IRIS_PRESETS["learned"]
  for q in conv.questions:
    if not q.evidence:
      continue
    result = iris_retrieve(store, q.question, category=q.category, judge=NeverSure(),
                           settings=dataclasses.replace(IRIS_PRESETS["learned"], max_iterations=1))
    shown = [store.fact(f) for f in result.trace[0].shown]
    mine = judge.judge(q.question, shown, {})
    theirs = rule.judge(q.question, shown, {f.turn_id: store.raw(f.turn_id) for f in shown})
    out["learned"].append(judge.probability(q.question, shown))
    out["heuristic"].append(theirs.confidence)
    out["learned_stop"].append(stops(settings, mine, q.question, q.category))
    out["heuristic_stop"].append(stops(settings, theirs, q.question, q.category))
    out["label"].append(set(q.evidence) <= {f.turn_id for f in shown})
  return out


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--folds", type=int, default=4)
  parser.add_argument("--only", type=int, default=None, help="run only this fold (a check)")
  parser.add_argument("--rewrite", action="store_true")
  return parser.parse_args(argv)


def main() -> None:
  args = parse(sys.argv[1:])
  if args.rewrite:  # (the runs, and so their record, are those of the saved results)
    write(json.loads(OUT.with_suffix(".json").read_text()), rewrite=True)
    return
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  convs = [c for c in load_locomo(args.data)[0] if c.questions]
  raw = {r["sample_id"]: r for r in json.loads(Path(args.data).read_text())}
  data = [raw[c.conversation_id] for c in convs]
  stores = [LaceMem.from_conversation(c, encoder) for c in convs]
  pooled: dict[str, list] = {}
  scores: dict[str, list] = {}
  fit_seconds, summaries = [], []
  for f, train, held in fold_splits(Path(args.data), args.folds, args.only):
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
      fitted, summary_f = train_fold(data, train, held, Path(tmp), encoder)
    fit_seconds.append(time.perf_counter() - start)
    summaries.append({k: v for k, v in summary_f.items() if k.startswith("iris_")})
    reranker = fit_reranker([stores[i] for i in train], [convs[i] for i in train], encoder,
                            fitted, reranker_config(Path(args.data), len(held)))
    print(f"fold {f}: trained in {fit_seconds[-1]:.0f} s", flush=True)
    for i in held:
      for name, rows in run_rows(convs[i], stores[i], encoder, fitted, reranker).items():
        pooled.setdefault(name, []).extend(rows)
      for key, values in judge_scores(convs[i], stores[i], fitted, encoder).items():
        scores.setdefault(key, []).extend(values)
  results = {"rows": {name: summary(rows) for name, rows in pooled.items()},
             "judge_scores": scores, "fit_seconds": fit_seconds, "folds": args.folds,
             "only": args.only, "run_summaries": summaries,
             "train_settings": list(TRAIN_SETTINGS)}
  OUT.with_suffix(".json").write_text(json.dumps(results))
  write(results)
  argv = ((["--data", args.data] if args.data != str(DEFAULT_DATA) else [])
          + (["--folds", str(args.folds)] if args.folds != 4 else [])
          + (["--only", str(args.only)] if args.only is not None else []))
  write_record(OUT, "iris_learned", argv, configs(argv))


def write(results: dict, rewrite: bool = False) -> None:
  """The .md of `results` (rewrite: written again from the saved .json, which records no
  command or commit)."""
  rows = results["rows"]
  scores = results["judge_scores"]
  judges = {name: judge_report(scores[name], scores["label"], scores[name + "_stop"])
            for name in ("learned", "heuristic")}
  clusters = fold_clusters(next(iter(rows.values()))["conversations"], results["folds"])
  head = "| configuration | multi-hop | temporal | single-hop | open-domain | adversarial | all " \
         "| iterations | p50 ms | p95 ms |"
  lines = ["# IRIS with a learned gap diagnosis", "",
           f"LoCoMo dev file, {results['folds']}-fold cross-validation by conversation (held-out "
           "conversations pooled); on each fold the models of `rmmjax train --config locomo "
           f"--set {' --set '.join(results['train_settings'])}` (defaults otherwise) on its "
           "training conversations; evidence Recall@10 over the first 10 distinct turns; "
           "latency per question with every query embedded afresh, 2-core CPU.", "",
           "Selected on these folds: the `learned` preset (2 iterations, no edges), the judge's "
           "thresholds, the refinement vector's weight, iris_k = 64 and iris_hard_share = 0.5 "
           "(one split); the encoder's settings come from the replay folds of the same file. "
           "The numbers are therefore optimistic for these settings.", "", head,
           "|" + "---|" * 10]
  for name, r in rows.items():
    lines.append(f"| {name} | " + " | ".join(f"{r[c]:.3f}" for c in CATEGORIES)
                 + f" | {r['all@10']:.3f} | {r['iterations']:.2f} | {r['p50_ms']:.1f} | "
                 f"{r['p95_ms']:.1f} |")
  lines += ["", "Paired differences in Recall@10, mean and 95% paired bootstrap interval "
            "(rmmjax.eval.intervals; each says what it resampled: a fold's conversations share "
            "its models; all / multi-hop / temporal):", ""]
  for a, b in COMPARISONS:
    if a in rows and b in rows:
      parts = [paired(rows, a, b, clusters, c) for c in (None, "multi-hop", "temporal")]
      lines.append(f"- {a} - {b}: " + " / ".join(parts))
  lines += ["", "Abstention (share of questions IRIS abstained on): "]
  for name in (BOTH, ORACLE_STOP, IRIS_RULE):
    if name in rows:
      lines.append(f"- {name}: adversarial {rows[name]['abstain_adversarial']:.3f}, "
                   f"answerable {rows[name]['abstain_answerable']:.3f}")
  lines += ["", "The judges as classifiers after the learned loop's first iteration (label: "
            "every evidence turn among the judged facts):", "",
            "| judge | AUC | ECE | stop precision | stop recall | stops | positives / "
            "examples |", "|---|---|---|---|---|---|---|"]
  for name, j in judges.items():
    lines.append(f"| {name} | {j['auc']:.3f} | {j['ece']:.3f} | "
                 f"{j.get('stop_precision', float('nan')):.3f} | "
                 f"{j.get('stop_recall', float('nan')):.3f} | {j.get('stops', '-')} | "
                 f"{j['positives']} / {j['examples']} |")
  lines += ["", "Reliability of the learned judge (bin, count, mean probability, observed "
            "rate):", ""]
  for lo, hi, n, p, y in judges["learned"]["reliability"]:
    lines.append(f"- [{lo:.1f}, {hi:.1f}): {n}, {p:.3f}, {y:.3f}")
  write_markdown(OUT, lines, {} if rewrite else None)
  print("\n".join(lines))


if __name__ == "__main__":
  main()
