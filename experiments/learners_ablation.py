"""Which learner: the reranker, the retriever's query encoder, or both, cross-validated by
conversation on the LoCoMo dev file, at K = 20, M = 5 and at the paper's second setting K = 50,
M = 10 (Recall@M (all), turn units, hybrid candidates).

Per fold the query encoder is pretrained on the training conversations' labelled evidence
(2 epochs, batches of 16, lr 2e-5, tau 0.05) and trained online by REINFORCE (1 epoch, lr
1e-5): the settings of `train --config locomo --set learner=query_encoder`. Rows:
- the base retrievers (BM25, MiniLM dense, their fusion);
- the reranker over hybrid candidates (pretraining + online RL, the locomo config);
- the tuned query encoder, tune=query (questions only) and tune=both (the bank re-embedded
  with it), retrieving alone (dense) and fused with BM25 (hybrid);
- learner=query_encoder,linear: the reranker trained on the tuned encoder's hybrid candidates
  (tune=query), held-out conversations replayed prequentially.
One seed; results pooled over the held-out questions of all folds. The ceiling (recall of all K
candidates of the base hybrid retriever, and of the tuned one) is reported beside each K.

    python experiments/learners_ablation.py [--data PATH] [--folds 4]

Writes experiments/results/learners_ablation.md (and .json), and the record of every run's
configuration beside the table (learners_ablation.config.json, see published.py; `configs`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from published import write_record
from replay_common import DEFAULT_DATA, RESULTS, write_markdown, locomo_config
from rmmjax import core
from rmmjax.config import with_values
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.replay.candidates import build_replay, ceiling_recall, folds
from rmmjax.replay.protocols import Protocol, run_fold
from rmmjax.encode.tuned import TunedQueryEncoder
from rmmjax.learners.query_encoder.fit import (pretrain_query_encoder, retrieval_encoders,
                                         retrieval_recall, train_query_encoder)

OUT = RESULTS / "learners_ablation"
SETTINGS = ((20, 5), (50, 10))
RERANKER, BOTH = "reranker on hybrid candidates", "both: reranker on the tuned hybrid's candidates"
ENCODER = "query encoder, tune={}"


def run_configs(cfg, k: int, m: int) -> dict:
  """{row: the Config of the run it evaluates} at K = k, M = m (every fold's alike): the
  reranker, the query encoder (one training; tune=query and tune=both are two ways to retrieve
  with it, each its own configuration) and the two stages, all over hybrid candidates. The query
  encoder is trained at the config's M (5) at either K, as tune_encoder does; the two stages'
  encoder stage is that same encoder, which a Config cannot say (one M for both stages: the
  reranker's)."""
  encoder = {"learner": "query_encoder", "retriever": "hybrid", "k": k}
  return {RERANKER: with_values(cfg, {"learner": "linear", "retriever": "hybrid", "k": k,
                                      "m": m}),
          **{ENCODER.format(tune): with_values(cfg, encoder | {"encoder_tuning.tune": tune})
             for tune in ("query", "both")},
          BOTH: with_values(cfg, {"learner": "query_encoder,linear", "retriever": "hybrid",
                                  "k": k, "m": m, "encoder_tuning.tune": "query"})}


def configs(argv: list[str]) -> dict:
  """Every run `main` trains with this command line, {row, K, fold F: its Config} (see
  published.py), the fold as the run's folds/fold (the same split of the file's conversations).
  The base retrievers and the ceilings train nothing; the online phases take the protocol's and
  tune_encoder's passes over the training conversations, not the sections' steps."""
  args = parse(argv)
  cfg = locomo_config(data=args.data)
  return {f"{row}, K={k}, fold {f}": with_values(run, {"folds": args.folds, "fold": f})
          for k, m in SETTINGS for row, run in run_configs(cfg, k, m).items()
          for f in range(args.folds)}


def protocol(run) -> Protocol:
  """How run_fold trains a reranker run (two online passes over the training conversations)."""
  return Protocol(mode=run.mode, pretrain_epochs=run.reranker.pretrain_epochs)


def tune_encoder(encoder, train, cfg):
  """The query encoder of run `cfg` after pretraining and online RL (one pass) on the training
  conversations."""
  tuning = cfg.encoder_tuning
  spec = core.CoreSpec(dim=cfg.dim, k=cfg.k, m=cfg.m, batch=tuning.pretrain_batch)
  hp = core.HParams.create(lr=tuning.pretrain_lr, tau=tuning.pretrain_tau)
  params, _ = pretrain_query_encoder(encoder, train, spec, hp, tuning.pretrain_epochs)
  spec = core.CoreSpec(dim=cfg.dim, k=cfg.k, m=cfg.m, batch=cfg.batch)
  hp = cfg.hparams(tuning)
  params, _ = train_query_encoder(encoder, train, spec, hp, 1, params)
  return TunedQueryEncoder(encoder, params)


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--folds", type=int, default=4)
  return parser.parse_args(argv)


def main() -> None:
  args = parse(sys.argv[1:])
  cfg = locomo_config(data=args.data)  # (the file every run reads)
  conversations = [c for c in load_locomo(Path(args.data))[0] if c.questions]
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  results: dict[str, list] = {}

  def add(label, values):
    results.setdefault(label, []).append(np.asarray(values))

  for k, m in SETTINGS:
    runs = run_configs(cfg, k, m)  # (configs: the same with each fold's key)
    reranker, both_run = runs[RERANKER], runs[BOTH]
    base = build_replay(conversations, "turn", reranker.retriever, encoder, k)
    for test_idx in folds(len(conversations), args.folds):
      start = time.time()
      test = [conversations[i] for i in test_idx]
      for retriever in ("bm25", "dense", "hybrid"):
        add(f"K={k}|{retriever} (base)", np.concatenate(
            [retrieval_recall(c, "turn", retriever, encoder, None, m) for c in test]))
      add(f"K={k}|ceiling of the base hybrid's K", np.concatenate(
          [ceiling_recall(base[i]) for i in test_idx]))
      fold = run_fold(base, test_idx, reranker.core_spec(),
                      core.stack_hparams([reranker.hparams()]), protocol(reranker),
                      reranker.reranker.pretrain_lr, reranker.reranker.pretrain_tau)
      add(f"K={k}|reranker on hybrid candidates", fold["frozen"][0])
      tuned = tune_encoder(encoder, [c for i, c in enumerate(base) if i not in test_idx],
                           runs[ENCODER.format("query")])
      for tune in ("query", "both"):
        memory, query = retrieval_encoders(encoder, tuned,
                                           runs[ENCODER.format(tune)].encoder_tuning.tune)
        for retriever in ("dense", "hybrid"):
          add(f"K={k}|query encoder, tune={tune}, {retriever}", np.concatenate(
              [retrieval_recall(c, "turn", retriever, memory, query, m) for c in test]))
      tuned_replays = build_replay(conversations, "turn", "hybrid", encoder, k,
                                   query_encoder=tuned)
      add(f"K={k}|ceiling of the tuned hybrid's K", np.concatenate(
          [ceiling_recall(tuned_replays[i]) for i in test_idx]))
      both = run_fold(tuned_replays, test_idx, both_run.core_spec(),
                      core.stack_hparams([both_run.hparams()]), protocol(both_run),
                      both_run.reranker.pretrain_lr, both_run.reranker.pretrain_tau)
      add(f"K={k}|both: reranker on the tuned hybrid's candidates", both["frozen"][0])
      add(f"K={k}|both, learning online on held-out conversations", both["heldout"][0])
      print(f"K={k} fold {test_idx}: {time.time() - start:.0f} s "
            + " ".join(f"{label.split('|')[1]}={v[-1].mean():.3f}"
                       for label, v in results.items() if label.startswith(f"K={k}|")),
            flush=True)
  write({label: float(np.concatenate(v).mean()) for label, v in results.items()}, args)
  argv = ((["--data", args.data] if args.data != str(DEFAULT_DATA) else [])
          + (["--folds", str(args.folds)] if args.folds != 4 else []))
  write_record(OUT.with_suffix(".md"), "learners_ablation", argv, configs(argv))


def write(means: dict, args) -> None:
  rows = sorted({label.split("|", 1)[1] for label in means}, key=list(
      dict.fromkeys(label.split("|", 1)[1] for label in means)).index)
  lines = ["# Which learner: reranker, query encoder, or both (LoCoMo dev, cross-validated)", "",
           f"`python experiments/learners_ablation.py --folds {args.folds}`", "",
           f"{args.folds}-fold cross-validation by conversation over the 8 dev conversations, "
           "turn units, one seed; Recall@M (all), pooled over the held-out questions of all "
           "folds. Candidates from the hybrid retriever (BM25 + MiniLM, reciprocal-rank "
           "fusion). tune=query: the tuned encoder embeds the questions only; tune=both: the "
           "memories too (bank re-embedded). Rerankers: frozen after training unless stated.",
           "", "| pipeline | " + " | ".join(f"K={k}, Recall@{m}" for k, m in SETTINGS) + " |",
           "|---|" + "---|" * len(SETTINGS)]
  for row in rows:
    cells = [f"{means[f'K={k}|{row}']:.3f}" if f"K={k}|{row}" in means else "n/a"
             for k, _ in SETTINGS]
    lines.append(f"| {row} | " + " | ".join(cells) + " |")
  OUT.parent.mkdir(parents=True, exist_ok=True)
  write_markdown(OUT.with_suffix(".md"), lines)
  OUT.with_suffix(".json").write_text(json.dumps(means, indent=2) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
