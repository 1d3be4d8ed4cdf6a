"""Loading a BERT-family encoder from a Hugging Face-format directory (config.json,
model.safetensors) into the core's Flax modules (`rmmjax.core.bert`), and the table of weight
names the loader and the exporters share. The parameters are an ordinary pytree, so the encoder
itself can be fine-tuned.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file

from rmmjax.core.bert import BertConfig


def config_from_dir(model_dir: Path) -> BertConfig:
  """The configuration in a model directory's config.json (checked to exist by the caller)."""
  path = Path(model_dir) / "config.json"
  return BertConfig.from_dict(json.loads(path.read_text()), where=str(path))


def weight_names(cfg: BertConfig, head: bool = False) -> list[tuple[tuple[str, str], str, bool]]:
  """(Flax path, Hugging Face name, transposed) of every weight the encoder uses (with `head`,
  also a cross reranker's pooler and one-label classifier): the one table the loader and the
  exporters read, so they stay exact inverses. Linear (out, in) vs Dense (in, out): transposed."""
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
  return names + (dense("pooler", "pooler.dense") + dense("classifier", "classifier") if head
                   else [])


def param_at(params: dict, path: tuple[str, str]):
  """The leaf at a `weight_names` path ("layer_0/query", "kernel") of a parameter pytree."""
  module, leaf = path
  return functools.reduce(lambda node, key: node[key], (*module.split("/"), leaf), params)


def load_params(model_dir: Path, cfg: BertConfig, head: bool = False) -> dict:
  """Flax parameters from a Hugging Face BERT safetensors file (with or without 'bert.'),
  which the caller checked exists (with `head`, as `weight_names`)."""
  path = Path(model_dir) / "model.safetensors"
  w = {k.removeprefix("bert."): v for k, v in load_file(str(path)).items()}
  params: dict = {}
  for (module, leaf), name, transposed in weight_names(cfg, head):
    if name not in w:
      raise ValueError(f"{path}: missing weight {name!r} for a BERT encoder")
    node = params
    for key in module.split("/"):
      node = node.setdefault(key, {})
    node[leaf] = w[name].T if transposed else w[name]
  return jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)


def load_pooler(model_dir: Path) -> dict | None:
  """BERT's pooler (the dense layer over the [CLS] state) from the weights file, as a Flax Dense
  layer's parameters; None when the file has none."""
  w = load_file(str(Path(model_dir) / "model.safetensors"))
  w = {k.removeprefix("bert."): v for k, v in w.items() if "pooler" in k}
  if "pooler.dense.weight" not in w:
    return None
  return {"kernel": jnp.asarray(w["pooler.dense.weight"].T, jnp.float32),
          "bias": jnp.asarray(w["pooler.dense.bias"], jnp.float32)}


def check_params(params: dict, cfg: BertConfig) -> None:
  """Shapes of loaded weights against the config, so a mismatch fails here, not in a matmul."""
  want = (cfg.vocab_size, cfg.hidden_size)
  got = tuple(np.shape(params["word"]["embedding"]))
  if got != want:
    raise ValueError(f"word embeddings have shape {got}; config.json says {want}")
