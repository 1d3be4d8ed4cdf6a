"""Convergence of online REINFORCE on replayed LoCoMo conversations, over seeds.

Trains on six dev conversations (the last two are held out, as in `train --config locomo`) for
four passes of their question stream, from scratch (online RL alone, two learning rates) and
after pretraining; five seeds in one vmapped program. Every SEGMENT replay steps it records the
citation rate of the sampled selections over those steps and the Recall@5 (all) of the reranker
as it stands on the held-out conversations' questions.

    python experiments/replay_convergence.py [--data PATH] [--seeds 5] [--epochs 4]

Writes experiments/results/replay_convergence.md and .png, and the record of every run's
configuration beside the table (replay_convergence.config.json, see published.py; `configs`).
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from published import write_record  # noqa: E402
from replay_common import (DEFAULT_DATA, RESULTS, locomo_config, locomo_replays,  # noqa: E402
                           write_markdown)
from rmmjax import core  # noqa: E402
from rmmjax.config import with_values  # noqa: E402
from rmmjax.core import replay as core_replay  # noqa: E402
from rmmjax.learners.registry import with_model  # noqa: E402
from rmmjax.replay.protocols import Protocol, train_reranker  # noqa: E402
from rmmjax.replay.candidates import (base_recall, to_questions, to_sequence,  # noqa: E402
                                     to_streams)

RUNS = [("online RL, lr 1e-4", "rl", 1e-4), ("online RL, lr 1e-3 (paper)", "rl", 1e-3),
        ("pretraining + online RL, lr 1e-4", "pretrain+rl", 1e-4)]
SEGMENT = 25  # replay steps between measurements


def base_config(data: str):
  """What every run shares: the locomo config's reranker at the temperature it was measured at,
  over BM25's candidates of `data`, its split (the last `holdout` conversations held out)."""
  return with_values(locomo_config(tau=0.5), {"data": data, "learner": "linear",
                                              "retriever": "bm25"})


def run_config(data: str, mode: str, lr: float, seed: int):
  """A run of RUNS at `seed`. Its online phase is --epochs passes over the training
  conversations (reranker.steps is not read)."""
  return with_values(base_config(data), {"mode": mode, "lr": lr, "seed": seed})


def configs(argv: list[str]) -> dict:
  """Every run `main` trains with this command line, {run, seed S: its Config} (see
  published.py)."""
  args = parse(argv)
  return {f"{label}, seed {seed}": run_config(args.data, mode, lr, seed)
          for label, mode, lr in RUNS for seed in range(args.seeds)}


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--seeds", type=int, default=5)
  parser.add_argument("--epochs", type=int, default=4)
  return parser.parse_args(argv)


def main() -> None:
  args = parse(sys.argv[1:])
  cfg = base_config(args.data)
  replays = locomo_replays(cfg.data, cfg.retriever, cfg.k)  # the reranker's BM25 candidates
  spec = with_model(cfg.core_spec())
  train, test = replays[:-cfg.holdout], replays[-cfg.holdout:]
  train_seq, test_streams = to_sequence(train, cfg.batch), to_streams(test, cfg.batch)
  questions = to_questions(train)
  steps = args.epochs * train_seq.mask_BxK.shape[0]
  segments = steps // SEGMENT
  n_test = [len(c.questions) for c in test]
  base = float(np.concatenate([base_recall(c, cfg.m) for c in test]).mean())

  def heldout(state):
    recall = jax.vmap(core_replay.prequential, in_axes=(None, 0, None))(
        state, test_streams, False)["recall_SxB"]
    return jnp.sum(recall) / sum(n_test)  # absent questions score 0

  def run(hparams, mode):
    pre = hparams.replace(lr=jnp.float32(cfg.reranker.pretrain_lr),
                        tau=jnp.float32(cfg.reranker.pretrain_tau))
    protocol = Protocol(mode=mode, pretrain_epochs=cfg.reranker.pretrain_epochs)
    state, _ = train_reranker(spec, hparams, pre, questions, train_seq, protocol, 0)

    def segment(state, _):
      state, metrics = core_replay.replay_steps(state, train_seq, SEGMENT)
      return state, (jnp.mean(metrics["citation_rate"]), heldout(state))

    first = heldout(state)
    _, (cite, recall) = jax.lax.scan(segment, state, None, length=segments)
    return first, cite, recall

  fig, axes = plt.subplots(1, 2, figsize=(11, 4))
  x = (np.arange(segments) + 1) * SEGMENT
  lines = ["# Convergence of online REINFORCE on LoCoMo replay", "",
           f"`python experiments/replay_convergence.py --seeds {args.seeds} --epochs "
           f"{args.epochs}`", "",
           f"Training stream: {len(train)} dev conversations in batches of {cfg.batch} questions, "
           f"{args.epochs} passes ({steps} replay steps); BM25 top-{cfg.k} candidates, M = "
           f"{cfg.m}, tau {cfg.reranker.tau}, running-mean baseline. Held out: "
           f"{', '.join(c.conversation_id for c in test)} ({sum(n_test)} questions; BM25 base "
           f"order {base:.3f}). Mean +- std over {args.seeds} seeds.", "",
           "| run | citation rate, first segment | last segment | held-out Recall@5 at the "
           "start of online RL | after the first segment | at the end |",
           "|---|---|---|---|---|---|"]
  for label, mode, lr in RUNS:
    # Each seed's run (configs), in one vmapped program: they differ in lr and seed alone.
    hp = core.stack_hparams([run_config(args.data, mode, lr, s).hparams()
                             for s in range(args.seeds)])
    first, cite, recall = jax.device_get(
        jax.jit(jax.vmap(run, in_axes=(0, None)), static_argnums=1)(hp, mode))
    for ax, values in zip(axes, (cite, recall)):
      ax.plot(x, values.mean(0), label=label)
      ax.fill_between(x, values.mean(0) - values.std(0), values.mean(0) + values.std(0),
                      alpha=0.25)
    cell = lambda v: f"{v.mean():.3f} +- {v.std():.3f}"  # noqa: E731
    lines.append(f"| {label} | {cell(cite[:, 0])} | {cell(cite[:, -1])} | {cell(first)} | "
                 f"{cell(recall[:, 0])} | {cell(recall[:, -1])} |")
    print(lines[-1], flush=True)
  axes[1].axhline(base, color="gray", linestyle="--", label="BM25 base order")
  for ax, title in zip(axes, ("citation rate of the sampled selections (training stream)",
                              "Recall@5 (all) on the held-out conversations")):
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("replay step")
    ax.grid(alpha=0.3)
  axes[1].legend(fontsize=8)
  fig.tight_layout()
  RESULTS.mkdir(parents=True, exist_ok=True)
  fig.savefig(RESULTS / "replay_convergence.png", dpi=110)
  lines += ["", "![curves](replay_convergence.png)"]
  write_markdown(RESULTS / "replay_convergence.md", lines)
  argv = ((["--data", args.data] if args.data != str(DEFAULT_DATA) else [])
          + (["--seeds", str(args.seeds)] if args.seeds != 5 else [])
          + (["--epochs", str(args.epochs)] if args.epochs != 4 else []))
  write_record(RESULTS / "replay_convergence.md", "replay_convergence", argv, configs(argv))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
