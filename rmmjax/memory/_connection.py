"""The bank's SQLite connection: WAL (readers never wait for a writer), a busy timeout (writers
queue instead of failing), foreign keys, full syncs and zeroed deletions; and its transactions,
each begun explicitly."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from rmmjax.encode.cache import wal_mode
from rmmjax.memory.records import BankFileError


def connect(path: Path, busy_timeout_s: float, where: str) -> sqlite3.Connection:
  """An open connection to the bank file, or sqlite3.Error / BankFileError."""
  # isolation_level None: transactions are begun explicitly (BEGIN IMMEDIATE for writes), so a
  # read-then-write holds the write lock from its first read.
  db = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
  try:
    for pragma in (f"busy_timeout = {int(busy_timeout_s * 1000)}", "foreign_keys = ON",
                   "synchronous = FULL",  # a committed write survives a power cut
                   "secure_delete = ON"):  # deleted personal text is zeroed, not left in pages
      db.execute(f"PRAGMA {pragma}")
    mode = wal_mode(db, busy_timeout_s)
    keys = db.execute("PRAGMA foreign_keys").fetchone()[0]
    if mode != "wal" or keys != 1:
      raise BankFileError(f"{where}: SQLite gave journal mode {mode!r} and foreign_keys "
                          f"{keys}; a bank needs WAL (a local file) and foreign keys")
  except BaseException:
    db.close()
    raise
  return db


@contextlib.contextmanager
def transaction(db: sqlite3.Connection | None, begin: str,
                where: str) -> Iterator[sqlite3.Connection]:
  """One transaction (`begin` is BEGIN or BEGIN IMMEDIATE): committed when its block ends,
  rolled back when it raises; SQLite's errors become BankFileError naming the bank."""
  if db is None:
    raise BankFileError(f"{where} is closed")
  try:
    db.execute(begin)
    try:
      yield db
      db.execute("COMMIT")
    except BaseException:
      if db.in_transaction:
        db.execute("ROLLBACK")
      raise
  except sqlite3.Error as err:
    raise BankFileError(f"{where}: sqlite: {err}") from None
