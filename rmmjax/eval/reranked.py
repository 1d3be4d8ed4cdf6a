"""Evaluation through a trained reranker: its order over the base retriever's K candidates.

The reranked list is the K candidates by reranker score, then the base ranking beyond K. With
`online` the conversation is replayed prequentially: every batch of questions is ranked by the
reranker as it stands, then the reranker learns from that batch's simulated citations.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file

from rmmjax import core
from rmmjax.core import replay as core_replay
from rmmjax.io.export import load_trained_params
from rmmjax.replay.candidates import ConversationReplay, to_streams


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


def load_reranker(path: Path) -> dict:
  """A trained reranker from a training workdir or an exported .safetensors file.

  Returns params, spec, hparams (for online learning), and the conversations it never trained
  on when the workdir says (None for an exported file).
  """
  path = Path(path)
  if path.is_dir():
    params, cfg, _ = load_trained_params(path)
    return {"params": params, "spec": cfg.core_spec(), "hparams": cfg.hparams(),
            "holdout": cfg.holdout if cfg.config != "latent" else None, "data": cfg.data,
            "encoder": cfg.encoder}
  if path.suffix != ".safetensors" or not path.exists():
    raise FileNotFoundError(f"--reranker {path}: expected a training workdir or an exported "
                            ".safetensors file (with its .json beside it)")
  meta_path = path.with_suffix(".json")
  if not meta_path.exists():
    raise FileNotFoundError(f"{meta_path} not found: `rmmjax export` writes it beside {path}")
  meta = json.loads(meta_path.read_text())
  params = _nest(load_file(str(path)))
  spec = core.CoreSpec(variant=meta["variant"], dim=int(meta["dim"]), k=int(meta["k"]),
                       m=int(meta["m"]), hidden=int(meta.get("hidden") or 256),
                       rank_prior="rank_bias" in params)
  online = meta.get("online", {})
  hparams = core.HParams.create(tau=meta["tau"], **online)
  return {"params": params, "spec": spec, "hparams": hparams, "holdout": None, "data": None,
          "encoder": meta.get("encoder")}


def reranked_orders(replays: list[ConversationReplay], reranker: dict, online: bool,
                    batch: int = 4) -> list[np.ndarray]:
  """Per conversation, the reranked unit order of every question, order_NxR."""
  spec, params = reranker["spec"], reranker["params"]
  for conv in replays:
    if conv.q_NxD.shape[1] != spec.dim:
      raise ValueError(f"the reranker works in {spec.dim} dimensions, the encoder gives "
                       f"{conv.q_NxD.shape[1]}")
  spec = dataclasses.replace(spec, batch=batch)
  state = core.init_state(spec, reranker["hparams"]).replace(params=params)
  replay = jax.jit(jax.vmap(core_replay.prequential, in_axes=(None, 0, None)), static_argnums=2)
  scores = np.asarray(replay(state, to_streams(replays, batch), online)["scores_SxBxK"])
  orders = []
  for conv, scores_SxBxK in zip(replays, scores):
    n, k = conv.mask_NxK.shape
    scores_NxK = np.where(conv.mask_NxK, scores_SxBxK.reshape(-1, k)[:n], -np.inf)
    ranked = np.take_along_axis(conv.order_NxR[:, :k], np.argsort(-scores_NxK, 1,
                                                                  kind="stable"), 1)
    orders.append(np.concatenate([ranked, conv.order_NxR[:, k:]], 1))
  return orders
