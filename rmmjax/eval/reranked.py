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
from rmmjax.encode.encoder import compiler_options
from rmmjax.io.reranker_load import LoadedReranker, check_cross_encoder
from rmmjax.replay.candidates import ConversationReplay, to_streams
from rmmjax.replay.cross_pairs import pack_streams, replay_pairs, step_bytes
from rmmjax.replay.protocols import heldout_replay, stream_ids


def reranked_orders(replays: list[ConversationReplay], reranker: LoadedReranker,
                    online: bool, encoder=None) -> list[np.ndarray]:
  """Per conversation, the reranked unit order of every question, order_NxR. A cross reranker
  reads each question with its candidates' texts, cut by `encoder`'s tokenizer (the one it
  trained with: refused otherwise)."""
  spec = reranker.spec
  pairs = None
  if spec.variant == "cross":
    check_cross_encoder(reranker, encoder)
    max_length = reranker.record["cross"]["max_length"]
    if online:  # each question's batch then takes a learning step: refused if one cannot fit
      need, limit = step_bytes(spec.bert, spec.k, spec.batch, spec.k, max_length,
                               spec.compute_dtype)
      if limit is not None and need > 0.9 * limit:
        raise ValueError(f"--online replays {reranker.source}'s learning steps (batches of "
                         f"{spec.batch} questions x {spec.k} candidates of up to {max_length} "
                         f"tokens), and one needs {need / 2**30:.1f} GiB where the device holds "
                         f"{limit / 2**30:.1f} GiB: evaluate without --online, or on a larger "
                         "device")
    pairs = replay_pairs(encoder.tokenizer, replays, max_length)
  else:
    for conv in replays:
      if conv.q_NxD.shape[1] != spec.dim:
        raise ValueError(f"the reranker works in {spec.dim} dimensions, the encoder gives "
                         f"{conv.q_NxD.shape[1]}")
  state = core.init_state(spec, reranker.hparams, reranker.params)
  # (The embedding rerankers compile as their training did, so eval --online repeats it.)
  replay = jax.jit(heldout_replay, static_argnums=3,
                   compiler_options=compiler_options() if pairs is not None else None)
  streams = to_streams(replays, spec.batch, pairs=pairs)
  if pairs is not None:  # the cross reranker reads them packed
    streams = pack_streams(streams)
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

