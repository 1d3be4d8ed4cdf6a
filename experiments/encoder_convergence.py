"""Convergence of query-encoder learning on LoCoMo replay: held-out Recall@5 against steps.

The locomo config's split (the last two dev conversations held out), hybrid candidates, K = 20.
Two curves: supervised listwise pretraining (batches of 16, lr 2e-5, tau 0.05), and online
REINFORCE from simulated citations starting from the untuned encoder (batches of 4, lr 1e-5
and 2e-5), each evaluated every SEGMENT steps by hybrid retrieval with the tuned query encoder
over the held-out conversations (evidence Recall@5 (all)).

    python experiments/encoder_convergence.py [--data PATH]

Writes experiments/results/encoder_convergence.md and .png, and the record of every run's
configuration beside the table (encoder_convergence.config.json, see published.py; `configs`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from published import write_record  # noqa: E402
from replay_common import DEFAULT_DATA, RESULTS, write_markdown, locomo_config  # noqa: E402
from rmmjax import core  # noqa: E402
from rmmjax.config import with_values  # noqa: E402
from rmmjax.data.locomo import load_locomo  # noqa: E402
from rmmjax.encode.cache import EmbeddingCache  # noqa: E402
from rmmjax.encode.cache import cache_path
from rmmjax.encode.encoder import SentenceEncoder  # noqa: E402
from rmmjax.replay.candidates import build_replay, to_sequence  # noqa: E402
from rmmjax.encode.tuned import TunedQueryEncoder, encoder_state
from rmmjax.learners.query_encoder.fit import (encoder_replay_steps,  # noqa: E402
                                         pretrain_query_encoder, question_tokens,
                                         retrieval_recall)

SEGMENT = 20
RL_STEPS = 300  # about one pass over the six training conversations at batch 4
RL_LRS = (1e-5, 2e-5)
PRETRAIN_EPOCHS = 2
PRETRAIN_CURVE = "supervised pretraining (batch 16, lr 2e-5)"
RL_CURVE = "online REINFORCE from the untuned encoder (batch 4, lr {:g})"


def run_configs(data: str) -> dict:
  """{curve: its run}: the locomo config's query encoder over hybrid candidates of `data`,
  pretrained alone (PRETRAIN_EPOCHS epochs), or learning online alone for RL_STEPS steps at each
  rate."""
  cfg = with_values(locomo_config(), {"data": data, "learner": "query_encoder",
                                      "retriever": "hybrid"})
  return {PRETRAIN_CURVE: with_values(cfg, {"mode": "pretrain",
                                            "encoder_tuning.pretrain_epochs": PRETRAIN_EPOCHS}),
          **{RL_CURVE.format(lr): with_values(cfg, {"mode": "rl", "encoder_tuning.lr": lr,
                                                    "encoder_tuning.steps": RL_STEPS})
             for lr in RL_LRS}}


def configs(argv: list[str]) -> dict:
  """Every run `main` trains with this command line, {curve: its Config} (see published.py)."""
  return run_configs(parse(argv).data)


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  return parser.parse_args(argv)


def main() -> None:
  args = parse(sys.argv[1:])
  runs = run_configs(args.data)
  cfg = runs[PRETRAIN_CURVE]  # (what every curve shares: the data, its split, K, M, the batch)
  conversations = [c for c in load_locomo(Path(cfg.data))[0] if c.questions]
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  replays = build_replay(conversations, "turn", "hybrid", encoder, cfg.k)
  train, test = replays[:-cfg.holdout], conversations[-cfg.holdout:]

  def heldout(params) -> float:
    tuned = None if params is None else TunedQueryEncoder(encoder, params)
    return float(np.concatenate([retrieval_recall(c, "turn", "hybrid", encoder, tuned, cfg.m)
                                 for c in test]).mean())

  base = heldout(None)
  curves = {}
  # Supervised pretraining, one epoch at a time would hide the curve: run it in segments.
  tuning = cfg.encoder_tuning
  spec16 = dataclasses.replace(cfg.core_spec(), rank_prior=False, batch=tuning.pretrain_batch)
  hp = core.HParams.create(lr=tuning.pretrain_lr, tau=tuning.pretrain_tau)
  params, steps, recalls = None, [0], [base]
  start = time.time()
  for epoch in range(tuning.pretrain_epochs):
    params, losses = pretrain_query_encoder(encoder, train, spec16, hp, 1, params)
    steps.append(steps[-1] + len(losses))
    recalls.append(heldout(params))
    print(f"pretraining epoch {epoch + 1}: held-out {recalls[-1]:.3f} "
          f"({time.time() - start:.0f} s)", flush=True)
  curves[PRETRAIN_CURVE] = (np.array(steps), np.array(recalls))
  spec4 = dataclasses.replace(cfg.core_spec(), rank_prior=False)
  seq = to_sequence(train, cfg.batch)
  ids, mask = question_tokens(encoder, train, cfg.batch)
  advance = jax.jit(functools.partial(encoder_replay_steps, encoder.module), static_argnums=4,
                    donate_argnums=0)
  for lr in RL_LRS:
    run = runs[RL_CURVE.format(lr)]
    state = encoder_state(encoder, spec4, run.hparams())
    steps, recalls = [0], [base]
    start = time.time()
    while steps[-1] < run.encoder_tuning.steps:
      state, _ = advance(state, seq, ids, mask, SEGMENT)
      steps.append(steps[-1] + SEGMENT)
      recalls.append(heldout(state.params))
    print(f"online RL lr {lr}: {recalls[0]:.3f} -> {recalls[-1]:.3f} (best {max(recalls):.3f}; "
          f"{time.time() - start:.0f} s)", flush=True)
    curves[RL_CURVE.format(lr)] = (np.array(steps), np.array(recalls))
  write(curves, base)
  argv = ["--data", args.data] if args.data != str(DEFAULT_DATA) else []
  write_record(RESULTS / "encoder_convergence.md", "encoder_convergence", argv, configs(argv))


def write(curves: dict, base: float) -> None:
  fig, ax = plt.subplots(figsize=(7, 4))
  for label, (x, y) in curves.items():
    ax.plot(x, y, marker=".", label=label)
  ax.axhline(base, color="grey", lw=0.8, ls="--", label="untuned encoder (hybrid)")
  ax.set_xlabel("update steps")
  ax.set_ylabel("held-out Recall@5 (all)")
  ax.set_title("query encoder on LoCoMo replay: conv-47, conv-48 held out", fontsize=10)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  RESULTS.mkdir(parents=True, exist_ok=True)
  fig.savefig(RESULTS / "encoder_convergence.png", dpi=110)
  lines = ["# Query-encoder convergence on LoCoMo replay", "",
           "`python experiments/encoder_convergence.py`", "",
           "Held-out conv-47 and conv-48 (the locomo config's split), hybrid retrieval with the "
           "tuned query encoder, evidence Recall@5 (all). Plot: `encoder_convergence.png`.", "",
           "| curve | start | end | best | steps |", "|---|---|---|---|---|"]
  for label, (x, y) in curves.items():
    lines.append(f"| {label} | {y[0]:.3f} | {y[-1]:.3f} | {y.max():.3f} | {x[-1]} |")
  write_markdown(RESULTS / "encoder_convergence.md", lines)
  print("\n".join(lines))


if __name__ == "__main__":
  main()
