"""Embeddings cached on disk in SQLite, keyed by the model's identity and the text's hash."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import numpy as np


def text_key(text: str) -> bytes:
  return hashlib.sha256(text.encode("utf-8")).digest()


class EmbeddingCache:
  """get/put of float32 vectors; writes are one transaction per call."""

  def __init__(self, path: str | Path):
    self.path = Path(path)
    self.path.parent.mkdir(parents=True, exist_ok=True)
    self._db = sqlite3.connect(self.path)
    self._db.execute("CREATE TABLE IF NOT EXISTS embeddings (model TEXT NOT NULL, key BLOB NOT "
                     "NULL, vector BLOB NOT NULL, PRIMARY KEY (model, key))")
    self._db.commit()

  def get(self, model: str, texts: list[str], dim: int) -> list[np.ndarray | None]:
    found = {}
    keys = [text_key(t) for t in texts]
    for start in range(0, len(keys), 500):  # SQLite caps the number of bound parameters
      chunk = keys[start:start + 500]
      rows = self._db.execute(
          f"SELECT key, vector FROM embeddings WHERE model = ? AND key IN "
          f"({','.join('?' * len(chunk))})", [model, *chunk]).fetchall()
      found.update((bytes(k), np.frombuffer(v, np.float32)) for k, v in rows)
    return [found.get(k) if found.get(k) is not None and found[k].size == dim else None
            for k in keys]

  def put(self, model: str, texts: list[str], vectors: np.ndarray) -> None:
    rows = [(model, text_key(t), np.asarray(v, np.float32).tobytes())
            for t, v in zip(texts, vectors, strict=True)]
    with self._db:  # one transaction: all rows or none
      self._db.executemany("INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?)", rows)

  def close(self) -> None:
    self._db.close()
