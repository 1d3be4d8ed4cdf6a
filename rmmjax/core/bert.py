"""A BERT-family encoder as pure Flax modules: the sentence encoder and the cross-encoder build
the same layers under the same names, so one set of pretrained weights starts either (loading
them is the shell's, `rmmjax.encode.bert`)."""

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


def _attention(q_BxTxNxD, k_BxSxNxD, v_BxSxNxD, bias_Bx1xQxS):
  """jax.nn.dot_product_attention in float32; written out in bfloat16 (matmuls in bfloat16, the
  softmax in float32: JAX's path mixes the two implicitly, its backward pass too, so no local
  promotion setting covers it) and in float64 (which JAX's would round through float32)."""
  if q_BxTxNxD.dtype == jnp.float32:
    return jax.nn.dot_product_attention(q_BxTxNxD, k_BxSxNxD, v_BxSxNxD, bias=bias_Bx1xQxS)
  soft = jnp.float64 if q_BxTxNxD.dtype == jnp.float64 else jnp.float32
  scale = (1.0 / np.sqrt(q_BxTxNxD.shape[-1])).astype(soft)
  logits = jnp.einsum("btnd,bsnd->bnts", q_BxTxNxD, k_BxSxNxD).astype(soft) * scale
  probs = jax.nn.softmax(logits + bias_Bx1xQxS.astype(soft), axis=-1)
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
  def __call__(self, h_BxTxH, bias_Bx1xQxT, queries_BxQ=None):
    """The layer's output states (B, T, H), each position attending to the keys its row of
    `bias_Bx1xQxT` admits (0 admitted, a large negative number not); with `queries_BxQ` only the
    states at those positions of each row (B, Q, H): what a cross-encoder's last layer needs
    for its [CLS] states (the keys and values of every token, the rest of the layer for Q)."""
    cfg = self.cfg
    heads, size = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    dtype = h_BxTxH.dtype
    # Query, key and value as one (H, 3H) matmul: one pass over the activations instead of three.
    qkv = [_Weights(cfg.hidden_size, name=n)(cfg.hidden_size) for n in ("query", "key", "value")]
    kernel_Hx3H = jnp.concatenate([w for w, _ in qkv], axis=1).astype(dtype)
    bias_1x1x3H = jnp.concatenate([b for _, b in qkv])[None, None, :].astype(dtype)
    b, t = h_BxTxH.shape[:2]
    if queries_BxQ is not None:
      h_BxQxH = jnp.take_along_axis(h_BxTxH, queries_BxQ[..., None], axis=1)
      q = (h_BxQxH @ kernel_Hx3H[:, :cfg.hidden_size]
           + bias_1x1x3H[..., :cfg.hidden_size]).reshape(b, -1, heads, size)
      kv_BxTx2xNxD = (h_BxTxH @ kernel_Hx3H[:, cfg.hidden_size:]
                      + bias_1x1x3H[..., cfg.hidden_size:]).reshape(b, t, 2, heads, size)
      k, v = kv_BxTx2xNxD[:, :, 0], kv_BxTx2xNxD[:, :, 1]
      h_BxTxH = h_BxQxH
    else:
      qkv_BxTx3xNxD = (h_BxTxH @ kernel_Hx3H + bias_1x1x3H).reshape(b, t, 3, heads, size)
      q, k, v = (qkv_BxTx3xNxD[:, :, i] for i in range(3))
    attn = _attention(q, k, v, bias_Bx1xQxT)
    attn = nn.Dense(cfg.hidden_size, name="attention_out", dtype=dtype)(
        attn.reshape(h_BxTxH.shape))
    h_BxTxH = _norm(cfg, "attention_norm", h_BxTxH + attn)
    inner = _activation(cfg.hidden_act)(
        nn.Dense(cfg.intermediate_size, name="intermediate", dtype=dtype)(h_BxTxH))
    out = nn.Dense(cfg.hidden_size, name="output", dtype=dtype)(inner)
    return _norm(cfg, "output_norm", h_BxTxH + out)


def _embed(cfg: BertConfig, ids_BxT, positions_BxT, types_BxT, dtype):
  """The embeddings of tokens at their positions, layer-normalised. Called inside a module's
  compact method, so the embeddings are that module's own, under the names the weights file
  maps to."""
  h = (nn.Embed(cfg.vocab_size, cfg.hidden_size, name="word")(ids_BxT)
       + nn.Embed(cfg.max_position_embeddings, cfg.hidden_size, name="position")(positions_BxT)
       + nn.Embed(cfg.type_vocab_size, cfg.hidden_size, name="token_type")(types_BxT))
  return nn.LayerNorm(cfg.layer_norm_eps, name="embed_norm")(h).astype(dtype)


def _admit(admitted, dtype):
  """An attention bias: 0 where a key is admitted, a large negative number where not."""
  return jnp.where(admitted, 0.0, -1e9).astype(dtype)


class BertEncoder(nn.Module):
  """Token ids (B, T) and attention mask (B, T) -> unit-norm sentence embeddings (B, H)."""

  cfg: BertConfig

  @nn.compact
  def __call__(self, ids_BxT, mask_BxT):
    positions = jnp.broadcast_to(jnp.arange(ids_BxT.shape[1]), ids_BxT.shape)
    h = _embed(self.cfg, ids_BxT, positions, jnp.zeros_like(ids_BxT), jnp.float32)
    bias_Bx1x1xT = _admit(mask_BxT, jnp.float32)[:, None, None, :]  # padding keys shut out
    for i in range(self.cfg.num_hidden_layers):
      h = _Layer(self.cfg, name=f"layer_{i}")(h, bias_Bx1x1xT)
    weights = mask_BxT.astype(h.dtype)[..., None]
    pooled = jnp.sum(h * weights, 1) / jnp.maximum(jnp.sum(weights, 1), 1e-9)
    return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


class BertCrossEncoder(nn.Module):
  """Pairs "[CLS] A [SEP] B [SEP]" packed up to C to a row -> their scores (R, C), as Hugging
  Face's BertForSequenceClassification with one label computes them. A token's slot says which
  pair of the row it belongs to (1..C; 0 padding) and it attends only to its own pair, so a
  packed pair scores as it would alone (`rmmjax.learners.cross.model.PackedPairs`). `dtype` is
  the computation's; the parameters stay float32."""

  cfg: BertConfig
  dtype: str = "float32"

  @nn.compact
  def __call__(self, ids_RxT, positions_RxT, types_RxT, slots_RxT, cls_RxC):
    dtype = jnp.dtype(self.dtype)
    cfg = self.cfg
    h = _embed(cfg, ids_RxT, positions_RxT, types_RxT, dtype)
    slots_RxT = slots_RxT.astype(jnp.int32)
    same = (slots_RxT[:, :, None] == slots_RxT[:, None, :]) & (slots_RxT[:, None, :] > 0)
    bias_Rx1xTxT = _admit(same, dtype)[:, None]
    for i in range(cfg.num_hidden_layers - 1):
      h = _Layer(cfg, name=f"layer_{i}")(h, bias_Rx1xTxT)
    # Only the [CLS] states are scored: the last layer computes those alone (about a seventh
    # less work than the whole last layer, with the same result), each over its own pair.
    slot_C = jnp.arange(1, cls_RxC.shape[1] + 1)
    bias_Rx1xCxT = _admit(slots_RxT[:, None, :] == slot_C[None, :, None], dtype)[:, None]
    h = _Layer(cfg, name=f"layer_{cfg.num_hidden_layers - 1}")(h, bias_Rx1xCxT, cls_RxC)
    pooled = jnp.tanh(nn.Dense(cfg.hidden_size, name="pooler", dtype=dtype)(h))
    score = nn.Dense(1, name="classifier", dtype=dtype, kernel_init=nn.initializers.zeros)(pooled)
    return score[..., 0].astype(dtype if jnp.finfo(dtype).bits >= 32 else jnp.float32)
