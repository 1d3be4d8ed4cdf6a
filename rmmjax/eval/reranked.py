"""Evaluation through a trained reranker: its order over the base retriever's K candidates.

The reranked list is the K candidates by reranker score, then the base ranking beyond K. With
`online` each conversation is replayed prequentially by `heldout_replay`, the same function the
training summary's `recall_at_m_prequential` comes from: a fresh optimizer under the trained
run's hyperparameters and batch size, each batch ranked before the reranker learns from its
simulated citations.
"""

from __future__ import annotations

import jax
import numpy as np

from rmmjax import core
from rmmjax.learners.loaded import LoadedReranker
from rmmjax.learners.registry import reader
from rmmjax.replay.candidates import ConversationReplay, to_streams
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

