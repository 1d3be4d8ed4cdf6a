"""What several command groups share: the bank and the encoder their flags name, and plurals."""

from __future__ import annotations

from pathlib import Path


def plural(n: int, noun: str) -> str:
  """"1 conversation", "2 conversations"."""
  return f"{n} {noun}{'' if n == 1 else 's'}"


def bank(path: str, must_exist: bool):
  from rmmjax.memory import MemoryBank, key_from_env  # noqa: PLC0415  (the bank's commands only)
  file = Path(path)
  wrong = ("does not exist" if not file.exists() else
           "is an empty file, not a memory bank" if file.is_file() and file.stat().st_size == 0
           else None)
  if must_exist and wrong:
    raise FileNotFoundError(f"--db {path} {wrong} (build one with rmmjax ingest)")
  return MemoryBank(path, key=key_from_env())


def encoder_for(memory_bank):
  """The sentence encoder, with the embedding cache only where the bank is not encrypted: a
  cache row is a plaintext vector keyed by a hash of its text."""
  from rmmjax.encode.cache import EmbeddingCache, cache_path  # noqa: PLC0415  (loads the weights: only here)
  from rmmjax.encode.encoder import SentenceEncoder  # noqa: PLC0415
  if memory_bank is not None and memory_bank.cipher.encrypted:
    return SentenceEncoder(cache=None)
  return SentenceEncoder(cache=EmbeddingCache(cache_path()))
