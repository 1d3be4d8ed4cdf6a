"""Evaluation through a trained reranker: its order over the base retriever's K candidates.

The reranked list is the K candidates by reranker score, then the base ranking beyond K. With
`online` each conversation is replayed prequentially by `heldout_replay`, the same function the
training summary's `recall_at_m_prequential` comes from: a fresh optimizer under the trained
run's hyperparameters and batch size, each batch ranked before the reranker learns from its
simulated citations.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core
from rmmjax.io.export import load_trained_params, read_record
from rmmjax.io.reranker_format import read_reranker
from rmmjax.io.workdir import read_config
from rmmjax.replay.candidates import ConversationReplay, to_streams
from rmmjax.replay.protocols import heldout_replay, stream_ids


@dataclasses.dataclass(frozen=True)
class LoadedReranker:
  """A trained reranker with its hyperparameters and the record of what it was trained on."""

  source: str  # the workdir or file it came from
  params: dict
  spec: core.CoreSpec
  hparams: core.HParams
  record: dict


def _nest(flat: dict[str, np.ndarray]) -> dict:
  """{"q_mlp/w1": x} -> {"q_mlp": {"w1": x}} (the inverse of export.flatten_params)."""
  out: dict = {}
  for name, value in flat.items():
    *parents, leaf = name.split("/")
    node = out
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = jnp.asarray(value)
  return out


def load_reranker(path: Path) -> LoadedReranker:
  """A trained reranker from a training workdir or an exported .safetensors file."""
  path = Path(path)
  if path.is_dir():
    if read_config(path).learner == "query_encoder":
      raise ValueError(f"--reranker {path} is a query-encoder workdir (learner=query_encoder); "
                       "pass it as --encoder")
    record = read_record(path)
    params, cfg, _ = load_trained_params(path)
    return LoadedReranker(str(path), params, cfg.core_spec(), cfg.hparams(), record)
  if path.suffix != ".safetensors":
    raise ValueError(f"--reranker {path}: expected a training workdir or an exported "
                     ".safetensors file")
  weights, meta = read_reranker(path)
  spec = core.CoreSpec(variant=meta["variant"], dim=int(meta["dim"]), k=int(meta["k"]),
                       m=int(meta["m"]), batch=int(meta["batch"]),
                       hidden=int(meta.get("hidden") or 256), rank_prior=bool(meta["rank_prior"]))
  return LoadedReranker(str(path), _nest(weights), spec, core.HParams.create(**meta["hparams"]),
                        meta["record"])


def reranked_orders(replays: list[ConversationReplay], reranker: LoadedReranker,
                    online: bool) -> list[np.ndarray]:
  """Per conversation, the reranked unit order of every question, order_NxR."""
  spec = reranker.spec
  for conv in replays:
    if conv.q_NxD.shape[1] != spec.dim:
      raise ValueError(f"the reranker works in {spec.dim} dimensions, the encoder gives "
                       f"{conv.q_NxD.shape[1]}")
  state = core.init_state(spec, reranker.hparams).replace(params=reranker.params)
  replay = jax.jit(heldout_replay, static_argnums=3)
  out = replay(state, to_streams(replays, spec.batch), stream_ids(replays), online)
  scores = np.asarray(out["scores_SxBxK"])
  orders = []
  for conv, scores_SxBxK in zip(replays, scores):
    n, k = conv.mask_NxK.shape
    scores_NxK = np.where(conv.mask_NxK, scores_SxBxK.reshape(-1, k)[:n], -np.inf)
    ranked = np.take_along_axis(conv.order_NxR[:, :k], np.argsort(-scores_NxK, 1,
                                                                  kind="stable"), 1)
    orders.append(np.concatenate([ranked, conv.order_NxR[:, k:]], 1))
  return orders
