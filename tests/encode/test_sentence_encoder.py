"""The Flax sentence encoder against sentence-transformers on real LoCoMo turns, and its cache."""

import copy
import os

import jax
import numpy as np
import pytest

from rmmjax.cli import main
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.cache import EmbeddingCache
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.retrieve.units import build_units


@pytest.fixture(scope="module")
def encoder():
  return SentenceEncoder(batch_size=32)


def _turn_texts(source, n):
  conv = load_locomo(source)[0][1]
  texts = sorted({u.text for u in build_units(conv, "turn")}, key=len)
  # Short and long turns alike, including the longest (several length buckets).
  return texts[:: max(1, len(texts) // n)][:n] + texts[-3:]


def test_matches_sentence_transformers_on_locomo_turns(encoder, three):
  try:
    import sentence_transformers
  except ImportError:
    if os.environ.get("CI"):
      raise
    pytest.skip("the comparison needs sentence-transformers and torch: pip install -e '.[parity]'")
  texts = _turn_texts(three, 120)
  ours = encoder.encode(texts)
  reference = sentence_transformers.SentenceTransformer(str(encoder.model_dir), device="cpu")
  theirs = reference.encode(texts, batch_size=32, normalize_embeddings=True)
  cosine = np.sum(ours * theirs, axis=1)
  assert cosine.min() >= 0.9999, (cosine.min(), texts[int(cosine.argmin())])
  np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, rtol=1e-5)


def test_padding_and_batch_composition_do_not_change_embeddings(encoder):
  texts = ["a short one", "a much longer sentence " * 12, "mid length text about painting"]
  together = encoder.encode(texts)
  alone = np.stack([encoder.encode([t])[0] for t in texts])
  np.testing.assert_allclose(together, alone, atol=2e-6)
  # Batches of 2: a partial batch (the shortest text and an empty row), then a full one.
  pairs = copy.copy(encoder)
  pairs.batch_size = 2
  np.testing.assert_allclose(pairs.encode(texts), alone, atol=2e-6)


def test_an_accelerator_pads_to_fewer_lengths_with_the_same_embeddings(encoder, monkeypatch):
  texts = ["a short one", "a much longer sentence " * 12, "mid length text about painting"]
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  here = encoder.encode(texts)
  assert [encoder.bucket_length(n) for n in (5, 40, 100)] == [8, 40, 104]
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert [encoder.bucket_length(n) for n in (5, 40, 100, 300)] == [32, 64, 128, 256]
  np.testing.assert_allclose(encoder.encode(texts), here, atol=2e-6)


def test_cache_serves_repeated_texts_without_the_model(tmp_path, encoder):
  cache = EmbeddingCache(tmp_path / "emb.sqlite")
  cached = encoder.with_cache(cache)
  texts = ["first text", "second text"]
  first = cached.encode(texts)

  def fail(*_):
    raise AssertionError("the model ran although every text was cached")

  cached.apply = fail
  np.testing.assert_array_equal(cached.encode(texts[::-1]), first[::-1])
  cache.close()


def test_embed_command(tmp_path, capsys):
  src = tmp_path / "texts.txt"
  src.write_text("Caroline went to a support group.\nMelanie paints sunsets.\n")
  out = tmp_path / "emb.npy"
  assert main(["embed", "--in", str(src), "--out", str(out), "--cache",
               str(tmp_path / "c.sqlite")]) == 0
  emb = np.load(out)
  assert emb.shape == (2, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
  assert main(["embed", "--in", str(tmp_path / "none.txt"), "--out", str(out)]) == 2
  assert "does not exist" in capsys.readouterr().err
  bad_model = tmp_path / "model"
  bad_model.mkdir()
  assert main(["embed", "--in", str(src), "--out", str(tmp_path / "x.npy"), "--model",
               str(bad_model), "--no-cache"]) == 2
  assert "config.json not found" in capsys.readouterr().err
