"""A BERT-family sentence encoder in Flax: mean pooling over tokens, then L2 normalisation.

Loads a Hugging Face-format directory (config.json, model.safetensors, tokenizer.json). The
parameters are an ordinary pytree, so the encoder itself can be fine-tuned.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file


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
  def from_dir(cls, model_dir: Path) -> "BertConfig":
    path = Path(model_dir) / "config.json"
    if not path.exists():
      raise FileNotFoundError(f"{path} not found: expected a Hugging Face model directory")
    data = json.loads(path.read_text())
    if data.get("model_type", "bert") not in ("bert",):
      raise ValueError(f"{path}: model_type {data.get('model_type')!r} is not a BERT encoder")
    if data.get("hidden_act", "gelu") not in ("gelu", "gelu_new", "relu"):
      raise ValueError(f"{path}: hidden_act {data['hidden_act']!r} is not supported")
    fields = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in fields})


def _gelu_erf(x):
  # The erf form PyTorch's BERT uses; jax.nn.gelu's exact form goes through erfc, which costs
  # about twice as much on a CPU for the same values to rounding.
  return 0.5 * x * (1.0 + jax.lax.erf(x * np.float32(np.sqrt(0.5))))


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


class _Layer(nn.Module):
  cfg: BertConfig

  @nn.compact
  def __call__(self, h_BxTxH, bias_Bx1x1xT):
    cfg = self.cfg
    heads, size = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    # Query, key and value as one (H, 3H) matmul: one pass over the activations instead of three.
    qkv = [_Weights(cfg.hidden_size, name=n)(cfg.hidden_size) for n in ("query", "key", "value")]
    kernel_Hx3H = jnp.concatenate([w for w, _ in qkv], axis=1)
    bias_1x1x3H = jnp.concatenate([b for _, b in qkv])[None, None, :]
    qkv_BxTx3H = h_BxTxH @ kernel_Hx3H + bias_1x1x3H
    qkv_BxTx3xNxD = qkv_BxTx3H.reshape(h_BxTxH.shape[:2] + (3, heads, size))
    q, k, v = (qkv_BxTx3xNxD[:, :, i] for i in range(3))
    attn = jax.nn.dot_product_attention(q, k, v, bias=bias_Bx1x1xT)
    attn = nn.Dense(cfg.hidden_size, name="attention_out")(attn.reshape(h_BxTxH.shape))
    h_BxTxH = nn.LayerNorm(cfg.layer_norm_eps, name="attention_norm")(h_BxTxH + attn)
    inner = _activation(cfg.hidden_act)(nn.Dense(cfg.intermediate_size, name="intermediate")(
        h_BxTxH))
    out = nn.Dense(cfg.hidden_size, name="output")(inner)
    return nn.LayerNorm(cfg.layer_norm_eps, name="output_norm")(h_BxTxH + out)


class BertEncoder(nn.Module):
  """Token ids (B, T) and attention mask (B, T) -> unit-norm sentence embeddings (B, H)."""

  cfg: BertConfig

  @nn.compact
  def __call__(self, ids_BxT, mask_BxT):
    cfg = self.cfg
    positions = jnp.arange(ids_BxT.shape[1])[None, :]
    h = (nn.Embed(cfg.vocab_size, cfg.hidden_size, name="word")(ids_BxT)
         + nn.Embed(cfg.max_position_embeddings, cfg.hidden_size, name="position")(positions)
         + nn.Embed(cfg.type_vocab_size, cfg.hidden_size, name="token_type")(
             jnp.zeros_like(ids_BxT)))
    h = nn.LayerNorm(cfg.layer_norm_eps, name="embed_norm")(h)
    # Padding keys get a large negative logit: one (B, 1, 1, T) bias for every layer and head.
    bias_Bx1x1xT = jnp.where(mask_BxT, 0.0, -1e9).astype(h.dtype)[:, None, None, :]
    for i in range(cfg.num_hidden_layers):
      h = _Layer(cfg, name=f"layer_{i}")(h, bias_Bx1x1xT)
    weights = mask_BxT.astype(h.dtype)[..., None]
    pooled = jnp.sum(h * weights, 1) / jnp.maximum(jnp.sum(weights, 1), 1e-9)
    return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


def weight_names(cfg: BertConfig) -> list[tuple[tuple[str, str], str, bool]]:
  """(Flax path, Hugging Face name, transposed) of every weight the encoder uses.

  The one table both `load_params` and the exporter read, so that they stay exact inverses.
  PyTorch Linear stores (out, in); a Flax Dense kernel is (in, out): those are transposed.
  """
  def dense(flax: str, hf: str):
    return [((flax, "kernel"), f"{hf}.weight", True), ((flax, "bias"), f"{hf}.bias", False)]

  def norm(flax: str, hf: str):
    return [((flax, "scale"), f"{hf}.weight", False), ((flax, "bias"), f"{hf}.bias", False)]

  names = [(("word", "embedding"), "embeddings.word_embeddings.weight", False),
           (("position", "embedding"), "embeddings.position_embeddings.weight", False),
           (("token_type", "embedding"), "embeddings.token_type_embeddings.weight", False),
           *norm("embed_norm", "embeddings.LayerNorm")]
  for i in range(cfg.num_hidden_layers):
    layer, p = f"layer_{i}/", f"encoder.layer.{i}."
    names += [*dense(layer + "query", p + "attention.self.query"),
              *dense(layer + "key", p + "attention.self.key"),
              *dense(layer + "value", p + "attention.self.value"),
              *dense(layer + "attention_out", p + "attention.output.dense"),
              *norm(layer + "attention_norm", p + "attention.output.LayerNorm"),
              *dense(layer + "intermediate", p + "intermediate.dense"),
              *dense(layer + "output", p + "output.dense"),
              *norm(layer + "output_norm", p + "output.LayerNorm")]
  return names


def param_at(params: dict, path: tuple[str, str]):
  """The leaf at a `weight_names` path ("layer_0/query", "kernel") of a parameter pytree."""
  module, leaf = path
  node = params
  for key in (*module.split("/"), leaf):
    node = node[key]
  return node


def load_params(model_dir: Path, cfg: BertConfig) -> dict:
  """Flax parameters from a Hugging Face BERT safetensors file (with or without 'bert.')."""
  path = Path(model_dir) / "model.safetensors"
  if not path.exists():
    raise FileNotFoundError(f"{path} not found: expected safetensors weights")
  w = {k.removeprefix("bert."): v for k, v in load_file(str(path)).items()}
  params: dict = {}
  for (module, leaf), name, transposed in weight_names(cfg):
    if name not in w:
      raise ValueError(f"{path}: missing weight {name!r} for a BERT encoder")
    node = params
    for key in module.split("/"):
      node = node.setdefault(key, {})
    node[leaf] = w[name].T if transposed else w[name]
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)


def check_params(params: dict, cfg: BertConfig) -> None:
  """Shapes of loaded weights against the config, so a mismatch fails here, not in a matmul."""
  want = (cfg.vocab_size, cfg.hidden_size)
  got = tuple(np.shape(params["word"]["embedding"]))
  if got != want:
    raise ValueError(f"word embeddings have shape {got}; config.json says {want}")
