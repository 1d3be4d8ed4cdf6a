"""What every consumer of an encoder relies on: texts in, unit-norm float32 rows out, a
dimension, and an identity that names the model and its weights (so that a record of what a
model was trained with recognises the same encoder wherever its files are). The sentence
encoder, a tuned query encoder, the test suite's hashed bag of words and the benchmarks'
random vectors all have these."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Protocol

import numpy as np


class Encoder(Protocol):
  """Texts to unit-norm float32 rows (len(texts) x dim), with a stable identity."""

  identity: str
  dim: int

  def encode(self, texts: list[str]) -> np.ndarray: ...


def encoder_identity(encoder: Encoder) -> str:
  """The encoder's identity (name and weights hash)."""
  return encoder.identity


def file_sha256(path: Path) -> str:
  """The sha256 of a file, read in blocks (a model's weights may be large)."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 22), b""):
      digest.update(block)
  return digest.hexdigest()


def tokenizer_identity(encoder) -> str:
  """The sha256 of a BERT encoder's tokenizer file (what text pairs are cut by: a cross
  reranker records it and is refused beside another)."""
  return file_sha256(Path(encoder.model_dir) / "tokenizer.json")


def require_bert(encoder, what: str) -> None:
  """Refuses an encoder without a BERT's weights and tokenizer (the suite's stand-ins)."""
  if not all(hasattr(encoder, name) for name in ("tokenizer", "params", "cfg", "model_dir")):
    raise ValueError(f"{what} reads text with a BERT encoder's weights and tokenizer "
                     f"(rmmjax.encode.SentenceEncoder); {type(encoder).__name__} has none")
