"""Ablation on LoCoMo with cross-validation over the dev conversations.

Every fold holds out two conversations; the reranker trains on the other six and is measured
on the held-out ones, replayed prequentially (ranked first, then learning from that batch's
simulated citations). Rows: the base retriever alone (RAG); a reranker trained by online
REINFORCE only; offline pretraining on labelled evidence only; pretraining then online
REINFORCE. Then, without a reranker, the retriever's query encoder itself is trained with the
same objectives on the hybrid top-K candidates (RL alone; supervised pretraining; pretraining
then RL) and evaluated by dense search and by its fusion with BM25 (one seed: it
back-propagates through MiniLM; these rows take most of the script's ~25 minutes; held-out
conversations are not adapted to online). Three seeds for the reranker rows (one vmapped
program per fold). Hyperparameters are fixed in advance (the locomo config; online RL alone also
at the paper's lr 1e-3), not tuned on the folds.

    python experiments/replay_ablation.py [--data PATH] [--folds 4] [--seeds 3]

Writes experiments/results/replay_ablation.md (and .json), and the record of every run's
configuration beside the table (replay_ablation.config.json, see published.py; `configs`).
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
from replay_common import DEFAULT_DATA, RESULTS, write_markdown, locomo_config
from rmmjax import core
from rmmjax.config import with_values
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.replay.protocols import Protocol, cross_validate
from rmmjax.encode.tuned import TunedQueryEncoder
from rmmjax.learners.query_encoder.fit import (pretrain_query_encoder, retrieval_recall,
                                         train_query_encoder)
from rmmjax.replay.candidates import build_replay, folds
from rmmjax.learners.registry import with_model

OUT = RESULTS / "replay_ablation"
RETRIEVERS = ("dense", "bm25", "hybrid")
# Query-encoder rows: label, supervised epochs (batches of 16, lr 2e-5, tau 0.05), RL epochs.
ENCODER_ROWS = [("query encoder, online RL (no reranker)", 0, 1),
                ("query encoder, pretraining only (no reranker)", 2, 0),
                ("query encoder, pretraining + online RL (no reranker)", 2, 1)]
ENCODER_PRETRAIN = {"lr": 2e-5, "tau": 0.05, "batch": 16}
ENCODER_RL_LR = {False: 2e-5, True: 1e-5}  # from scratch; after pretraining
ROWS = [  # label, protocol, learning rate of the online phase
    ("+ reranker, online RL (lr 1e-3)", Protocol(mode="rl", online_epochs=2), 1e-3),
    ("+ reranker, online RL (lr 1e-4)", Protocol(mode="rl", online_epochs=2), 1e-4),
    ("+ reranker, pretraining only", Protocol(mode="pretrain", adapt=False), 1e-4),
    ("+ reranker, pretraining + online RL", Protocol(mode="pretrain+rl", online_epochs=2), 1e-4),
]


def reranker_config(cfg, retriever: str, protocol: Protocol, lr: float, seed: int):
  """A reranker row's run over `retriever`'s candidates: its protocol's mode, the online rate,
  the rank prior over BM25's and the hybrid's orders (dense's is the embeddings' own). Its
  online phase is the protocol's passes over the training conversations (reranker.steps is not
  read); its pretraining the protocol's epochs, reranker.pretrain_epochs'."""
  return with_values(cfg, {"learner": "linear", "retriever": retriever,
                           "reranker.rank_prior": retriever != "dense", "reranker.lr": lr,
                           "mode": protocol.mode, "seed": seed})


def encoder_config(cfg, pretrain_epochs: int, rl_epochs: int):
  """A query-encoder row's run over the hybrid's candidates: supervised pretraining at
  ENCODER_PRETRAIN's settings (if it has epochs), then (if it has epochs) online RL at
  ENCODER_RL_LR's rate (one seed, the config's). Its online phase is `rl_epochs` passes over the
  training conversations (encoder_tuning.steps is not read)."""
  mode = ("pretrain+rl" if rl_epochs else "pretrain") if pretrain_epochs else "rl"
  return with_values(cfg, {"learner": "query_encoder", "retriever": "hybrid", "mode": mode,
                           "encoder_tuning.pretrain_epochs": pretrain_epochs,
                           "encoder_tuning.pretrain_lr": ENCODER_PRETRAIN["lr"],
                           "encoder_tuning.pretrain_tau": ENCODER_PRETRAIN["tau"],
                           "encoder_tuning.pretrain_batch": ENCODER_PRETRAIN["batch"],
                           "encoder_tuning.lr": ENCODER_RL_LR[bool(pretrain_epochs)]})


def configs(argv: list[str]) -> dict:
  """Every run `main` trains with this command line, {row (retriever), seed S, fold F: its
  Config} (see published.py), the fold as the run's folds/fold (the same split of the file's
  conversations). The base retrievers' rows train nothing."""
  args = parse(argv)
  cfg = locomo_config(data=args.data)  # (the file every run reads)
  runs = {f"{label} ({retriever}), seed {seed}": reranker_config(cfg, retriever, protocol, lr,
                                                                  seed)
          for retriever in RETRIEVERS for label, protocol, lr in ROWS
          for seed in range(args.seeds)}
  runs |= {label: encoder_config(cfg, pretrain_epochs, rl_epochs)
           for label, pretrain_epochs, rl_epochs in ENCODER_ROWS}
  return {f"{label}, fold {f}": with_values(run, {"folds": args.folds, "fold": f})
          for label, run in runs.items() for f in range(args.folds)}


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--folds", type=int, default=4)
  parser.add_argument("--seeds", type=int, default=3)
  return parser.parse_args(argv)


def main() -> None:
  args = parse(sys.argv[1:])
  cfg = locomo_config(data=args.data)  # (the file every run reads)
  conversations, _ = load_locomo(Path(args.data))
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  results = {}
  for retriever in RETRIEVERS:
    replays = build_replay(conversations, "turn", retriever, encoder, cfg.k)
    for label, protocol, lr in ROWS:
      # Each seed's run (configs: the same with each fold's key), in one vmapped program.
      runs = [reranker_config(cfg, retriever, protocol, lr, s) for s in range(args.seeds)]
      run = runs[0].reranker
      spec, hp = with_model(runs[0].core_spec()), core.stack_hparams([r.hparams() for r in runs])
      start = time.time()
      res = cross_validate(replays, args.folds, spec, hp,
                           dataclasses.replace(protocol, pretrain_epochs=run.pretrain_epochs),
                           run.pretrain_lr, run.pretrain_tau)
      results[(retriever, "RAG (base retriever)")] = {"mean": float(res["base"].mean()),
                                                      "std": 0.0}  # the same for every row
      per_seed = res["heldout"].mean(1)
      results[(retriever, label)] = {"mean": float(per_seed.mean()),
                                     "std": float(per_seed.std()),
                                     "frozen": float(res["frozen"].mean())}
      print(f"{retriever:7s} {label:38s} {per_seed.mean():.3f} +- {per_seed.std():.3f} "
            f"({time.time() - start:.0f} s)", flush=True)
    if retriever == "hybrid":
      results |= encoder_rows(conversations, encoder, replays, cfg, args.folds)
  write(results, args)
  argv = ((["--data", args.data] if args.data != str(DEFAULT_DATA) else [])
          + (["--folds", str(args.folds)] if args.folds != 4 else [])
          + (["--seeds", str(args.seeds)] if args.seeds != 3 else []))
  write_record(OUT.with_suffix(".md"), "replay_ablation", argv, configs(argv))


def encoder_rows(conversations, encoder, replays, cfg, num_folds) -> dict:
  """The query encoder trained on each fold's training conversations (hybrid candidates),
  evaluated on the held-out ones by dense search and by fusion with BM25."""
  with_questions = [c for c in conversations if c.questions]
  recalls = {(r, label): [] for r in ("dense", "hybrid") for label, _, _ in ENCODER_ROWS}
  for test_idx in folds(len(replays), num_folds):
    train = [c for i, c in enumerate(replays) if i not in test_idx]
    for label, pretrain_epochs, rl_epochs in ENCODER_ROWS:
      start = time.time()
      run = encoder_config(cfg, pretrain_epochs, rl_epochs)  # (configs: with the fold's key)
      tuning, params = run.encoder_tuning, None
      if run.mode != "rl":
        spec = core.CoreSpec(dim=run.dim, k=run.k, m=run.m, batch=tuning.pretrain_batch)
        hp = core.HParams.create(lr=tuning.pretrain_lr, tau=tuning.pretrain_tau)
        params, _ = pretrain_query_encoder(encoder, train, spec, hp, tuning.pretrain_epochs)
      if run.mode != "pretrain":
        spec = core.CoreSpec(dim=run.dim, k=run.k, m=run.m, batch=run.batch)
        params, _ = train_query_encoder(encoder, train, spec, run.hparams(), rl_epochs, params)
      tuned = TunedQueryEncoder(encoder, params)
      for r in ("dense", "hybrid"):
        recalls[(r, label)] += [retrieval_recall(with_questions[i], "turn", r, encoder, tuned,
                                                 cfg.m) for i in test_idx]
      print(f"fold {test_idx} {label}: {time.time() - start:.0f} s", flush=True)
  out = {}
  for key, parts in recalls.items():
    out[key] = {"mean": float(np.concatenate(parts).mean()), "std": 0.0}
    print(f"{key[0]:7s} {key[1]:38s} {out[key]['mean']:.3f}", flush=True)
  return out


def write(results: dict, args) -> None:
  labels = (["RAG (base retriever)"] + [label for label, _, _ in ROWS]
            + [label for label, _, _ in ENCODER_ROWS])
  lines = ["# Ablation: LoCoMo turn-level evidence Recall@5 (all), held-out conversations", "",
           f"`python experiments/replay_ablation.py --folds {args.folds} --seeds {args.seeds}`",
           "", f"{args.folds}-fold cross-validation over the 8 dev conversations (folds by "
           "conversation). Held-out conversations replayed prequentially; mean +- standard "
           f"deviation over {args.seeds} seeds of the fold-averaged recall. K=20 candidates, "
           "M=5 selected, MiniLM embeddings; bm25 and hybrid rerankers carry a rank prior.", "",
           "| pipeline | " + " | ".join(RETRIEVERS) + " |",
           "|---|" + "---|" * len(RETRIEVERS)]
  for label in labels:
    cells = []
    for r in RETRIEVERS:
      v = results.get((r, label))
      if v is None:
        cells.append("n/a")
        continue
      cells.append(f"{v['mean']:.3f}" + (f" +- {v['std']:.3f}" if v["std"] else ""))
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  bm25 = results[("bm25", "RAG (base retriever)")]["mean"]
  best = max((v["mean"], r, label) for (r, label), v in results.items())
  lines += ["", "Gains over a base:"]
  for full in ("+ reranker, pretraining + online RL", ENCODER_ROWS[-1][0]):
    for r in RETRIEVERS:
      if (r, full) not in results:
        continue
      gain = results[(r, full)]["mean"] - results[(r, "RAG (base retriever)")]["mean"]
      lines.append(f"- {full} over its own base ({r}): {gain:+.3f}")
  lines.append(f"- best pipeline ({best[1]}, {best[2]}) over BM25: {best[0] - bm25:+.3f}")
  OUT.parent.mkdir(parents=True, exist_ok=True)
  write_markdown(OUT.with_suffix(".md"), lines)
  OUT.with_suffix(".json").write_text(json.dumps(
      {f"{r}|{label}": v for (r, label), v in results.items()}, indent=2) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  sys.exit(main())
