"""The persistent per-user memory bank: raw turns, topic memories, their snippets and embeddings.

One SQLite file (WAL mode, so readers never wait for a writer, and a busy timeout, so writers
queue instead of failing). Every call names one user and every query filters by that user; a
memory id of another user is refused exactly like one that does not exist. Every write is one
transaction, so a process killed in the middle leaves the bank as it was before the call.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import final

import numpy as np

from rmmjax.memory import embedding_rows as emb
from rmmjax.memory import portable, schema_sql
from rmmjax.memory.crypto import Cipher, FernetCipher, PlainCipher
from rmmjax.memory.embedding_rows import MEMORY
from rmmjax.memory.records import (
    BankFileError, BankTurn, Memory, Merge, NewMemory, SessionInfo, Snippet, UnknownRecord,
    repeated, select_in, string_arg, text_arg, turn_rows, vector_arg)

# Long enough to outlast another process's largest write (one reflection, one import).
BUSY_TIMEOUT_S = 60.0
# Called inside apply_reflection's transaction, after its rows are written and before it commits.
# Only tests set it: they kill the process there to check that nothing of it survives.
_inside_reflection: Callable[[], None] | None = None


@final
class MemoryBank:
  """A bank file; every method is scoped to one user id and each write is one transaction."""

  def __init__(self, path: str | Path, *, key: bytes | None = None,
               busy_timeout_s: float = BUSY_TIMEOUT_S):
    self.path = Path(path)
    where = self._where = f"memory bank {self.path}"
    if self.path.is_dir():
      raise BankFileError(f"{self._where} is a directory; expected an SQLite file "
                          f"such as {self.path / 'memory.sqlite'}")
    if not self.path.parent.is_dir():
      raise BankFileError(f"{self._where}: its folder {self.path.parent} does not "
                          f"exist; create it first")
    self.cipher: Cipher = PlainCipher() if key is None else FernetCipher(key, where)
    self._db: sqlite3.Connection | None = None
    try:
      # isolation_level None: transactions are begun explicitly (BEGIN IMMEDIATE for writes),
      # so a read-then-write holds the write lock from its first read.
      self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None)
      for pragma in (f"busy_timeout = {int(busy_timeout_s * 1000)}", "foreign_keys = ON",
                     "synchronous = FULL",  # a committed write survives a power cut
                     "secure_delete = ON"):  # deleted personal text is zeroed, not left in pages
        self._db.execute(f"PRAGMA {pragma}")
      mode = self._journal_mode_wal(busy_timeout_s)
      keys = self._db.execute("PRAGMA foreign_keys").fetchone()[0]
      if mode != "wal" or keys != 1:
        raise BankFileError(f"{where}: SQLite gave journal mode {mode!r} and foreign_keys "
                            f"{keys}; a bank needs WAL (a local file) and foreign keys")
      with self._write() as db:
        schema_sql.migrate(db, self.cipher, self._where)
    except sqlite3.Error as err:
      self.close()
      raise BankFileError(f"{where} cannot be opened (sqlite: {err}): the file is corrupt or "
                          f"not a memory bank; pick another path") from None
    except BaseException:
      self.close()
      raise

  def _journal_mode_wal(self, busy_timeout_s: float) -> str:
    """Switches a new file to WAL; the switch needs an exclusive lock and SQLite does not wait
    for it (no busy handler), so processes opening a new bank at once retry here."""
    deadline, pause = time.monotonic() + busy_timeout_s, 0.001
    while True:
      try:
        return self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
      except sqlite3.OperationalError as err:
        if "locked" not in str(err) or time.monotonic() > deadline:
          raise
      time.sleep(pause)
      pause = min(2 * pause, 0.05)

  def close(self) -> None:
    if self._db is not None:
      self._db.close()
      self._db = None

  def __enter__(self) -> MemoryBank:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @contextlib.contextmanager
  def _transaction(self, begin: str) -> Iterator[sqlite3.Connection]:
    if self._db is None:
      raise BankFileError(f"{self._where} is closed")
    db = self._db
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
      raise BankFileError(f"{self._where}: sqlite: {err}") from None

  def _write(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    return self._transaction("BEGIN IMMEDIATE")

  def _read(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    return self._transaction("BEGIN")  # one snapshot for every query of the call

  def _user(self, db: sqlite3.Connection, user: str) -> str:
    text_arg(user, "user")
    if db.execute("SELECT 1 FROM users WHERE user_id = ?", (user,)).fetchone() is None:
      raise UnknownRecord(f"{self._where} has no user {user!r}")
    return user

  def _session(self, db: sqlite3.Connection, user: str, session_id: str) -> tuple[str, bool]:
    """(date, ended) of one of the user's sessions."""
    row = db.execute("SELECT date, ended FROM sessions WHERE user_id = ? AND session_id = ?",
                     (self._user(db, user), text_arg(session_id, "session_id"))).fetchone()
    if row is None:
      raise UnknownRecord(f"user {user!r} has no session {session_id!r}")
    return row[0], bool(row[1])

  def add_user(self, user: str) -> None:
    with self._write() as db:
      if db.execute("SELECT 1 FROM users WHERE user_id = ?", (text_arg(user, "user"),)).fetchone():
        raise ValueError(f"user {user!r} is already in {self._where}")
      db.execute("INSERT INTO users VALUES (?)", (user,))

  def users(self) -> list[str]:
    with self._read() as db:
      return [r[0] for r in db.execute("SELECT user_id FROM users ORDER BY user_id")]

  def has_user(self, user: str) -> bool:
    with self._read() as db:
      return db.execute("SELECT 1 FROM users WHERE user_id = ?",
                        (text_arg(user, "user"),)).fetchone() is not None

  def start_session(self, user: str, session_id: str, date: str) -> None:
    string_arg(date, "date")
    with self._write() as db:
      self._user(db, user)
      if db.execute("SELECT 1 FROM sessions WHERE user_id = ? AND session_id = ?",
                    (user, text_arg(session_id, "session_id"))).fetchone():
        raise ValueError(f"user {user!r} already has session {session_id!r}")
      db.execute("INSERT INTO sessions SELECT ?, ?, ?, COALESCE(MAX(ordinal) + 1, 0), 0 "
                 "FROM sessions WHERE user_id = ?", (user, session_id, date, user))

  def add_turns(self, user: str, session_id: str, turns: Iterable[tuple[str, str, str]]) -> None:
    """Appends (turn_id, speaker, text) turns to a session that has not ended."""
    rows = turn_rows(turns)
    with self._write() as db:
      date, ended = self._session(db, user, session_id)
      if ended:
        raise ValueError(f"session {session_id!r} of user {user!r} has ended (its reflection "
                         f"is applied); start a new session for more turns")
      taken = select_in(db, "SELECT turn_id, session_id FROM turns WHERE user_id = ? AND "
                         "turn_id IN ({})", (user,), [r[0] for r in rows])
      if taken:
        raise ValueError(f"user {user!r} already has turn {taken[0][0]!r} (in session "
                         f"{taken[0][1]!r}); turn ids must be unique per user")
      start = db.execute("SELECT COALESCE(MAX(ordinal) + 1, 0) FROM turns WHERE user_id = ? AND "
                         "session_id = ?", (user, session_id)).fetchone()[0]
      seal = self.cipher.seal_text
      db.executemany("INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?)", [
          (user, session_id, t, seal(speaker), seal(text), date, start + i)
          for i, (t, speaker, text) in enumerate(rows)])

  def turns(self, user: str, session_id: str | None = None) -> list[BankTurn]:
    """The user's turns (of one session where given), in session then turn order."""
    with self._read() as db:
      if session_id is None:
        self._user(db, user)
      else:
        self._session(db, user, session_id)
      return self._turns(db, user, session_id)

  def _turns(self, db: sqlite3.Connection, user: str, session_id: str | None) -> list[BankTurn]:
    rows = db.execute(
        "SELECT t.turn_id, t.session_id, t.speaker, t.text, t.date FROM turns t JOIN sessions s "
        "USING (user_id, session_id) WHERE t.user_id = ? AND (? IS NULL OR t.session_id = ?) "
        "ORDER BY s.ordinal, t.ordinal", (user, session_id, session_id))
    return [BankTurn(t, s, self.cipher.open_text(speaker), self.cipher.open_text(text), d)
            for t, s, speaker, text, d in rows]

  def sessions(self, user: str) -> list[SessionInfo]:
    with self._read() as db:
      self._user(db, user)
      return self._sessions(db, user)

  def _sessions(self, db: sqlite3.Connection, user: str) -> list[SessionInfo]:
    return [SessionInfo(s, d, o, bool(e)) for s, d, o, e in db.execute(
        "SELECT session_id, date, ordinal, ended FROM sessions WHERE user_id = ? "
        "ORDER BY ordinal", (user,))]

  def memory_version(self, user: str) -> tuple[int, float, int]:
    """(count, latest update, largest id) of the user's memories: it changes whenever they do,
    and costs one indexed query (a search index is rebuilt only when it changes)."""
    with self._read() as db:
      return tuple(db.execute(
          "SELECT COUNT(*), COALESCE(MAX(updated), 0), COALESCE(MAX(memory_id), 0) FROM memories "
          "WHERE user_id = ?", (self._user(db, user),)).fetchone())

  def memories(self, user: str) -> list[Memory]:
    """The user's topic memories, oldest first, each with its snippets in the order added."""
    with self._read() as db:
      return self._memories(db, self._user(db, user))

  def _memories(self, db: sqlite3.Connection, user: str) -> list[Memory]:
    snippets: dict[int, list[Snippet]] = {}
    for m, t, s, d, text in db.execute(
        "SELECT memory_id, turn_id, session_id, date, text FROM snippets WHERE user_id = ? "
        "ORDER BY memory_id, ordinal", (user,)):
      snippets.setdefault(m, []).append(Snippet(t, s, d, self.cipher.open_text(text)))
    return [Memory(m, self.cipher.open_text(summary), tuple(snippets.get(m, ())), c, u)
            for m, summary, c, u in db.execute(
                "SELECT memory_id, summary, created, updated FROM memories WHERE user_id = ? "
                "ORDER BY memory_id", (user,))]

  def memory_embeddings(self, user: str, encoder: str) -> tuple[list[int], np.ndarray]:
    """(memory ids, float32 N x D matrix) of the user's memories as embedded by encoder."""
    text_arg(encoder, "encoder")
    with self._read() as db:
      return emb.matrix(db, self.cipher, self._user(db, user), encoder, self._where)

  def put_embeddings(self, user: str, encoder: str, memory_ids: Sequence[int],
                     vectors: np.ndarray) -> None:
    """Stores (or replaces) encoder's embeddings of some of the user's memories."""
    text_arg(encoder, "encoder")
    vectors = vector_arg(vectors, "vectors", ndim=2)
    if vectors.shape[0] != len(memory_ids):
      raise ValueError(f"{len(memory_ids)} memory ids but {vectors.shape[0]} vectors")
    with self._write() as db:
      self._own_memories(db, self._user(db, user), memory_ids)
      for m, v in zip(memory_ids, vectors, strict=True):
        emb.put_vector(db, self.cipher, user, int(m), encoder, v)
      emb.check_dims(db, user, encoder)

  def _own_memories(self, db: sqlite3.Connection, user: str, memory_ids: Sequence[int]) -> None:
    for m in memory_ids:
      if not isinstance(m, (int, np.integer)) or isinstance(m, bool):
        raise ValueError(f"memory ids must be integers, got {m!r}")
    ids = [int(m) for m in memory_ids]
    if len(set(ids)) != len(ids):
      raise ValueError(f"memory ids repeat: {repeated(ids)}")
    found = {r[0] for r in select_in(db, "SELECT memory_id FROM memories WHERE user_id = ? AND "
                                      "memory_id IN ({})", (user,), ids)}
    if unknown := [m for m in ids if m not in found]:
      # The same words whether the id is another user's or nobody's.
      raise UnknownRecord(f"user {user!r} has no memory {unknown[0]}")

  def apply_reflection(self, user: str, session_id: str, adds: Sequence[NewMemory],
                       merges: Sequence[Merge], encoder: str, *,
                       now: float | None = None) -> list[int]:
    """Adds and merges memories and marks the session ended, all in one transaction; returns
    the ids written: one per add (new), then one per merge."""
    adds = [a if isinstance(a, NewMemory) else NewMemory(*a) for a in adds]
    merges = [m if isinstance(m, Merge) else Merge(*m) for m in merges]
    text_arg(encoder, "encoder")
    now = time.time() if now is None else float(now)
    for i, item in enumerate([*adds, *merges]):
      what = f"adds[{i}]" if i < len(adds) else f"merges[{i - len(adds)}]"
      text_arg(item.summary, f"{what} summary")
      vector_arg(item.embedding, f"{what} embedding")
      if isinstance(item.turn_ids, (str, bytes)):
        raise ValueError(f"{what} turn_ids must be a list of turn ids, got {item.turn_ids!r}")
      if isinstance(item, NewMemory) and not list(item.turn_ids):
        raise ValueError(f"{what} has no turn ids; a memory keeps the turns it came from")
    turn_ids = list(dict.fromkeys(t for item in [*adds, *merges] for t in item.turn_ids))
    with self._write() as db:
      _date, ended = self._session(db, user, session_id)
      if ended:
        raise ValueError(f"session {session_id!r} of user {user!r} has ended: its reflection "
                         f"is already applied")
      self._own_memories(db, user, [m.memory_id for m in merges])
      emb.require_encoder(db, user, encoder, "this reflection")
      turns = {r[0]: r[1:] for r in select_in(
          db, "SELECT turn_id, session_id, date, text FROM turns WHERE user_id = ? AND turn_id "
          "IN ({})", (user,), [text_arg(t, "a snippet turn id") for t in turn_ids])}
      if unknown := [t for t in turn_ids if t not in turns]:
        raise UnknownRecord(f"user {user!r} has no turn {unknown[0]!r} (snippets must name "
                            f"the user's stored turns)")
      ids = []
      for item in [*adds, *merges]:
        if isinstance(item, NewMemory):
          memory_id = db.execute("INSERT INTO memories (user_id, summary, created, updated) "
                                 "VALUES (?, ?, ?, ?)", (user, self.cipher.seal_text(item.summary),
                                                         now, now)).lastrowid
        else:
          memory_id = int(item.memory_id)
          db.execute("UPDATE memories SET summary = ?, updated = ? WHERE memory_id = ? AND "
                     "user_id = ?", (self.cipher.seal_text(item.summary), now, memory_id, user))
          # The old summary's embeddings from other encoders no longer describe it.
          db.execute("DELETE FROM embeddings WHERE kind = ? AND owner_id = ? AND encoder != ?",
                     (MEMORY, memory_id, encoder))
        # A merge keeps every old snippet and appends the new turns it does not have yet.
        db.executemany(
            "INSERT OR IGNORE INTO snippets SELECT ?, ?, ?, ?, ?, ?, COALESCE(MAX(ordinal) + 1, "
            "0) FROM snippets WHERE memory_id = ?",
            [(memory_id, user, t, *turns[t], memory_id) for t in dict.fromkeys(item.turn_ids)])
        vector = np.asarray(item.embedding, np.float32)
        emb.put_vector(db, self.cipher, user, memory_id, encoder, vector)
        ids.append(memory_id)
      emb.check_dims(db, user, encoder)
      if _inside_reflection is not None:
        _inside_reflection()
      db.execute("UPDATE sessions SET ended = 1 WHERE user_id = ? AND session_id = ?",
                 (user, session_id))
    return ids

  def export_user(self, user: str) -> dict:
    """Everything the bank holds of one user, as plain JSON values (decrypted)."""
    with self._read() as db:
      self._user(db, user)
      return portable.export(user, self._sessions(db, user), self._turns(db, user, None),
                             self._memories(db, user),
                             emb.by_memory(db, self.cipher, user, self._where))

  def import_user(self, data: dict, *, user: str | None = None) -> str:
    """Loads what export_user gave into a user this bank does not have; returns the user id."""
    parsed = portable.parse(data)
    user = text_arg(parsed.user if user is None else user, "user")
    seal = self.cipher.seal_text
    with self._write() as db:
      if db.execute("SELECT 1 FROM users WHERE user_id = ?", (user,)).fetchone():
        raise ValueError(f"user {user!r} is already in {self._where}; import_user "
                         f"only fills a new user (delete_user first to replace one)")
      db.execute("INSERT INTO users VALUES (?)", (user,))
      db.executemany("INSERT INTO sessions VALUES (?, ?, ?, ?, ?)",
                     [(user, s, d, o, int(e)) for o, (s, d, e) in enumerate(parsed.sessions)])
      db.executemany("INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?)",
                     [(user, s, t, seal(speaker), seal(text), d, o)
                      for s, d, o, t, speaker, text in parsed.turns])
      for summary, created, updated, snippets, embeddings in parsed.memories:
        memory_id = db.execute("INSERT INTO memories (user_id, summary, created, updated) VALUES "
                               "(?, ?, ?, ?)", (user, seal(summary), created, updated)).lastrowid
        db.executemany("INSERT INTO snippets VALUES (?, ?, ?, ?, ?, ?, ?)",
                       [(memory_id, user, t, s, d, seal(text), o)
                        for o, (t, s, d, text) in enumerate(snippets)])
        for encoder, vector in embeddings.items():
          emb.put_vector(db, self.cipher, user, memory_id, encoder, vector)
          emb.check_dims(db, user, encoder)
    return user

  def delete_user(self, user: str) -> None:
    """Removes every row of the user from every table, then clears the write-ahead log."""
    with self._write() as db:
      self._user(db, user)
      # Deferred: the tables are emptied in any order and the keys are checked at commit.
      db.execute("PRAGMA defer_foreign_keys = ON")
      tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                         "AND name != 'users' ORDER BY name")]
      for table in [*tables, "users"]:
        if "user_id" in {c[1] for c in db.execute(f'PRAGMA table_info("{table}")')}:
          db.execute(f'DELETE FROM "{table}" WHERE user_id = ?', (user,))
    # secure_delete zeroed the rows in the pages; the log still holds their old copies until a
    # checkpoint (a reader of another process may keep it from finishing: best effort).
    with contextlib.suppress(sqlite3.Error):
      self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


