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


def _activation(name: str):
  return {"gelu": lambda x: jax.nn.gelu(x, approximate=False),  # BERT's exact erf GELU
          "gelu_new": lambda x: jax.nn.gelu(x, approximate=True), "relu": jax.nn.relu}[name]


class _Layer(nn.Module):
  cfg: BertConfig

  @nn.compact
  def __call__(self, h_BxTxH, mask_BxT):
    cfg = self.cfg
    heads, size = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    split = lambda x: x.reshape(x.shape[:2] + (heads, size))  # noqa: E731
    q = split(nn.Dense(cfg.hidden_size, name="query")(h_BxTxH))
    k = split(nn.Dense(cfg.hidden_size, name="key")(h_BxTxH))
    v = split(nn.Dense(cfg.hidden_size, name="value")(h_BxTxH))
    logits_BxNxTxT = jnp.einsum("bqnd,bknd->bnqk", q, k) / jnp.sqrt(jnp.float32(size))
    logits_BxNxTxT = jnp.where(mask_BxT[:, None, None, :], logits_BxNxTxT, -1e9)
    attn = jnp.einsum("bnqk,bknd->bqnd", jax.nn.softmax(logits_BxNxTxT, -1), v)
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
    for i in range(cfg.num_hidden_layers):
      h = _Layer(cfg, name=f"layer_{i}")(h, mask_BxT)
    weights = mask_BxT.astype(h.dtype)[..., None]
    pooled = jnp.sum(h * weights, 1) / jnp.maximum(jnp.sum(weights, 1), 1e-9)
    return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


def _dense(w: dict, name: str) -> dict:
  # PyTorch Linear stores (out, in); a Flax Dense kernel is (in, out).
  return {"kernel": w[f"{name}.weight"].T, "bias": w[f"{name}.bias"]}


def _norm(w: dict, name: str) -> dict:
  return {"scale": w[f"{name}.weight"], "bias": w[f"{name}.bias"]}


def load_params(model_dir: Path, cfg: BertConfig) -> dict:
  """Flax parameters from a Hugging Face BERT safetensors file (with or without 'bert.')."""
  path = Path(model_dir) / "model.safetensors"
  if not path.exists():
    raise FileNotFoundError(f"{path} not found: expected safetensors weights")
  w = {k.removeprefix("bert."): v for k, v in load_file(str(path)).items()}
  try:
    params = {
        "word": {"embedding": w["embeddings.word_embeddings.weight"]},
        "position": {"embedding": w["embeddings.position_embeddings.weight"]},
        "token_type": {"embedding": w["embeddings.token_type_embeddings.weight"]},
        "embed_norm": _norm(w, "embeddings.LayerNorm"),
    }
    for i in range(cfg.num_hidden_layers):
      p = f"encoder.layer.{i}."
      params[f"layer_{i}"] = {
          "query": _dense(w, p + "attention.self.query"),
          "key": _dense(w, p + "attention.self.key"),
          "value": _dense(w, p + "attention.self.value"),
          "attention_out": _dense(w, p + "attention.output.dense"),
          "attention_norm": _norm(w, p + "attention.output.LayerNorm"),
          "intermediate": _dense(w, p + "intermediate.dense"),
          "output": _dense(w, p + "output.dense"),
          "output_norm": _norm(w, p + "output.LayerNorm"),
      }
  except KeyError as err:
    raise ValueError(f"{path}: missing weight {err.args[0]!r} for a BERT encoder") from None
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)


def check_params(params: dict, cfg: BertConfig) -> None:
  """Shapes of loaded weights against the config, so a mismatch fails here, not in a matmul."""
  want = (cfg.vocab_size, cfg.hidden_size)
  got = tuple(np.shape(params["word"]["embedding"]))
  if got != want:
    raise ValueError(f"word embeddings have shape {got}; config.json says {want}")
