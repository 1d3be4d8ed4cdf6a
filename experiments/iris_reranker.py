"""The RMM reranker inside IRIS (LoCoMo dev file, 8 conversations, 4-fold cross-validation by
conversation): does ranking IRIS's accumulated evidence with a learnt reranker help, and does
the judge's verdict help as a reward?

IRIS gathers with the heuristic judge. Besides its default settings, a wider gathering (budgets
20 + 10 (i - 1), stopping only on an EXACT verdict) collects far more of the evidence, which
only a better ranking can turn into Recall@10. On each fold the reranker (the locomo config's:
linear, rank prior over K=64 candidates, tau 0.05, lr 1e-4, batch 4, M=5) learns from the
training conversations' logged episodes (candidates: the first 64 facts of the wide gathering's
fused order), then sits inside IRIS on the held-out conversations, reordering the evidence
before each verdict and for the final ranking, alone or fused with IRIS's own order
(reciprocal-rank fusion of the two orders). Rewards of online REINFORCE (3 passes):
simulated citations from the evidence labels (+1 / -1, as in the replay studies), the heuristic
judge's verdict reward on the 5 selected facts (no labels), or their sum. Pretraining is the
listwise loss on the labels (10 epochs). Hyperparameters are the locomo config's, not tuned here.

Paired differences get 95% intervals from a cluster bootstrap over the folds (the questions of
a fold share its fitted reranker, and each conversation's its memory, so neither questions nor
conversations are independent): 2000 draws of the 4 folds with replacement, all their
questions each. Four clusters make a coarse interval; it is the honest one. The reranker's
settings are the locomo config's, chosen on the replay folds of the same file
(experiments/replay_ablation.py); K = 64 and the wide settings were chosen looking at these
folds.

    python experiments/iris_reranker.py [--data PATH] [--seeds 2]
    python experiments/iris_reranker.py --rewrite   # the .md again from the saved .json

Writes experiments/results/iris_reranker.md (and .json, which keeps every question's Recall@10,
category and conversation id per configuration, so the intervals can be recomputed), and the
record of every trained reranker's configuration beside the table (iris_reranker.config.json,
see published.py; `configs`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

from published import write_record
from replay_common import (CATEGORIES, DEFAULT_DATA, RESULTS, fold_clusters,
                           locomo_config, write_markdown,
                           paired)
from rmmjax import core
from rmmjax.config import with_values
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.retrieve.iris import SINGLE_PASS_DEPTH, single_pass
from rmmjax.retrieve.metrics import turn_metrics
from rmmjax.retrieve.metrics import aggregate
from rmmjax.memory.lace import LaceMem
from rmmjax.replay.candidates import folds
from rmmjax.learners.iris.episodes import (RERANK_MODES, FactReranker, RewardMix,
                                         collect_episodes, pretrain_on_episodes,
                                         reinforce_steps)
from rmmjax.retrieve.iris import IrisSettings, iris_retrieve
from rmmjax.retrieve.judges import HeuristicJudge
from rmmjax.learners.registry import with_model

OUT = RESULTS / "iris_reranker"
DEFAULT = IrisSettings()
# Pinned here (its rows' settings); the same as IRIS_PRESETS["wide"], the name its record gives.
WIDE = dataclasses.replace(DEFAULT, base_budget=20, budget_step=10, stop_confidence=1.0,
                           temporal_stop_confidence=1.0)
K, PASSES, NUM_FOLDS = 64, 3, 4
# Per-question lists every result keeps (in conversation order), for paired comparisons.
PER_QUESTION = ("per_question", "categories", "conversations")
# (label, pretrain, online reward mix or None, seeded)
RERANKERS = [
    ("wide IRIS + reranker, untrained (dense similarity)", False, None, False),
    ("wide IRIS + reranker, pretrained on labels", True, None, False),
    ("wide IRIS + reranker, online: citations", False, RewardMix(1.0, 0.0), True),
    ("wide IRIS + reranker, online: verdicts (no labels)", False, RewardMix(0.0, 1.0), True),
    ("wide IRIS + reranker, online: citations + verdicts", False, RewardMix(1.0, 1.0), True),
    ("wide IRIS + reranker, pretrained, then online: citations", True, RewardMix(1.0, 0.0), True),
    ("wide IRIS + reranker, pretrained, then online: citations + verdicts", True,
     RewardMix(1.0, 1.0), True),
]


_R = "wide IRIS + reranker, "
COMPARISONS = [
    ("IRIS (default settings)", "single-pass (one search of the question)"),
    (_R + "pretrained on labels{fused}", "single-pass (one search of the question)"),
    (_R + "pretrained on labels{fused}", "wide IRIS"),
    (_R + "online: citations + verdicts{fused}", _R + "online: citations{fused}"),
    (_R + "online: verdicts (no labels){fused}", _R + "online: citations{fused}"),
    (_R + "pretrained, then online: citations + verdicts{fused}",
     _R + "pretrained, then online: citations{fused}"),
    (_R + "pretrained on labels{fused}", _R + "pretrained on labels, alone"),
]


def reranker_config(cfg, pretrain: bool, mix: RewardMix | None, seed: int):
  """A row's reranker as a run's configuration: the locomo config's reranker over the first K
  facts of wide IRIS's evidence (units=lace), pretrained (mode pretrain or pretrain+rl) and
  learning online from `mix`'s rewards (mode rl or pretrain+rl) or neither (mode=rl with no
  step: the untrained reranker), at `seed`. Its online phase is PASSES passes over the training
  episodes, the script's own (reranker.steps is not read)."""
  mode = ("pretrain+rl" if mix else "pretrain") if pretrain else "rl"
  changes = {"units": "lace", "learner": "linear", "k": K, "iris_evidence.preset": "wide",
             "mode": mode, "seed": seed}
  if mix is not None:
    changes |= {"iris_evidence.citation_reward": mix.citation,
                "iris_evidence.verdict_reward": mix.verdict}
  elif not pretrain:
    changes["reranker.steps"] = 0
  return with_values(cfg, changes)


def configs(argv: list[str]) -> dict:
  """Every reranker `main` trains with this command line, {row, seed S, fold F: its Config}
  (see published.py); each is the model of two rows of the table, fused with IRIS's order and
  alone. The fold is the run's folds/fold (the same split of the file's conversations). The rows
  without a reranker train nothing."""
  args = parse(argv)
  cfg = locomo_config(data=args.data)  # (the file every run reads)
  return {f"{label}{f', seed {seed}' if seeded else ''}, fold {f}":
          with_values(reranker_config(cfg, pretrain, mix, seed), {"folds": NUM_FOLDS, "fold": f})
          for label, pretrain, mix, seeded in RERANKERS
          for seed in range(args.seeds if seeded else 1) for f in range(NUM_FOLDS)}


def evaluate(conv, store, settings, reranker=None) -> list[tuple[str, str, dict]]:
  """(conversation id, category, metrics) per question of `conv`."""
  rows = []
  for q in conv.questions:
    if settings is None:
      turns, seconds = single_pass(store, q.question, SINGLE_PASS_DEPTH)
    else:
      result = iris_retrieve(store, q.question, category=q.category, judge=HeuristicJudge(),
                             settings=settings, reranker=reranker)
      turns, seconds = list(result.turn_ids), result.retrieval_s
    metrics = turn_metrics(store, turns, q.evidence, (5, 10), len(set(q.evidence)))
    rows.append((conv.conversation_id, q.category, metrics | {"latency_ms": 1e3 * seconds}))
  return rows


def train(cfg, episodes, pretrain, mix):
  """The reranker of `cfg` (reranker_config) trained on the episodes."""
  state = core.init_state(with_model(cfg.core_spec()), cfg.hparams())
  if pretrain:
    state, _ = pretrain_on_episodes(state, episodes, cfg.reranker.pretrain_epochs,
                                    cfg.reranker.pretrain_lr, cfg.reranker.pretrain_tau)
  if mix is not None:
    state, _ = reinforce_steps(state, episodes, lambda e: HeuristicJudge(), mix,
                               PASSES * (len(episodes) // state.spec.batch))
  return state


def summary(rows) -> dict:
  agg = aggregate([(c, m) for _, c, m in rows])
  lat = np.array([m["latency_ms"] for _, _, m in rows])
  return {"all@5": agg["overall"]["recall_all@5"], "all@10": agg["overall"]["recall_all@10"],
          **{c: agg["by_category"][c]["recall_all@10"] for c in CATEGORIES},
          "p50_ms": float(np.percentile(lat, 50)), "p95_ms": float(np.percentile(lat, 95)),
          # Every question's Recall@10, category and conversation in conversation order (the
          # folds are contiguous, so the reranker rows list the questions in the same order).
          "per_question": [m["recall_all@10"] for _, _, m in rows],
          "categories": [c for _, c, _ in rows],
          "conversations": [conv for conv, _, _ in rows]}


def _short(result: dict) -> dict:
  return {k: round(v, 3) for k, v in result.items() if k not in PER_QUESTION}


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--seeds", type=int, default=2)
  parser.add_argument("--rewrite", action="store_true",
                      help="write the .md again from the saved .json, without rerunning")
  return parser.parse_args(argv)


def main() -> None:
  args = parse(sys.argv[1:])
  if args.rewrite:  # (the runs, and so their record, are those of the saved results)
    write(json.loads(OUT.with_suffix(".json").read_text()), rewrite=True)
    return
  conversations = [c for c in load_locomo(Path(args.data))[0] if c.questions]
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  stores = [LaceMem.from_conversation(c, encoder) for c in conversations]
  max_evidence = max(len(set(q.evidence)) for c in conversations for q in c.questions)
  start = time.time()
  episodes = [collect_episodes(s, c.questions, lambda q: HeuristicJudge(), WIDE, K, max_evidence)
              for c, s in zip(conversations, stores)]
  print(f"logged {sum(map(len, episodes))} episodes in {time.time() - start:.0f} s", flush=True)
  # Every query is embedded afresh from here on, so latencies compare the same work.
  for store in stores:
    store.query_encoder = encoder.with_cache(None)
  results = {}
  for label, settings in (("single-pass (one search of the question)", None),
                          ("IRIS (default settings)", DEFAULT), ("wide IRIS", WIDE)):
    rows = [r for c, s in zip(conversations, stores) for r in evaluate(c, s, settings)]
    results[label] = summary(rows)
    print(label, _short(results[label]), flush=True)
  cfg = locomo_config(data=args.data)  # (the file every run reads)
  for label, pretrain, mix, seeded in RERANKERS:
    start, per_seed = time.time(), {mode: [] for mode in RERANK_MODES}
    for seed in range(args.seeds if seeded else 1):
      rows = {mode: [] for mode in RERANK_MODES}
      run = reranker_config(cfg, pretrain, mix, seed)  # (configs: the same with each fold's key)
      spec = with_model(run.core_spec())
      for held in folds(len(conversations), NUM_FOLDS):
        train_eps = [e for i, eps in enumerate(episodes) if i not in held for e in eps]
        state = train(run, train_eps, pretrain, mix)
        for i in held:
          for mode in RERANK_MODES:
            rows[mode] += evaluate(conversations[i], stores[i], WIDE,
                                   FactReranker(state.params, spec, stores[i], mode))
      for mode in RERANK_MODES:
        per_seed[mode].append(summary(rows[mode]))
    for mode, runs in per_seed.items():
      name = f"{label}, {'fused with IRIS order' if mode == 'fused' else 'alone'}"
      assert all(r[key] == runs[0][key] for r in runs for key in ("categories", "conversations"))
      results[name] = {key: float(np.mean([r[key] for r in runs])) for key in runs[0]
                       if key not in PER_QUESTION}
      # Per question: Recall@10 averaged over the seeds.
      results[name] |= {"seeds": len(runs),
                        "per_question": np.mean([r["per_question"] for r in runs], 0).tolist(),
                        "categories": runs[0]["categories"],
                        "conversations": runs[0]["conversations"]}
      print(name, _short(results[name]), f"({time.time() - start:.0f} s)", flush=True)
  write(results)
  argv = ((["--data", args.data] if args.data != str(DEFAULT_DATA) else [])
          + (["--seeds", str(args.seeds)] if args.seeds != 2 else []))
  write_record(OUT.with_suffix(".md"), "iris_reranker", argv, configs(argv))


def write(results: dict, rewrite: bool = False) -> None:
  """The .md of `results` (rewrite: written again from the saved .json, which records no
  command or commit)."""
  single = results["single-pass (one search of the question)"]
  lines = ["# The RMM reranker inside IRIS (LoCoMo dev, 1,584 questions, 4-fold CV by "
           "conversation)", "", "`python experiments/iris_reranker.py`", "",
           "Evidence Recall@10 (all) per category over the first 10 distinct turns of the final "
           "evidence, Recall@5 and @10 over all questions; retrieval latency per question (no "
           "judge), 2-core CPU. Reranker rows: held-out conversations only, mean over seeds. "
           "Intervals of paired differences: rmmjax.eval.intervals, each saying what it "
           "resampled (the folds, not questions; the saved rows average their seeds, so seeds "
           "are not resampled). Selected on these folds: K = 64 and the wide "
           "settings; the reranker's own settings come from the replay folds of the same file.",
           "",
           "| configuration | multi-hop | temporal | single-hop | open-domain | adversarial | "
           "all R@5 | all R@10 | p95 ms |", "|---|---|---|---|---|---|---|---|---|"]
  for label, r in results.items():
    lines.append(f"| {label} | " + " | ".join(f"{r[c]:.3f}" for c in CATEGORIES)
                 + f" | {r['all@5']:.3f} | {r['all@10']:.3f} | {r['p95_ms']:.1f} |")
  lines += ["", "Against single-pass (multi-hop / temporal R@10, p95 latency):"]
  for label, r in list(results.items())[1:]:
    lines.append(f"- {label}: {r['multi-hop'] - single['multi-hop']:+.3f} / "
                 f"{r['temporal'] - single['temporal']:+.3f}, "
                 f"{r['p95_ms'] / single['p95_ms']:.1f}x")
  fused = ", fused with IRIS order"
  clusters = fold_clusters(single["conversations"], NUM_FOLDS)
  lines += ["", "Paired differences in Recall@10 (all), mean over questions and 95% paired "
            "bootstrap interval (percentile; all / multi-hop / temporal):"]
  for a, b in COMPARISONS:
    a, b = a.replace("{fused}", fused), b.replace("{fused}", fused)
    lines.append(f"- {a} minus {b}: " + " / ".join(
        paired(results, a, b, clusters, c) for c in (None, "multi-hop", "temporal")))
  OUT.parent.mkdir(parents=True, exist_ok=True)
  write_markdown(OUT.with_suffix(".md"), lines, {} if rewrite else None)
  OUT.with_suffix(".json").write_text(_dumps(results))
  print("\n".join(lines))


def _dumps(results: dict) -> str:
  """JSON of the results, one line per field (the per-question lists each on one line)."""
  entries = [f"  {json.dumps(name)}: {{\n"
             + ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in r.items())
             + "\n  }" for name, r in results.items()]
  return "{\n" + ",\n".join(entries) + "\n}\n"


if __name__ == "__main__":
  main()
