"""What every consumer of an encoder relies on: texts in, unit-norm float32 rows out, a
dimension, and an identity that names the model and its weights (so that a record of what a
model was trained with recognises the same encoder wherever its files are). The sentence
encoder, a tuned query encoder, the test suite's hashed bag of words and the benchmarks'
random vectors all have these."""

from __future__ import annotations

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
