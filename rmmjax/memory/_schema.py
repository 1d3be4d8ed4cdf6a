"""The memory bank's SQLite file: its connection and transactions, and its schema (version 4).

With WAL readers never wait for a writer; with the busy timeout writers queue, not fail.
Every table that holds a user's data has a user_id column: delete_user removes a user by it,
so a new table needs nothing more to be covered. Another schema version is refused, not migrated.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from rmmjax.encode.cache import wal_mode
from rmmjax.io.manifest import another_version
from rmmjax.memory.crypto import KEY_CHECK, KEY_ENV, BankKeyError, Cipher
from rmmjax.memory.records import BankFileError

VERSION = 4
SCHEMA: tuple[str, ...] = (
    "CREATE TABLE bank_meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # version: set on every write of the user's memories from one bank-wide counter
    # (bank_writes), so a search index checks it in one row lookup, and it never repeats, not
    # even for a user who was deleted and imported again.
    "CREATE TABLE users (user_id TEXT PRIMARY KEY, version INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE bank_writes (n INTEGER NOT NULL)",
    "INSERT INTO bank_writes VALUES (0)",
    # origin: who opened the session (a writer appends only to sessions of its own kind).
    """CREATE TABLE sessions (
         user_id TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
         session_id TEXT NOT NULL, date TEXT NOT NULL, ordinal INTEGER NOT NULL,
         ended INTEGER NOT NULL DEFAULT 0 CHECK (ended IN (0, 1)),
         origin TEXT NOT NULL DEFAULT 'ingest',
         PRIMARY KEY (user_id, session_id), UNIQUE (user_id, ordinal))""",
    # Turn ids are unique per user (as within a conversation), so a snippet names its turn.
    # kind, set by the writer: only statements are evidence for IRIS.
    """CREATE TABLE turns (
         user_id TEXT NOT NULL, session_id TEXT NOT NULL, turn_id TEXT NOT NULL,
         speaker TEXT NOT NULL, text TEXT NOT NULL, date TEXT NOT NULL,
         ordinal INTEGER NOT NULL,
         kind TEXT NOT NULL DEFAULT 'statement'
           CHECK (kind IN ('statement', 'question', 'answer')),
         PRIMARY KEY (user_id, turn_id), UNIQUE (user_id, session_id, ordinal),
         FOREIGN KEY (user_id, session_id) REFERENCES sessions (user_id, session_id)
           ON DELETE CASCADE)""",
    # AUTOINCREMENT: a deleted user's memory ids are never handed to another user.
    """CREATE TABLE memories (
         memory_id INTEGER PRIMARY KEY AUTOINCREMENT,
         user_id TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
         summary TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
         UNIQUE (memory_id, user_id))""",
    "CREATE INDEX memories_by_user ON memories (user_id)",
    # Both keys carry user_id: a snippet cannot join one user's memory to another's turn.
    """CREATE TABLE snippets (
         memory_id INTEGER NOT NULL, user_id TEXT NOT NULL, turn_id TEXT NOT NULL,
         session_id TEXT NOT NULL, date TEXT NOT NULL, text TEXT NOT NULL,
         ordinal INTEGER NOT NULL,
         PRIMARY KEY (memory_id, turn_id),
         FOREIGN KEY (memory_id, user_id) REFERENCES memories (memory_id, user_id)
           ON DELETE CASCADE,
         FOREIGN KEY (user_id, turn_id) REFERENCES turns (user_id, turn_id)
           ON DELETE CASCADE)""",
    "CREATE INDEX snippets_by_turn ON snippets (user_id, turn_id)",
    # kind says what owner_id names ('memory' now; facts and other rows later).
    """CREATE TABLE embeddings (
         kind TEXT NOT NULL, owner_id INTEGER NOT NULL,
         user_id TEXT NOT NULL REFERENCES users (user_id) ON DELETE CASCADE,
         encoder TEXT NOT NULL, dim INTEGER NOT NULL CHECK (dim > 0),
         vector BLOB NOT NULL,
         PRIMARY KEY (kind, owner_id, encoder))""",
    "CREATE INDEX embeddings_by_user ON embeddings (user_id, kind, encoder)",
    # owner_id has no foreign key (its table depends on kind): triggers keep it honest.
    """CREATE TRIGGER embeddings_of_own_memory BEFORE INSERT ON embeddings
         WHEN NEW.kind = 'memory' AND NOT EXISTS (SELECT 1 FROM memories
           WHERE memory_id = NEW.owner_id AND user_id = NEW.user_id)
         BEGIN SELECT RAISE(ABORT, 'embedding of a memory the user does not have'); END""",
    """CREATE TRIGGER embeddings_follow_memory AFTER DELETE ON memories
         BEGIN DELETE FROM embeddings WHERE kind = 'memory'
           AND owner_id = OLD.memory_id; END""",
    # LaceMem's layers (`_lace_rows.py`): a revision per saved LaceMem, so a save writes only
    # what is new when nobody else saved in between.
    """CREATE TABLE lace_meta (
         user_id TEXT PRIMARY KEY REFERENCES users (user_id) ON DELETE CASCADE,
         settings TEXT NOT NULL, encoder TEXT NOT NULL,
         dim INTEGER NOT NULL CHECK (dim >= 0), fallbacks INTEGER NOT NULL,
         revision INTEGER NOT NULL DEFAULT 0)""",
    """CREATE TABLE lace_turns (
         user_id TEXT NOT NULL REFERENCES lace_meta (user_id) ON DELETE CASCADE,
         turn_id TEXT NOT NULL, ordinal INTEGER NOT NULL, session_id TEXT NOT NULL,
         date TEXT NOT NULL, speaker TEXT NOT NULL, text TEXT NOT NULL,
         PRIMARY KEY (user_id, turn_id), UNIQUE (user_id, ordinal))""",
    """CREATE TABLE lace_facts (
         user_id TEXT NOT NULL, fact_id INTEGER NOT NULL, turn_id TEXT NOT NULL,
         subject TEXT NOT NULL, predicate TEXT NOT NULL, object TEXT NOT NULL,
         time TEXT NOT NULL, text TEXT NOT NULL, vector BLOB NOT NULL,
         PRIMARY KEY (user_id, fact_id),
         FOREIGN KEY (user_id, turn_id) REFERENCES lace_turns (user_id, turn_id)
           ON DELETE CASCADE)""",
    """CREATE TABLE lace_links (
         user_id TEXT NOT NULL, fact_id INTEGER NOT NULL, rank INTEGER NOT NULL,
         neighbour_id INTEGER NOT NULL, cosine REAL NOT NULL,
         PRIMARY KEY (user_id, fact_id, rank),
         FOREIGN KEY (user_id, fact_id) REFERENCES lace_facts (user_id, fact_id)
           ON DELETE CASCADE,
         FOREIGN KEY (user_id, neighbour_id) REFERENCES lace_facts (user_id, fact_id)
           ON DELETE CASCADE)""",
    # Indexes on LaceMem's foreign keys (a cascaded delete scanned the child tables).
    "CREATE INDEX lace_facts_by_turn ON lace_facts (user_id, turn_id)",
    "CREATE INDEX lace_links_by_neighbour ON lace_links (user_id, neighbour_id)",
)


def next_write(db: sqlite3.Connection) -> int:
  """The bank-wide write counter, advanced (it never repeats, not even after a deletion)."""
  db.execute("UPDATE bank_writes SET n = n + 1")
  return db.execute("SELECT n FROM bank_writes").fetchone()[0]


def open_schema(db: sqlite3.Connection, cipher: Cipher, where: str) -> None:
  """Creates the schema in a new file, refuses a bank of another version, and checks the key;
  inside the caller's write transaction, so a refused key leaves the file as it was."""
  tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
  new = "schema_version" not in tables
  if new and tables:
    raise BankFileError(f"{where} is an SQLite file but not a memory bank (it has tables "
                        f"{sorted(tables)[:5]}); pick another path")
  if new:
    db.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    db.execute("INSERT INTO schema_version VALUES (?)", (VERSION,))
    for statement in SCHEMA:
      db.execute(statement)
    check = cipher.seal_bytes(KEY_CHECK).decode("ascii", "replace")
    db.executemany("INSERT INTO bank_meta VALUES (?, ?)", [
        ("encryption", "fernet" if cipher.encrypted else "none"), ("key_check", check)])
  version = db.execute("SELECT version FROM schema_version").fetchone()[0]
  if version != VERSION:
    raise another_version(where, f"schema version {version}", f"schema version {VERSION}",
                          "open it with the rmmjax that wrote it, or start a new bank",
                          BankFileError)
  meta = dict(db.execute("SELECT name, value FROM bank_meta"))
  if meta["encryption"] == "fernet" and not cipher.encrypted:
    raise BankKeyError(f"{where} is encrypted: open it with its key (set {KEY_ENV})")
  if meta["encryption"] != "fernet" and cipher.encrypted:
    raise BankKeyError(f"{where} is not encrypted, so a key is refused (its rows would mix plain "
                       f"and encrypted): open it without a key, or export_user and import_user "
                       f"into a new encrypted bank")
  if cipher.encrypted:
    try:
      cipher.open_bytes(meta["key_check"].encode("ascii"))
    except BankKeyError:
      raise BankKeyError(f"the key does not open {where} (it was encrypted with another "
                         f"key)") from None


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
