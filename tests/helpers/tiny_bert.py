"""A tiny BERT encoder directory (MiniLM's tokenizer, two layers of width 32, random weights),
for the tests whose point is the logic around an encoder rather than its quality: it compiles
in a fraction of MiniLM's time. `RMMJAX_ENCODER=DIR` makes it the default encoder of every
command, in this process and in the ones it starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

from rmmjax.core.bert import BertConfig, BertEncoder
from rmmjax.encode.bert import param_at, weight_names
from rmmjax.encode.encoder import default_model_dir

SIZES = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "intermediate_size": 64}
COPIED = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
          "sentence_bert_config.json", "modules.json")


def write_tiny_encoder(out: Path, seed: int = 0) -> Path:
  """Writes the tiny encoder's directory to `out` (a new folder) and returns it."""
  source = default_model_dir()
  out = Path(out)
  out.mkdir(parents=True)
  config = json.loads((source / "config.json").read_text()) | SIZES
  (out / "config.json").write_text(json.dumps(config, indent=2))
  for name in COPIED:
    if (source / name).exists():
      shutil.copyfile(source / name, out / name)
  cfg = BertConfig.from_dict(config)
  ids = np.zeros((1, 8), np.int32)
  params = BertEncoder(cfg).init(jax.random.PRNGKey(seed), ids, ids >= 0)["params"]
  tensors = {}
  for path, name, transposed in weight_names(cfg):
    value = np.asarray(param_at(params, path), np.float32)
    tensors[name] = np.ascontiguousarray(value.T if transposed else value)
  rng = np.random.default_rng(seed)
  h = cfg.hidden_size
  tensors["pooler.dense.weight"] = rng.normal(0, 0.1, (h, h)).astype(np.float32)
  tensors["pooler.dense.bias"] = np.zeros(h, np.float32)
  save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
  return out
