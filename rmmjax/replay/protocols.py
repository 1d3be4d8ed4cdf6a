"""Training protocols on replayed conversations, and their cross-validation over conversations.

One fold: the reranker learns from the training conversations (pretraining, online REINFORCE,
or both) and is measured on held-out ones replayed prequentially by `heldout_replay`, the one
definition summaries, sweeps, cross-validation and `eval --online` share (docs/command-line.md,
eval --online); each conversation's id is folded into its key, so they replay in one vmap.
"""

from __future__ import annotations

import dataclasses
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core
from rmmjax.core import replay as core_replay
from rmmjax.replay.candidates import (ConversationReplay, base_recall, folds, to_questions,
                                     to_sequence, to_streams)


@dataclasses.dataclass(frozen=True)
class Protocol:
  """What a fold trains and how held-out conversations are replayed (all static)."""

  mode: str = "pretrain+rl"
  pretrain_epochs: int = 10
  online_epochs: int = 2  # passes of online REINFORCE over the training conversations
  adapt: bool = True  # keep learning online on held-out conversations (prequential)

  @property
  def pretrains(self) -> bool:
    return self.mode != "rl" and self.pretrain_epochs > 0

  @property
  def learns_online(self) -> bool:
    return self.mode != "pretrain"


def train_reranker(spec: core.CoreSpec, hparams: core.HParams, pretrain_hparams: core.HParams,
                   train_qs: core.Batch, train_seq: core.Batch, protocol: Protocol,
                   online_steps: int, batch_sharding=None,
                   params=None) -> tuple[core.TrainState, dict]:
  """Pretraining then online REINFORCE on the training conversations (pure, jittable;
  `batch_sharding` splits the pretraining batches over devices; `params` are those training
  starts from, by default the reranker's identity initialisation)."""
  state = core.init_state(spec, pretrain_hparams, params)
  logs = {}
  if protocol.pretrains:
    state, logs["pretrain_loss"] = core_replay.pretrain(state, train_qs, protocol.pretrain_epochs,
                                                        batch_sharding)
  state = core_replay.restart_optimizer(state, hparams)
  if protocol.learns_online and online_steps:
    state, logs["online"] = core_replay.replay_steps(state, train_seq, online_steps)
  return state, logs


def stream_ids(convs: list[ConversationReplay]) -> np.ndarray:
  """A stable 31-bit number per conversation, folded into its replay's key."""
  return np.array([zlib.crc32(c.conversation_id.encode()) & 0x7FFFFFFF for c in convs], np.int32)


def heldout_replay(state: core.TrainState, streams_CxSxB: core.Batch, ids_C: jax.Array,
                   adapt: bool) -> dict:
  """C held-out conversations replayed prequentially from the trained state, each with a fresh
  optimizer (pure, jittable): recall_CxSxB and scores_CxSxBxK."""
  fresh = core_replay.restart_optimizer(state, state.hparams)
  return jax.vmap(core_replay.prequential, in_axes=(None, 0, None, 0))(
      fresh, streams_CxSxB, adapt, ids_C)


def fold_program(spec: core.CoreSpec, protocol: Protocol, online_steps: int, curves=()):
  """jit(vmap over configurations) of one fold: train as `train` does, then replay the held out
  frozen (recall, scores) and, with protocol.adapt, learning online (prequential). Called with
  ((hparams, pretraining hparams), each with a leading configuration axis, and
  fold_world's inputs); `curves`: the online training metrics it returns."""

  def program(hparams, world):
    train_qs, train_seq, test_streams, test_ids = world
    state, logs = train_reranker(spec, *hparams, train_qs, train_seq, protocol, online_steps)
    frozen = heldout_replay(state, test_streams, test_ids, False)
    out = {"recall": frozen["recall_SxB"], "scores": frozen["scores_SxBxK"],
           "prequential": (heldout_replay(state, test_streams, test_ids, True)["recall_SxB"]
                           if protocol.adapt else frozen["recall_SxB"])}
    if "online" in logs:
      out["online"] = {k: logs["online"][k] for k in curves}
    if "pretrain_loss" in logs:
      out["pretrain_loss"] = logs["pretrain_loss"]
    return out

  return jax.jit(jax.vmap(program, in_axes=(0, None)))


def fold_world(convs: list[ConversationReplay], test_idx: list[int], batch: int) -> tuple:
  """A fold's inputs: its training questions and their sequence, its held-out streams."""
  train, test = split_fold(convs, test_idx)
  return to_questions(train), to_sequence(train, batch), to_streams(test, batch), stream_ids(test)


def per_question(values_NxSxB, convs: list[ConversationReplay]) -> np.ndarray:
  """Stream-shaped values of N conversations (trailing axes kept) -> one value per real
  question, concatenated."""
  values = np.asarray(values_NxSxB)
  return np.concatenate([v.reshape((-1,) + values.shape[3:])[:len(c.questions)]
                         for v, c in zip(values, convs)])


def split_fold(convs: list[ConversationReplay],
               test_idx: list[int]) -> tuple[list[ConversationReplay], list[ConversationReplay]]:
  """(training, held-out) conversations of a fold: every conversation in exactly one of them."""
  if not test_idx or len(set(test_idx)) != len(test_idx) or not set(test_idx) <= set(
      range(len(convs))):
    raise ValueError(f"held-out indices {test_idx} do not name distinct conversations of "
                     f"{len(convs)}")
  if len(test_idx) == len(convs):
    raise ValueError("a fold must leave at least one conversation to train on")
  return ([c for i, c in enumerate(convs) if i not in test_idx], [convs[i] for i in test_idx])


def run_fold(convs: list[ConversationReplay], test_idx: list[int], spec: core.CoreSpec,
             hparams: core.HParams, protocol: Protocol, pretrain_lr: float,
             pretrain_tau: float) -> dict:
  """Trains on every conversation not in test_idx; hparams has a leading configuration axis.
  Returns per configuration the held-out recall of every question: base, the reranker frozen,
  and (heldout) learning online where the protocol does, else frozen again."""
  train, test = split_fold(convs, test_idx)
  world = fold_world(convs, test_idx, spec.batch)
  online_steps = protocol.online_epochs * world[1].mask_BxK.shape[0]
  pretraining = hparams.replace(lr=jnp.full_like(hparams.lr, pretrain_lr),
                                tau=jnp.full_like(hparams.tau, pretrain_tau))
  out = fold_program(spec, protocol, online_steps)((hparams, pretraining), world)
  frozen = np.stack([per_question(v, test) for v in out["recall"]])
  return {"train": [c.conversation_id for c in train], "test": [c.conversation_id for c in test],
          "base": np.concatenate([base_recall(c, spec.m) for c in test]), "frozen": frozen,
          "heldout": (np.stack([per_question(v, test) for v in out["prequential"]])
                      if protocol.learns_online else frozen)}


def cross_validate(convs: list[ConversationReplay], num_folds: int, spec: core.CoreSpec,
                   hparams: core.HParams, protocol: Protocol, pretrain_lr: float = 1e-4,
                   pretrain_tau: float = 0.05) -> dict:
  """Every fold in turn held out. Results are pooled over questions: the held-out recall of
  every question of every fold, concatenated (a mean over them weighs each question once, not
  each fold)."""
  runs = [run_fold(convs, idx, spec, hparams, protocol, pretrain_lr, pretrain_tau)
          for idx in folds(len(convs), num_folds)]
  return {"folds": runs} | {k: np.concatenate([r[k] for r in runs], axis=-1)
                            for k in ("base", "frozen", "heldout")}
