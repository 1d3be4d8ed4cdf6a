"""A fast deterministic stand-in for the sentence encoder in tests that do not test it."""

import hashlib
import re

import numpy as np


class HashEncoder:
  """Unit-norm hashed bag-of-words embeddings: deterministic, and fast enough for tests."""

  dim = 32
  identity = "hashed bag of words (32)"

  def encode(self, texts):
    out = np.zeros((len(texts), self.dim), np.float32)
    for i, text in enumerate(texts):
      for word in re.findall(r"\w+", text.lower()):
        out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % self.dim] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)
