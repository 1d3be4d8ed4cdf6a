"""Embeddings cached on disk in SQLite, keyed by the model's identity and the text's hash.

Several processes may share one cache file (parallel evaluations, a training run beside an
evaluation): the file is in WAL mode, so readers never wait for a writer, and writers wait for
each other (busy timeout) instead of failing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

# Long enough to outlast another process's largest write (one batch of embeddings).
BUSY_TIMEOUT_S = 60.0
_ELSEWHERE = "set RMMJAX_CACHE to another folder (or pass --cache FILE, or --no-cache)"
CACHE_ENV = "RMMJAX_CACHE"
CACHE_FILE = "embeddings.sqlite"
_FILE_SUFFIXES = (".sqlite", ".sqlite3", ".db")


def cache_path(environ: Mapping[str, str] = os.environ) -> Path:
  """The embedding cache's file: $RMMJAX_CACHE names its folder (embeddings.sqlite inside) or,
  ending in .sqlite, .sqlite3 or .db or naming a file that exists, the file itself; unset,
  ~/.cache/rmmjax/embeddings.sqlite."""
  value = environ.get(CACHE_ENV, "").strip()
  if not value:
    return Path.home() / ".cache" / "rmmjax" / CACHE_FILE
  path = Path(value).expanduser()
  return path if path.suffix in _FILE_SUFFIXES or path.is_file() else path / CACHE_FILE


def per_host(path: Path, host: str) -> Path:
  """One cache file per host for a run over several hosts: SQLite's write-ahead log is safe
  between the processes of one machine, not across a network file system that several hosts
  share (a SLURM cluster's $HOME)."""
  safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "host"
  return path.with_name(f"{path.stem}-{safe}{path.suffix}")


def wal_mode(db: sqlite3.Connection, busy_timeout_s: float) -> str:
  """Switches a new file to WAL and returns the journal mode. The switch takes an exclusive lock
  without waiting for it (no busy handler), so processes opening a new file at once retry here."""
  deadline, pause = time.monotonic() + busy_timeout_s, 0.001
  while True:
    try:
      return db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    except sqlite3.OperationalError as err:
      if "locked" not in str(err) or time.monotonic() > deadline:
        raise
    time.sleep(pause)
    pause = min(2 * pause, 0.05)


class CacheError(ValueError):
  """An embedding cache file that cannot be used; a ValueError so that commands report it as a
  bad argument, with the file and the remedy, rather than a traceback."""


def text_key(text: str) -> bytes:
  return hashlib.sha256(text.encode("utf-8")).digest()


class EmbeddingCache:
  """get/put of float32 vectors; writes are one transaction per call."""

  def __init__(self, path: str | Path, busy_timeout_s: float = BUSY_TIMEOUT_S):
    self.path = Path(path)
    if self.path.is_dir():
      raise CacheError(f"embedding cache {self.path} is a directory; expected an SQLite file "
                       f"(such as {self.path / 'embeddings.sqlite'}): {_ELSEWHERE}")
    try:
      self.path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
      blocker = next((p for p in self.path.parents if p.exists()), None)
      why = (f"{blocker} is a file, not a folder" if blocker is not None and not blocker.is_dir()
             else err.strerror or str(err))
      raise CacheError(f"embedding cache {self.path}: its folder {self.path.parent} cannot be "
                       f"created ({why}); {_ELSEWHERE}") from None
    self._db = None
    try:
      # isolation_level IMMEDIATE: a write takes the lock when its transaction begins, so two
      # writers queue on the busy timeout instead of one failing when it upgrades its lock.
      self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level="IMMEDIATE")
      wal_mode(self._db, busy_timeout_s)
      with self._db:
        self._db.execute("CREATE TABLE IF NOT EXISTS embeddings (model TEXT NOT NULL, key BLOB "
                         "NOT NULL, vector BLOB NOT NULL, PRIMARY KEY (model, key))")
    except sqlite3.DatabaseError as err:
      if self._db is not None:
        self._db.close()
      raise self._error(err, "opened") from None

  def _error(self, err: sqlite3.DatabaseError, doing: str) -> CacheError:
    """The CacheError for an SQLite failure, with the remedy that fits it."""
    reason = str(err)
    if "locked" in reason or "busy" in reason:
      remedy = f"another process held it longer than the busy timeout; retry, or {_ELSEWHERE}"
    elif "readonly" in reason or "unable to open" in reason or "disk I/O" in reason:
      remedy = (f"check that {self.path.parent} and the file are writable (SQLite also writes "
                f"{self.path.name}-wal and -shm beside it), or {_ELSEWHERE}")
    else:  # "file is not a database", "database disk image is malformed", ...
      remedy = ("the file is corrupt or not an embedding cache; if it is the cache, delete it "
                "(it is only a cache: embeddings are recomputed when missing); if it is another "
                f"file, keep it and {_ELSEWHERE}")
    return CacheError(f"embedding cache {self.path} cannot be {doing} (sqlite: {reason}): "
                      f"{remedy}")

  @contextlib.contextmanager
  def _failing_as(self, doing: str):
    """An SQLite failure in the block (corruption may first show on a read) as a CacheError."""
    try:
      yield
    except sqlite3.DatabaseError as err:
      raise self._error(err, doing) from None

  def get(self, model: str, texts: list[str], dim: int) -> list[np.ndarray | None]:
    keys, found = [text_key(t) for t in texts], {}
    with self._failing_as("read"):
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
    with self._failing_as("written"), self._db:  # one transaction: all rows or none
      self._db.executemany("INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?)", rows)

  def forget(self, texts) -> int:
    """Deletes every model's embedding of these texts; returns how many rows went."""
    keys, gone = [text_key(t) for t in dict.fromkeys(texts)], 0
    with self._failing_as("written"):
      self._db.execute("PRAGMA secure_delete = ON")  # zero the rows' bytes, not just unlink them
      with self._db:  # one transaction
        for start in range(0, len(keys), 500):
          chunk = keys[start:start + 500]
          gone += self._db.execute(f"DELETE FROM embeddings WHERE key IN "
                                   f"({','.join('?' * len(chunk))})", chunk).rowcount
      with contextlib.suppress(sqlite3.Error):  # the log still holds old copies until then
        self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return gone

  def close(self) -> None:
    self._db.close()
