"""Evaluation through a trained reranker: the K candidates by its score, then the base ranking
beyond K. `online` replays each conversation by `heldout_replay`, the function the training
summary's `recall_at_m_prequential` comes from (docs/command-line.md, eval --online)."""

from __future__ import annotations

import jax
import numpy as np

from rmmjax import core
from rmmjax.core import replay as core_replay
from rmmjax.learners.loaded import LoadedReranker
from rmmjax.learners.registry import reader
from rmmjax.replay.candidates import ConversationReplay, stream_steps, to_streams
from rmmjax.replay.protocols import heldout_replay, stream_ids


def reranked_orders(replays: list[ConversationReplay], reranker: LoadedReranker,
                    online: bool, encoder=None) -> list[np.ndarray]:
  """Per conversation, the reranked unit order of every question, order_NxR. A cross reranker
  reads each question with its candidates' texts, cut by `encoder`'s tokenizer (the one it
  trained with: refused otherwise)."""
  spec = reranker.spec
  read = reader(reranker, encoder)
  inputs = read.replay_inputs(replays, spec, online)
  state = core.init_state(spec, reranker.hparams, reranker.params)
  if getattr(read, "batchwise", False) and not online:
    scores = _batchwise_scores(state.params, replays, inputs, read, spec)
  else:
    # (The embedding rerankers compile as their training did, so eval --online repeats it.)
    replay = jax.jit(heldout_replay, static_argnums=3, compiler_options=read.compiler_options())
    streams = read.pack_streams(to_streams(replays, spec.batch, inputs=inputs))
    out = replay(state, streams, stream_ids(replays), online)
    scores = np.asarray(out["scores_SxBxK"])
  orders = []
  for conv, scores_SxBxK in zip(replays, scores):
    n, k = conv.mask_NxK.shape
    scores_NxK = np.where(conv.mask_NxK, scores_SxBxK.reshape(-1, k)[:n], -np.inf)
    ranked = np.take_along_axis(conv.order_NxR[:, :k], np.argsort(-scores_NxK, 1,
                                                                  kind="stable"), 1)
    orders.append(np.concatenate([ranked, conv.order_NxR[:, k:]], 1))
  return orders


def _batchwise_scores(params, replays, inputs, read, spec) -> list[np.ndarray]:
  """Each conversation's scores_SxBxK from its own batches, each packed to its own few rows:
  a replay's streams are evened to the longest conversation and every batch to the fullest
  one's rows, all of which a cross reranker would compute. The same scores, batch by batch, as
  the training run's own held-out evaluation takes them."""
  score = jax.jit(core_replay.rerank_recall, static_argnums=2,
                  compiler_options=read.compiler_options())
  params = jax.device_put(params)  # (once, not at every batch)
  # One set of streams: every batch has the evidence width of all of them (one compile per
  # row count, not per conversation), and each conversation's own steps are scored.
  streams = to_streams(replays, spec.batch, inputs=inputs)
  out = []
  for c, conv in enumerate(replays):
    scores = [score(params, read.pack_many(jax.tree.map(lambda x, s=s: np.asarray(x)[c, s],
                                                          streams)), spec)[1]
              for s in range(stream_steps(conv, spec.batch))]
    out.append(np.stack(jax.device_get(scores)) if scores else
               np.zeros((0, spec.batch, spec.k), np.float32))
  return out
