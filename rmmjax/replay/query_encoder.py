"""Fine-tuning the retriever itself, without a reranker: supervised pretraining on labelled
evidence and REINFORCE from citation rewards, applied to the encoder.

The same core steps as the reranker's (`core.supervised_step`, `core.train_step`), with the
encoder as the scorer: a candidate's score is the dot product of the fine-tuned query embedding
with the memory's embedding. Only the query side is tuned; the memories keep the embeddings they
were indexed with, so a bank never needs re-embedding after an update. After training,
retrieval is dense search (or its fusion with BM25) with the tuned query encoder.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core
from rmmjax.data.schema import Conversation
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


def question_tokens(encoder, convs: list[ConversationReplay], batch: int):
  """Token ids and masks of the questions in `to_sequence` layout, ids_SxBxT (absent: empty)."""
  texts = []
  for conv in convs:
    texts += list(conv.questions) + [""] * (stream_steps(conv, batch) * batch - len(conv.questions))
  ids = encoder.tokenize(texts)
  length = encoder.bucket_length(max(len(x) for x in ids))
  ids_NxT = np.zeros((len(texts), length), np.int32)
  mask_NxT = np.zeros((len(texts), length), bool)
  for i, x in enumerate(ids):
    ids_NxT[i, :len(x)] = x
    mask_NxT[i, :len(x)] = True
  shape = (-1, batch, length)
  return ids_NxT.reshape(shape), mask_NxT.reshape(shape)


def _encoder_state(encoder, spec: core.CoreSpec, hparams: core.HParams, params):
  params = encoder.params if params is None else params
  state = core.init_state(spec, hparams)
  return state.replace(params=params, opt_state=core.adam_init(params))


def pretrain_query_encoder(encoder, convs: list[ConversationReplay], spec: core.CoreSpec,
                           hparams: core.HParams, epochs: int,
                           params=None) -> tuple[dict, np.ndarray]:
  """Supervised listwise fine-tuning of the query encoder on labelled evidence: `epochs` passes
  over batches of spec.batch consecutive questions, the batches in a new order each pass."""
  stream_SxB = to_sequence(convs, spec.batch)
  ids_SxBxT, mask_SxBxT = question_tokens(encoder, convs, spec.batch)
  state = _encoder_state(encoder, spec, hparams, params)

  def body(state, xs):
    batch, ids_BxT, mask_BxT = xs
    return core.supervised_step(state, batch, encoder_scorer(encoder.module, ids_BxT, mask_BxT))

  run = jax.jit(lambda s, xs: jax.lax.scan(body, s, xs))
  rng = np.random.default_rng(int(hparams.seed))
  losses = []
  for _ in range(epochs):
    order = rng.permutation(stream_SxB.mask_BxK.shape[0])
    shuffled = jax.tree.map(lambda x, o=order: x[o], stream_SxB)
    state, metrics = run(state, (shuffled, ids_SxBxT[order], mask_SxBxT[order]))
    losses.append(np.asarray(metrics["loss"]))
  return state.params, np.concatenate(losses)


def train_query_encoder(encoder, convs: list[ConversationReplay], spec: core.CoreSpec,
                        hparams: core.HParams, epochs: int, params=None) -> tuple[dict, dict]:
  """Online REINFORCE of the query encoder over the conversations' question stream, starting
  from `params` (the loaded encoder's by default)."""
  stream_SxB = to_sequence(convs, spec.batch)
  ids_SxBxT, mask_SxBxT = question_tokens(encoder, convs, spec.batch)
  state = _encoder_state(encoder, spec, hparams, params)
  key = jax.random.fold_in(state.key, 4)

  def body(state, xs):
    batch, ids_BxT, mask_BxT = xs
    return core.train_step(state, batch, key, encoder_scorer(encoder.module, ids_BxT, mask_BxT))

  tile = lambda x: jnp.concatenate([jnp.asarray(x)] * epochs)  # noqa: E731
  xs = (jax.tree.map(tile, stream_SxB), tile(ids_SxBxT), tile(mask_SxBxT))
  state, metrics = jax.jit(lambda s, xs: jax.lax.scan(body, s, xs))(state, xs)
  return state.params, jax.device_get(metrics)


class TunedQueryEncoder:
  """The encoder with fine-tuned parameters, for queries (`DenseRetriever(query_encoder=...)`)."""

  def __init__(self, encoder, params):
    self.encoder, self.params, self.dim = encoder, params, encoder.dim

  def encode(self, texts: list[str]) -> np.ndarray:
    return self.encoder.encode(texts, params=self.params)


def retrieval_recall(conversation: Conversation, units: str, retriever: str, encoder,
                     query_encoder=None, m: int = 5) -> np.ndarray:
  """Recall@m (all) of each question of a conversation, retrieving with `retriever` over its
  units; dense scores use `query_encoder` for the questions when given."""
  pool = build_units(conversation, units)
  ranker = make_retriever(retriever, [u.text for u in pool], encoder, query_encoder)
  top_NxM = ranker.rank([q.question for q in conversation.questions], m)
  recall = []
  for question, top in zip(conversation.questions, top_NxM):
    evidence = set(question.evidence)
    found = evidence.intersection(t for i in top for t in pool[i].turn_ids)
    recall.append(len(found) / len(evidence))
  return np.array(recall)
