"""The embeddings table: float32 vectors of a user's memories, one row per (memory, encoder).

An encoder's identity string is stored with each vector: vectors of different encoders live in
different spaces, so a query embedded by one is never scored against memories embedded by
another; the bank refuses instead and says it must be re-embedded.
"""

from __future__ import annotations

import sqlite3

import numpy as np

from rmmjax.memory.crypto import Cipher
from rmmjax.memory.records import BankFileError, EncoderMismatch, select_in

MEMORY = "memory"  # the kind of a topic memory's embedding (later layers add their own kinds)


def open_vector(cipher: Cipher, dim: int, blob: bytes, where: str) -> np.ndarray:
  """A stored vector, checked against the size its row records."""
  vector = np.frombuffer(cipher.open_bytes(blob), np.float32)
  if vector.size != dim:
    raise BankFileError(f"{where} has {vector.size} values where its row says {dim}: the file "
                        f"is corrupt")
  return vector


def put_vector(db: sqlite3.Connection, cipher: Cipher, user: str, memory_id: int, encoder: str,
               vector: np.ndarray) -> None:
  db.execute("INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?, ?, ?, ?)",
             (MEMORY, memory_id, user, encoder, vector.size,
              cipher.seal_bytes(np.ascontiguousarray(vector, np.float32).tobytes())))


def check_dims(db: sqlite3.Connection, user: str, encoder: str) -> None:
  """Refuses (inside the writing transaction, so it rolls back) an encoder with two sizes."""
  dims = [r[0] for r in db.execute(
      "SELECT DISTINCT dim FROM embeddings WHERE user_id = ? AND kind = ? AND encoder = ? "
      "ORDER BY dim", (user, MEMORY, encoder))]
  if len(dims) > 1:
    raise ValueError(f"encoder {encoder!r} would give the memories of user {user!r} embeddings of "
                     f"sizes {dims}; one encoder gives one size")


def require_encoder(db: sqlite3.Connection, user: str, encoder: str, use: str) -> None:
  """Refuses when some of the user's memories have no embedding from encoder."""
  missing = [r[0] for r in db.execute(
      "SELECT memory_id FROM memories m WHERE user_id = ? AND NOT EXISTS (SELECT 1 FROM "
      "embeddings e WHERE e.kind = ? AND e.owner_id = m.memory_id AND e.encoder = ?) "
      "ORDER BY memory_id", (user, MEMORY, encoder))]
  if not missing:
    return
  others = sorted(r[0] for r in select_in(
      db, "SELECT DISTINCT encoder FROM embeddings WHERE user_id = ? AND kind = ? AND "
      "owner_id IN ({})", (user, MEMORY), missing))
  total = db.execute("SELECT COUNT(*) FROM memories WHERE user_id = ?", (user,)).fetchone()[0]
  built = (f"were embedded with encoder {' and '.join(map(repr, others))}" if others
           else "have no embedding")
  raise EncoderMismatch(
      f"{len(missing)} of the {total} memories of user {user!r} (ids {missing[:5]}"
      f"{'...' if len(missing) > 5 else ''}) {built}, but {use} uses encoder {encoder!r}: the "
      f"bank must be re-embedded with {encoder!r} (put_embeddings) first")


def matrix(db: sqlite3.Connection, cipher: Cipher, user: str, encoder: str,
           where: str) -> tuple[list[int], np.ndarray]:
  """(memory ids, N x D float32) of every memory of the user, as embedded by encoder."""
  require_encoder(db, user, encoder, "this query")
  rows = db.execute(
      "SELECT e.owner_id, e.dim, e.vector FROM memories m JOIN embeddings e ON e.kind = ? AND "
      "e.owner_id = m.memory_id AND e.encoder = ? WHERE m.user_id = ? AND e.user_id = ? "
      "ORDER BY m.memory_id", (MEMORY, encoder, user, user)).fetchall()
  if not rows:
    return [], np.zeros((0, 0), np.float32)
  # One size per encoder: check_dims refuses a write that would give two.
  return [r[0] for r in rows], np.stack([
      open_vector(cipher, d, b, f"{where}: the embedding of memory {m}") for m, d, b in rows])


def by_memory(db: sqlite3.Connection, cipher: Cipher, user: str,
              where: str) -> dict[int, dict[str, np.ndarray]]:
  """{memory id: {encoder: vector}} of every memory embedding of the user."""
  found: dict[int, dict[str, np.ndarray]] = {}
  for m, encoder, dim, blob in db.execute(
      "SELECT owner_id, encoder, dim, vector FROM embeddings WHERE user_id = ? AND kind = ? "
      "ORDER BY owner_id, encoder", (user, MEMORY)):
    found.setdefault(m, {})[encoder] = open_vector(cipher, dim, blob,
                                                   f"{where}: the embedding of memory {m}")
  return found
