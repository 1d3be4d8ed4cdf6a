"""REINFORCE on the retriever itself: no reranker, the citation rewards fine-tune the encoder.

The same core step as the reranker's (`core.train_step`), with the encoder as the scorer: the
candidates' scores are the dot products of the fine-tuned query embedding with the memories'
embeddings. Only the query side is tuned; the memories keep the embeddings they were indexed
with, so a bank never needs re-embedding after an update. After training, retrieval is plain
dense search with the tuned query encoder.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core
from rmmjax.replay_data import ConversationReplay, stream_steps, to_sequence


def encoder_scorer(module, ids_BxT: jax.Array, mask_BxT: jax.Array):
  """scorer(params, batch) -> (scores_BxK, pullback) with the encoder's parameters."""

  def scorer(params, batch: core.Batch):
    def scores(p):
      q_BxD = module.apply({"params": p}, ids_BxT, mask_BxT)
      return jnp.einsum("bkd,bd->bk", batch.mem_BxKxD, q_BxD)

    scores_BxK, vjp = jax.vjp(scores, params)
    return scores_BxK, lambda g_BxK: vjp(g_BxK)[0]

  return scorer


def question_tokens(encoder, convs: list[ConversationReplay], batch: int):
  """Token ids and masks of the questions in `to_sequence` layout, ids_SxBxT (absent: empty)."""
  texts = []
  for conv in convs:
    texts += list(conv.questions) + [""] * (stream_steps(conv, batch) * batch - len(conv.questions))
  ids = encoder.tokenize(texts)
  length = encoder._bucket(max(len(x) for x in ids))
  ids_NxT = np.zeros((len(texts), length), np.int32)
  mask_NxT = np.zeros((len(texts), length), bool)
  for i, x in enumerate(ids):
    ids_NxT[i, :len(x)] = x
    mask_NxT[i, :len(x)] = True
  shape = (-1, batch, length)
  return ids_NxT.reshape(shape), mask_NxT.reshape(shape)


def train_query_encoder(encoder, convs: list[ConversationReplay], spec: core.CoreSpec,
                        hparams: core.HParams, epochs: int) -> tuple[dict, dict]:
  """Online REINFORCE of the query encoder over the conversations' question stream."""
  stream_SxB = to_sequence(convs, spec.batch)
  ids_SxBxT, mask_SxBxT = question_tokens(encoder, convs, spec.batch)
  state = core.init_state(spec, hparams)
  state = state.replace(params=encoder.params, opt_state=core.adam_init(encoder.params))
  key = jax.random.fold_in(state.key, 4)

  def body(state, xs):
    batch, ids_BxT, mask_BxT = xs
    return core.train_step(state, batch, key, encoder_scorer(encoder.module, ids_BxT, mask_BxT))

  tile = lambda x: jnp.concatenate([jnp.asarray(x)] * epochs)  # noqa: E731
  xs = (jax.tree.map(tile, stream_SxB), tile(ids_SxBxT), tile(mask_SxBxT))
  state, metrics = jax.jit(lambda s, xs: jax.lax.scan(body, s, xs))(state, xs)
  return state.params, jax.device_get(metrics)


def dense_recall(encoder, params, conv: ConversationReplay, m: int) -> np.ndarray:
  """Recall of each question's top-m units by dense search with the given query encoder."""
  q_NxD = encoder.encode(list(conv.questions), params=params)
  top_NxM = np.argsort(-(q_NxD @ conv.unit_emb_UxD.T), 1, kind="stable")[:, :m]
  hits = np.take_along_axis(conv.unit_relevant_NxU, top_NxM, 1).sum(1)
  return hits / np.maximum(conv.num_relevant_N, 1)
