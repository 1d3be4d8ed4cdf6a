"""The cross-encoder reranker's pure model (docs/implemented.md): candidate k scores
s_k = rank_bias_k + head(pooler(h_CLS)) of "[CLS] question [SEP] memory [SEP]"."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from rmmjax.core.bert import BertConfig, BertCrossEncoder
from rmmjax.core.model import Model, rank_prior_init


class PackedPairs(struct.PyTreeNode):
  """The cross reranker's input: (question, memory) pairs "[CLS] question [SEP] memory [SEP]"
  packed into R rows of L positions, up to C pairs a row, each pair attending only to its own
  tokens, so few positions are padding (rmmjax.learners.cross.pairs.pack builds them)."""

  ids_RxL: jax.Array  # int32 token ids, 0 padding
  positions_RxL: jax.Array  # int32: each token's position within its own pair
  segments_RxL: jax.Array  # int8: 1 the question's side ([CLS], its [SEP]), 2 the memory's
  slots_RxL: jax.Array  # int8: which pair of its row a token belongs to, 1..C (0 padding)
  cls_RxC: jax.Array  # int32: where in its row each slot's pair starts (its [CLS])
  # int32: candidate (b, k)'s slot as row * C + slot - 1. A missing candidate points at slot 0
  # of row 0: its score means nothing, and the candidate mask keeps it out of every selection.
  where_BxK: jax.Array


@dataclasses.dataclass(frozen=True)
class CrossModel(Model):
  """The cross reranker as the core sees it (`CoreSpec.model`): hashable, a compile's key."""

  bert: BertConfig
  compute_dtype: str = "float32"
  head_lr_scale: float = 1.0  # the scoring layer's and the prior's learning rate, times lr

  def scores(self, params: dict, batch, spec) -> jax.Array:
    del spec  # (the candidates' count is the pairs' own)
    return cross_scores(params, batch.inputs, self.bert, self.compute_dtype, batch.positions_BxK)

  def lr_scales(self, params: dict) -> dict:
    """The scoring layer and rank prior learn at head_lr_scale times the encoder's rate, since
    a head that starts at zero passes no gradient to the encoder until it has grown."""
    scales = jax.tree.map(lambda _: 1.0, params)
    scales["rank_bias"] = self.head_lr_scale
    # The scoring layer's bias shifts every candidate's score alike, which no ranking objective
    # sees: its gradient is rounding noise, which Adam would scale up into a random walk.
    scales["encoder"]["classifier"] = {"kernel": self.head_lr_scale, "bias": 0.0}
    return scales


def init_cross_params(encoder_params: dict, k: int, prior_scale: float) -> dict:
  """From a pretrained encoder's: the head at zero, the prior -prior_scale * log(1 + position)."""
  encoder = dict(encoder_params)
  h = int(encoder["word"]["embedding"].shape[1])
  if "pooler" not in encoder:  # a checkpoint without BERT's pooler: tanh of the [CLS] state
    encoder["pooler"] = {"kernel": jnp.eye(h, dtype=jnp.float32),
                         "bias": jnp.zeros((h,), jnp.float32)}
  encoder["classifier"] = {"kernel": jnp.zeros((h, 1), jnp.float32),
                           "bias": jnp.zeros((1,), jnp.float32)}
  return {"encoder": encoder, "rank_bias": rank_prior_init(k, prior_scale)}


def cross_scores(params: dict, pairs: PackedPairs, cfg: BertConfig, dtype: str = "float32",
                 positions_BxK: jax.Array | None = None) -> jax.Array:
  """scores_BxK: the encoder's score of each packed pair plus the rank prior of the
  candidate's base position (positions_BxK; default 0..K-1, the first K of a prior trained
  for as many or more). A missing candidate's score is meaningless: the candidate mask keeps it
  out of every selection."""
  b, k = pairs.where_BxK.shape
  prior = params["rank_bias"]
  if positions_BxK is None:
    if prior.shape[0] < k:
      raise ValueError(f"{k} candidates, but the rank prior was trained for k={prior.shape[0]}")
    prior_BxK = jnp.broadcast_to(prior[:k], (b, k))
  else:
    prior_BxK = prior[positions_BxK]
  return pair_logits(params, pairs, cfg, dtype) + prior_BxK


def pair_logits(params: dict, pairs: PackedPairs, cfg: BertConfig,
                dtype: str = "float32") -> jax.Array:
  """logits_BxK: `cross_scores` without the rank prior (a pair's, wherever it stands)."""
  logits_RxC = BertCrossEncoder(cfg, dtype=dtype).apply(
      {"params": params["encoder"]}, pairs.ids_RxL, pairs.positions_RxL,
      (pairs.segments_RxL == 2).astype(jnp.int32), pairs.slots_RxL, pairs.cls_RxC)
  return logits_RxC.reshape(-1)[pairs.where_BxK]


def cross_params_template(cfg: BertConfig, k: int) -> dict:
  """Zeros in the structure of a cross reranker's parameters (what a checkpoint restores into)."""
  ids = jnp.zeros((1, 2), jnp.int32)
  shapes = jax.eval_shape(lambda: BertCrossEncoder(cfg).init(
      jax.random.PRNGKey(0), ids, ids, ids, ids, ids[:, :1]))["params"]
  encoder = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  return {"encoder": encoder, "rank_bias": jnp.zeros((k,), jnp.float32)}
