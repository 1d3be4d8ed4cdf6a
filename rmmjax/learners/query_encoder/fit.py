"""Fine-tuning the retriever's query encoder by the reranker's core steps (`core.supervised_step`,
`core.train_step`), the encoder as the scorer: a candidate scores its memory's embedding dot the
tuned query's."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core, distributed
from rmmjax.core import replay as core_replay
from rmmjax.fit import Fit, Online, fit
from rmmjax.data.schema import Conversation
from rmmjax.encode.tuned import TunedQueryEncoder, encoder_state
from rmmjax.replay.candidates import ConversationReplay, stream_steps, to_sequence
from rmmjax.retrieve.rankers import make_retriever
from rmmjax.retrieve.units import build_units


def encoder_scorer(module, ids_BxT: jax.Array, mask_BxT: jax.Array):
  """scorer(params, batch) -> (scores_BxK, pullback) with the encoder's parameters."""

  def scorer(params, batch: core.Batch):
    def scores(p):
      q_BxD = module.apply({"params": p}, ids_BxT, mask_BxT)
      return jnp.einsum("bkd,bd->bk", batch.mem_BxKxD, q_BxD)

    scores_BxK, vjp = jax.vjp(scores, params)
    return scores_BxK, lambda g_BxK: vjp(g_BxK)[0]

  return scorer


def pad_tokens(encoder, texts: Sequence[str], max_tokens: int | None = None):
  """Token ids and masks of the texts (each cut to max_tokens), ids_NxT padded to one bucket."""
  ids = [x[:max_tokens] for x in encoder.tokenize(list(texts))]
  length = encoder.bucket_length(max(len(x) for x in ids))
  ids_NxT = np.zeros((len(ids), length), np.int32)
  mask_NxT = np.zeros((len(ids), length), bool)
  for i, x in enumerate(ids):
    ids_NxT[i, :len(x)], mask_NxT[i, :len(x)] = x, True
  return ids_NxT, mask_NxT


def question_tokens(encoder, convs: list[ConversationReplay], batch: int):
  """Token ids and masks of the questions in `to_sequence` layout, ids_SxBxT (absent: empty)."""
  texts = []
  for conv in convs:
    texts += list(conv.questions) + [""] * (stream_steps(conv, batch) * batch - len(conv.questions))
  ids_NxT, mask_NxT = pad_tokens(encoder, texts)
  shape = (-1, batch, ids_NxT.shape[1])
  return ids_NxT.reshape(shape), mask_NxT.reshape(shape)


PRETRAIN_CHUNK = 16  # batches per compiled scan of the query encoder's pretraining


def pretrain_query_encoder(encoder, convs: list[ConversationReplay], spec: core.CoreSpec,
                           hparams: core.HParams, epochs: int, params=None,
                           mesh=None, progress: bool = False) -> tuple[dict, np.ndarray]:
  """Listwise fine-tuning of the query encoder on labelled evidence, each epoch's batches of
  consecutive questions in a new order, in scans of PRETRAIN_CHUNK batches."""
  stream_SxB = jax.tree.map(np.asarray, to_sequence(convs, spec.batch))
  ids_SxBxT, mask_SxBxT = (np.asarray(x) for x in question_tokens(encoder, convs, spec.batch))
  state = encoder_state(encoder, spec, hparams, params)
  rng = np.random.default_rng(int(hparams.seed))

  def epoch_batches(epoch: int) -> list:
    return [(jax.tree.map(lambda x: x[i], stream_SxB), ids_SxBxT[i], mask_SxBxT[i])  # noqa: B023
            for i in rng.permutation(stream_SxB.mask_BxK.shape[0])]

  def step(state, xs):  # one listwise update on a batch of labelled questions
    batch, ids_BxT, mask_BxT = xs
    return core.supervised_step(state, batch, encoder_scorer(encoder.module, ids_BxT, mask_BxT))

  state, losses = fit(state, step, epoch_batches,
                      Fit(epochs, chunk=PRETRAIN_CHUNK, desc="query encoder"), mesh, progress)
  parallel = mesh is not None and mesh.devices.size > 1
  return (distributed.gather(state.params) if parallel else state.params), losses


def online_step(module) -> Callable:
  """step(state, (batch, ids_BxT, mask_BxT)) -> (state, metrics): one REINFORCE update."""

  def step(state, xs):
    batch, ids_BxT, mask_BxT = xs
    return core.train_step(state, batch, jax.random.fold_in(state.key, 4),
                           encoder_scorer(module, ids_BxT, mask_BxT))

  return step


def encoder_replay_steps(module, state: core.TrainState, stream_SxB: core.Batch,
                         ids_SxBxT: jax.Array, mask_SxBxT: jax.Array,
                         num_steps: int) -> tuple[core.TrainState, dict]:
  """num_steps `online_step`s, step t on stream step t (modulo its length), as segments can."""
  return core_replay.stream_steps(online_step(module), state,
                                  (stream_SxB, ids_SxBxT, mask_SxBxT), num_steps)


def train_query_encoder(encoder, convs: list[ConversationReplay], spec: core.CoreSpec,
                        hparams: core.HParams, epochs: int, params=None) -> tuple[dict, dict]:
  """`epochs` passes of online REINFORCE over the questions, from `params` (default: loaded)."""
  stream_SxB = to_sequence(convs, spec.batch)
  ids_SxBxT, mask_SxBxT = question_tokens(encoder, convs, spec.batch)
  state = encoder_state(encoder, spec, hparams, params)
  state, metrics = Online(online_step(encoder.module)).run(
      state, (stream_SxB, ids_SxBxT, mask_SxBxT), epochs * stream_SxB.mask_BxK.shape[0])
  return state.params, metrics


def retrieval_encoders(encoder, tuned: "TunedQueryEncoder | None", tune: str) -> tuple:
  """(memory encoder, query encoder) for retrieval: tune=both embeds the memories too."""
  if tuned is None:
    return encoder, None
  return (tuned, None) if tune == "both" else (encoder, tuned)


def retrieval_recall(conversation: Conversation, units: str, retriever: str, encoder,
                     query_encoder=None, m: int = 5,
                     unit_builder: Callable = build_units) -> np.ndarray:
  """Recall@m (all) of each question of a conversation, retrieving over its units."""
  pool = unit_builder(conversation, units)
  ranker = make_retriever(retriever, [u.text for u in pool], encoder, query_encoder)
  top_NxM = ranker.rank([q.question for q in conversation.questions], m)
  return np.array([len(set(q.evidence).intersection(t for i in top for t in pool[i].turn_ids))
                   / len(set(q.evidence)) for q, top in zip(conversation.questions, top_NxM)])


def encoder_spec(cfg) -> core.CoreSpec:
  """The core spec of query-encoder learning: scores are plain dot products (no rank prior)."""
  return dataclasses.replace(cfg.core_spec(), rank_prior=False)
