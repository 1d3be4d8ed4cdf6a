"""A BERT-family encoder as pure Flax modules: the sentence encoder (mean pooling over tokens,
then L2 normalisation) and the cross-encoder (the [CLS] state of a pair through BERT's pooler and
a scoring layer). Both build the same embeddings and layers under the same names, so one set of
pretrained weights (the packaged MiniLM's) starts either; loading those weights from a file is
the shell's (`rmmjax.encode.bert`).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class BertConfig:
  vocab_size: int
  hidden_size: int
  num_hidden_layers: int
  num_attention_heads: int
  intermediate_size: int
  max_position_embeddings: int
  type_vocab_size: int
  layer_norm_eps: float
  hidden_act: str = "gelu"

  @classmethod
  def from_dict(cls, data: dict, where: str = "config") -> "BertConfig":
    """The config of a Hugging Face config.json's fields (the others ignored)."""
    if data.get("model_type", "bert") not in ("bert",):
      raise ValueError(f"{where}: model_type {data.get('model_type')!r} is not a BERT encoder")
    if data.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "relu"):
      raise ValueError(f"{where}: hidden_act {data['hidden_act']!r} is not supported")
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in fields})


def _gelu_erf(x):
  # The erf form PyTorch's BERT uses; jax.nn.gelu's exact form goes through erfc, which costs
  # about twice as much on a CPU for the same values to rounding.
  return 0.5 * x * (1.0 + jax.lax.erf(x * np.float32(np.sqrt(0.5)).astype(x.dtype)))


def _activation(name: str):
  return {"gelu": _gelu_erf, "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
          "relu": jax.nn.relu}[name]


class _Weights(nn.Module):
  """A Dense layer's kernel and bias (same names and shapes), for layers that fuse matmuls."""

  features: int

  @nn.compact
  def __call__(self, in_features: int):
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (in_features, self.features))
    return kernel, self.param("bias", nn.initializers.zeros_init(), (self.features,))


def _attention_written_out(q_BxTxNxD, k_BxSxNxD, v_BxSxNxD, bias_Bx1x1xS):
  """Attention with matmuls in the activations' dtype and the softmax in float32 for bfloat16
  (what jax.nn.dot_product_attention computes, written out: its implementation mixes the two
  dtypes implicitly), in float64 for float64 (which it would round through float32)."""
  soft = jnp.float64 if q_BxTxNxD.dtype == jnp.float64 else jnp.float32
  scale = (1.0 / np.sqrt(q_BxTxNxD.shape[-1])).astype(soft)
  logits = jnp.einsum("btnd,bsnd->bnts", q_BxTxNxD, k_BxSxNxD).astype(soft) * scale
  probs = jax.nn.softmax(logits + bias_Bx1x1xS.astype(soft), axis=-1)
  return jnp.einsum("bnts,bsnd->btnd", probs.astype(q_BxTxNxD.dtype), v_BxSxNxD)


def _norm(cfg: BertConfig, name: str, x):
  """Layer normalisation computed in float32 whatever the activations' dtype (its variance is
  what low precision gets wrong), returned in theirs."""
  if jnp.finfo(x.dtype).bits >= 32:
    return nn.LayerNorm(cfg.layer_norm_eps, name=name)(x)
  return nn.LayerNorm(cfg.layer_norm_eps, name=name)(x.astype(jnp.float32)).astype(x.dtype)


class _Layer(nn.Module):
  cfg: BertConfig

  @nn.compact
  def __call__(self, h_BxTxH, bias_Bx1x1xT, first_only: bool = False):
    """The layer's output states (B, T, H); with `first_only` only the first position's
    (B, 1, H), which attends to every position: what a cross-encoder's last layer needs for its
    [CLS] state (the keys and values of every token, the rest of the layer for one)."""
    cfg = self.cfg
    heads, size = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    dtype = h_BxTxH.dtype
    # Query, key and value as one (H, 3H) matmul: one pass over the activations instead of three.
    qkv = [_Weights(cfg.hidden_size, name=n)(cfg.hidden_size) for n in ("query", "key", "value")]
    kernel_Hx3H = jnp.concatenate([w for w, _ in qkv], axis=1).astype(dtype)
    bias_1x1x3H = jnp.concatenate([b for _, b in qkv])[None, None, :].astype(dtype)
    b, t = h_BxTxH.shape[:2]
    if first_only:
      q = (h_BxTxH[:, :1] @ kernel_Hx3H[:, :cfg.hidden_size]
           + bias_1x1x3H[..., :cfg.hidden_size]).reshape(b, 1, heads, size)
      kv_BxTx2xNxD = (h_BxTxH @ kernel_Hx3H[:, cfg.hidden_size:]
                      + bias_1x1x3H[..., cfg.hidden_size:]).reshape(b, t, 2, heads, size)
      k, v = kv_BxTx2xNxD[:, :, 0], kv_BxTx2xNxD[:, :, 1]
      h_BxTxH = h_BxTxH[:, :1]
    else:
      qkv_BxTx3xNxD = (h_BxTxH @ kernel_Hx3H + bias_1x1x3H).reshape(b, t, 3, heads, size)
      q, k, v = (qkv_BxTx3xNxD[:, :, i] for i in range(3))
    attn = (jax.nn.dot_product_attention(q, k, v, bias=bias_Bx1x1xT) if dtype == jnp.float32
            else _attention_written_out(q, k, v, bias_Bx1x1xT))
    attn = nn.Dense(cfg.hidden_size, name="attention_out", dtype=dtype)(
        attn.reshape(h_BxTxH.shape))
    h_BxTxH = _norm(cfg, "attention_norm", h_BxTxH + attn)
    inner = _activation(cfg.hidden_act)(
        nn.Dense(cfg.intermediate_size, name="intermediate", dtype=dtype)(h_BxTxH))
    out = nn.Dense(cfg.hidden_size, name="output", dtype=dtype)(inner)
    return _norm(cfg, "output_norm", h_BxTxH + out)


def _hidden_states(cfg: BertConfig, ids_BxT, mask_BxT, types_BxT, dtype,
                   first_only: bool = False):
  """The last layer's states (B, T, H), or with `first_only` its first position's (B, 1, H).
  Called inside a module's compact method, so the embeddings and layers are that module's own,
  under the names the weights file maps to."""
  positions = jnp.arange(ids_BxT.shape[1])[None, :]
  h = (nn.Embed(cfg.vocab_size, cfg.hidden_size, name="word")(ids_BxT)
       + nn.Embed(cfg.max_position_embeddings, cfg.hidden_size, name="position")(positions)
       + nn.Embed(cfg.type_vocab_size, cfg.hidden_size, name="token_type")(types_BxT))
  h = nn.LayerNorm(cfg.layer_norm_eps, name="embed_norm")(h).astype(dtype)
  # Padding keys get a large negative logit: one (B, 1, 1, T) bias for every layer and head.
  bias_Bx1x1xT = jnp.where(mask_BxT, 0.0, -1e9).astype(dtype)[:, None, None, :]
  for i in range(cfg.num_hidden_layers):
    last = i == cfg.num_hidden_layers - 1
    h = _Layer(cfg, name=f"layer_{i}")(h, bias_Bx1x1xT, first_only and last)
  return h


class BertEncoder(nn.Module):
  """Token ids (B, T) and attention mask (B, T) -> unit-norm sentence embeddings (B, H)."""

  cfg: BertConfig

  @nn.compact
  def __call__(self, ids_BxT, mask_BxT):
    h = _hidden_states(self.cfg, ids_BxT, mask_BxT, jnp.zeros_like(ids_BxT), jnp.float32)
    weights = mask_BxT.astype(h.dtype)[..., None]
    pooled = jnp.sum(h * weights, 1) / jnp.maximum(jnp.sum(weights, 1), 1e-9)
    return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


class BertCrossEncoder(nn.Module):
  """Pairs "[CLS] A [SEP] B [SEP]" as token ids (N, T), attention mask and segment ids ->
  one score each (N,): the [CLS] state through BERT's pooler (dense, tanh) and a dense layer to
  one number, as Hugging Face's BertForSequenceClassification with one label computes it.
  `dtype` is the computation's (bfloat16 on an accelerator); the parameters stay float32."""

  cfg: BertConfig
  dtype: str = "float32"

  @nn.compact
  def __call__(self, ids_NxT, mask_NxT, types_NxT):
    dtype = jnp.dtype(self.dtype)
    # Only the [CLS] state is scored: the last layer computes it alone (about a seventh less
    # work than the whole last layer, with the same result).
    h = _hidden_states(self.cfg, ids_NxT, mask_NxT, types_NxT, dtype, first_only=True)
    pooled = jnp.tanh(nn.Dense(self.cfg.hidden_size, name="pooler", dtype=dtype)(h[:, 0]))
    score = nn.Dense(1, name="classifier", dtype=dtype, kernel_init=nn.initializers.zeros)(pooled)
    return score[:, 0].astype(dtype if jnp.finfo(dtype).bits >= 32 else jnp.float32)
