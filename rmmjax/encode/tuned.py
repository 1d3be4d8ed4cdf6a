"""A sentence encoder with fine-tuned parameters (a tuned query encoder), and the training
state whose parameters are an encoder's."""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core
from rmmjax.encode.protocol import encoder_identity


class TunedQueryEncoder:
  """The encoder with fine-tuned parameters, for queries (`DenseRetriever(query_encoder=...)`);
  its identity adds a hash of the tuned weights to the base encoder's."""

  def __init__(self, encoder, params):
    self.encoder, self.params, self.dim = encoder, params, encoder.dim
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
      digest.update(np.asarray(leaf, np.float32).tobytes())
    self.identity = f"{encoder_identity(encoder)}+tuned:{digest.hexdigest()[:16]}"

  def encode(self, texts: list[str]) -> np.ndarray:
    return self.encoder.encode(texts, params=self.params)


def encoder_state(encoder, spec: core.CoreSpec, hparams: core.HParams,
                  params=None) -> core.TrainState:
  """A training state whose parameters are the encoder's (the loaded ones by default)."""
  # A copy: a training step donates its state, which must never free the encoder's own weights.
  params = jax.tree.map(jnp.copy, encoder.params if params is None else params)
  return core.init_state(spec, hparams, params)
