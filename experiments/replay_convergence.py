"""Convergence of online REINFORCE on replayed LoCoMo conversations, over seeds.

Trains on six dev conversations (the last two are held out, as in `train --config locomo`) for
four passes of their question stream, from scratch (online RL alone, two learning rates) and
after pretraining; five seeds in one vmapped program. Every SEGMENT replay steps it records the
citation rate of the sampled selections over those steps and the Recall@5 (all) of the reranker
as it stands on the held-out conversations' questions.

    python experiments/replay_convergence.py [--data PATH] [--seeds 5] [--epochs 4]

Writes experiments/results/replay_convergence.md and .png.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from replay_common import (DEFAULT_DATA, RESULTS, locomo_config, locomo_replays,  # noqa: E402
                           seed_hparams, write_markdown)
from rmmjax.core import replay as core_replay  # noqa: E402
from rmmjax.replay.protocols import Protocol, train_reranker  # noqa: E402
from rmmjax.replay.candidates import (base_recall, to_questions, to_sequence,  # noqa: E402
                                     to_streams)

RUNS = [("online RL, lr 1e-4", "rl", 1e-4), ("online RL, lr 1e-3 (paper)", "rl", 1e-3),
        ("pretraining + online RL, lr 1e-4", "pretrain+rl", 1e-4)]
SEGMENT = 25  # replay steps between measurements


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--data", default=str(DEFAULT_DATA))
  parser.add_argument("--seeds", type=int, default=5)
  parser.add_argument("--epochs", type=int, default=4)
  args = parser.parse_args()
  cfg = locomo_config(tau=0.5)  # the temperature it was measured at
  replays = locomo_replays(args.data, "bm25", cfg.k)  # the reranker's BM25 candidates
  spec = cfg.core_spec()
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
    state, _ = train_reranker(spec, hparams, pre, questions, train_seq, Protocol(mode=mode), 0)

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
    hp = seed_hparams(cfg, args.seeds, lr=lr)
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
  print("\n".join(lines))


if __name__ == "__main__":
  main()
