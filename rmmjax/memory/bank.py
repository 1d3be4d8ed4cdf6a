"""The persistent per-user memory bank: raw turns, topic memories, their snippets and embeddings.

One SQLite file (`_schema.py`); every query filters by the user it names, so another user's
memory id is refused like one that does not exist. Its promises to concurrent writers:
docs/memory.md."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import final

import numpy as np

from rmmjax.io.outputs import can_create_in
from rmmjax.memory import _embedding_rows as emb
from rmmjax.memory import _lace_rows as lace_rows
from rmmjax.memory import _schema as schema_sql
from rmmjax.memory import _user_rows as rows
from rmmjax.memory import portable
from rmmjax.memory._schema import connect, transaction
from rmmjax.memory.crypto import Cipher, FernetCipher
from rmmjax.memory.records import (
    BankFileError, BankTurn, LaceSaved, LaceSnapshot, Memory, Merge, NewMemory, ReflectionInput,
    SessionInfo, UnknownRecord, chat_turn_rows, reflection_items, select_in,
    text_arg, turn_rows, vector_arg)

# Long enough to outlast another process's largest write (one reflection, one import).
BUSY_TIMEOUT_S = 60.0
# Called inside apply_reflection's transaction, after its rows are written and before it commits.
# Only tests set it: they kill the process there to check that nothing of it survives.
_inside_reflection: Callable[[], None] | None = None


@final
class MemoryBank:
  """A bank file; every method is scoped to one user id and each write is one transaction."""

  def __init__(self, path: str | Path, *, key: bytes | None = None):
    self.path = Path(path)
    where = self.where = f"memory bank {self.path}"
    if self.path.is_dir():
      raise BankFileError(f"{self.where} is a directory; expected an SQLite file "
                          f"such as {self.path / 'memory.sqlite'}")
    if not self.path.parent.is_dir():
      raise BankFileError(f"{self.where}: its folder {self.path.parent} does not "
                          f"exist; create it first")
    self.cipher: Cipher = Cipher() if key is None else FernetCipher(key, where)
    self._db: sqlite3.Connection | None = None
    try:
      self._db = connect(self.path, BUSY_TIMEOUT_S, where)
      with self._writing() as db:
        schema_sql.open_schema(db, self.cipher, self.where)
    except BaseException as err:
      self.close()
      if not isinstance(err, sqlite3.Error):
        raise
      if not can_create_in(self.path.parent):
        raise BankFileError(f"{where} cannot be opened: its folder {self.path.parent} is not "
                            f"writable, and SQLite keeps a -wal and a -shm file beside a bank, "
                            f"even to read it; copy the bank to a writable folder") from None
      raise BankFileError(f"{where} cannot be opened (sqlite: {err}): the file is corrupt or "
                          f"not a memory bank; pick another path") from None

  def close(self) -> None:
    if self._db is not None:
      self._db.close()
      self._db = None

  def __enter__(self) -> MemoryBank:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _writing(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    return transaction(self._db, "BEGIN IMMEDIATE", self.where)

  def _reading(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
    """One read transaction: every query inside it sees the same snapshot."""
    return transaction(self._db, "BEGIN", self.where)

  def _version(self, db: sqlite3.Connection, user: str) -> int:
    """The user's memory_version (inside a transaction); UnknownRecord when there is no user."""
    row = db.execute("SELECT version FROM users WHERE user_id = ?", (user,)).fetchone()
    if row is None:
      raise UnknownRecord(f"{self.where} has no user {user!r}")
    return row[0]

  def _require_user(self, db: sqlite3.Connection, user: str) -> str:
    self._version(db, user)
    return user

  @staticmethod
  def _bump(db: sqlite3.Connection, user: str) -> None:
    """Gives the user's memories a new version, in the transaction that changes them."""
    db.execute("UPDATE users SET version = ? WHERE user_id = ?", (schema_sql.next_write(db), user))

  def _insert_user(self, db: sqlite3.Connection, user: str, exist_ok: bool = False,
                   remedy: str = "") -> bool:
    """Whether the user was inserted; one the bank has is refused, or left with exist_ok."""
    inserted = db.execute("INSERT OR IGNORE INTO users (user_id) VALUES (?)", (user,)).rowcount
    if not inserted and not exist_ok:
      raise ValueError(f"user {user!r} is already in {self.where}{remedy}")
    return bool(inserted)

  def add_user(self, user: str, *, exist_ok: bool = False) -> None:
    with self._writing() as db:
      if self._insert_user(db, text_arg(user, "user"), exist_ok):
        self._bump(db, user)

  def users(self) -> list[str]:
    with self._reading() as db:
      return [r[0] for r in db.execute("SELECT user_id FROM users ORDER BY user_id")]

  def has_user(self, user: str) -> bool:
    with self._reading() as db:
      return db.execute("SELECT 1 FROM users WHERE user_id = ?", (user,)).fetchone() is not None

  def memory_version(self, user: str) -> int:
    """A number that changes in every transaction that changes the user's memories or their
    embeddings, and never repeats: one row lookup tells a search index to rebuild."""
    with self._reading() as db:
      return self._version(db, user)

  # Sessions and turns -----------------------------------------------------------------------

  def start_session(self, user: str, session_id: str, date: str) -> None:
    """Opens a session of the given id (origin api: only add_turns appends to it)."""
    with self._writing() as db:
      rows.insert_session(db, self._require_user(db, user), session_id, date, "api")

  def add_turns(self, user: str, session_id: str, turns: Iterable[tuple[str, str, str]]) -> None:
    """Appends (turn_id, speaker, text) turns to a session of origin api that has not ended."""
    turns = turn_rows(turns)
    with self._writing() as db:
      info = rows.require_session(db, self._require_user(db, user), session_id)
      self._own_session(info, user, "api")
      rows.insert_turns(db, self.cipher, user, info, turns)

  @staticmethod
  def _own_session(info: SessionInfo, user: str, origin: str) -> None:
    if info.origin != origin:
      raise ValueError(f"session {info.session_id!r} of user {user!r} was opened by {info.origin}"
                       f"; a writer ({origin}) never appends to a session it did not open")

  def append_chat(self, user: str, turns: Sequence[tuple[str, ...]],
                  date: str) -> tuple[str, list[str]]:
    """Appends (speaker, text[, kind]) turns to the user's open chat session, opening one
    (dated `date`) when there is none; returns (session id, turn ids)."""
    texts, kinds = chat_turn_rows(turns)
    with self._writing() as db:
      self._require_user(db, user)
      info = rows.newest_open(db, user, "chat") or rows.insert_session(
          db, user, rows.new_chat_session_id(db, user), date, "chat")
      ids = rows.next_turn_ids(db, user, info.session_id, len(texts))
      rows.insert_turns(db, self.cipher, user, info,
                        [(t, s, x) for t, (s, x) in zip(ids, texts, strict=True)], kinds)
    return info.session_id, ids

  def open_session(self, user: str, origin: str) -> SessionInfo | None:
    """The user's newest session of this origin that has not ended, or None."""
    with self._reading() as db:
      return rows.newest_open(db, self._require_user(db, user), origin)

  def ingest_session(self, user: str, session_id: str, date: str,
                     turns: Sequence[tuple[str, str, str]]) -> tuple[bool, int]:
    """Makes the bank hold a dataset's session (opened by ingest) with these turns, in one
    transaction: opens it, or appends the turns it lacks; returns (ended, turns added). A
    session of that id with another date, other turns or another origin is refused."""
    turns = turn_rows(turns)
    with self._writing() as db:
      self._require_user(db, user)
      info = rows.session(db, user, session_id) or rows.insert_session(
          db, user, session_id, date, "ingest")
      self._own_session(info, user, "ingest")
      stored, wanted = rows.turn_ids(db, user, session_id), [t[0] for t in turns]
      if info.date != date or stored != wanted[:len(stored)] or (
          info.ended and len(stored) != len(wanted)):
        raise ValueError(f"{self.path}: user {user!r} already has a session {session_id!r} "
                         f"(date {info.date!r}, {len(stored)} turns) that differs from the one "
                         f"being ingested (date {date!r}, {len(wanted)} turns); ingest into "
                         f"another bank or user")
      if info.ended or len(stored) == len(wanted):
        return info.ended, 0
      rows.insert_turns(db, self.cipher, user, info, turns[len(stored):])
      return False, len(wanted) - len(stored)

  def turns(self, user: str, session_id: str | None = None) -> list[BankTurn]:
    """The user's turns (of one session where given), in session then turn order."""
    with self._reading() as db:
      self._require_user(db, user)
      if session_id is not None:
        rows.require_session(db, user, session_id)
      return rows.turns(db, self.cipher, user, session_id)

  def turns_not_in(self, user: str, have: set[str], kind: str = "statement") -> list[BankTurn]:
    """The user's turns of this kind (KINDS) whose ids are not in `have`, in session then turn
    order, read in one snapshot: what a derived layer (LaceMem) still lacks."""
    with self._reading() as db:
      return rows.turns_not_in(db, self.cipher, self._require_user(db, user), set(have), kind)

  def sessions(self, user: str) -> list[SessionInfo]:
    with self._reading() as db:
      return rows.sessions(db, self._require_user(db, user))

  # Memories and their embeddings ------------------------------------------------------------

  def memories(self, user: str) -> list[Memory]:
    """The user's topic memories, oldest first, each with its snippets in the order added."""
    with self._reading() as db:
      return rows.memories(db, self.cipher, self._require_user(db, user))

  def memory_snapshot(self, user: str, encoder: str) -> tuple[int, list[Memory], np.ndarray]:
    """(memory_version, memories oldest first, their encoder embeddings in that order, N x D)
    from one snapshot: what a search index is built from (three reads could mix two writes)."""
    with self._reading() as db:
      version = self._version(db, user)
      # Both in memory id order: the matrix refuses unless every memory has encoder's embedding.
      _, vectors = emb.matrix(db, self.cipher, user, encoder, self.where)
      return version, rows.memories(db, self.cipher, user), vectors

  def put_embeddings(self, user: str, encoder: str, memory_ids: Sequence[int],
                     vectors: np.ndarray) -> None:
    """Stores (or replaces) encoder's embeddings of some of the user's memories."""
    vectors = vector_arg(vectors, "vectors", ndim=2)
    with self._writing() as db:
      self._own_memories(db, self._require_user(db, user), memory_ids)
      for m, v in zip(memory_ids, vectors, strict=True):
        emb.put_vector(db, self.cipher, user, int(m), encoder, v)
      emb.check_dims(db, user, encoder)
      self._bump(db, user)

  def _own_memories(self, db: sqlite3.Connection, user: str, memory_ids: Sequence[int]) -> None:
    ids = [int(m) for m in memory_ids]
    found = {r[0] for r in select_in(db, "SELECT memory_id FROM memories WHERE user_id = ? AND "
                                      "memory_id IN ({})", (user,), ids)}
    if unknown := [m for m in ids if m not in found]:
      # The same words whether the id is another user's or nobody's.
      raise UnknownRecord(f"user {user!r} has no memory {unknown[0]}")

  # Prospective Reflection -------------------------------------------------------------------

  def reflection_input(self, user: str, session_id: str, encoder: str) -> ReflectionInput:
    """The session (refused once it has ended), its turns and the user's memories with
    encoder's embeddings, read from one snapshot (pass it to apply_reflection)."""
    with self._reading() as db:
      version = self._version(db, user)
      info = rows.require_unended(db, user, session_id)
      _, vectors = emb.matrix(db, self.cipher, user, encoder, self.where)  # by memory id
      return ReflectionInput(info, rows.turns(db, self.cipher, user, session_id),
                             rows.memories(db, self.cipher, user), vectors, version)

  def apply_reflection(self, user: str, session_id: str, adds: Sequence[NewMemory],
                       merges: Sequence[Merge], encoder: str, *, now: float | None = None,
                       expect: ReflectionInput | None = None) -> list[int]:
    """Adds and merges memories and ends the session, in one transaction; returns the ids
    written, adds then merges. With `expect` (the reflection_input they were computed from),
    StaleRead when the user's memories or the session's turns changed since."""
    adds, merges = reflection_items(adds, merges)
    now = time.time() if now is None else float(now)
    turn_ids = list(dict.fromkeys(t for item in [*adds, *merges] for t in item.turn_ids))
    with self._writing() as db:
      version = self._version(db, user)
      rows.require_unended(db, user, session_id)
      if expect is not None:
        rows.check_unchanged(db, user, session_id, expect, version)
      self._own_memories(db, user, [m.memory_id for m in merges])
      emb.require_encoder(db, user, encoder, "this reflection")
      turns = {r[0]: r[1:] for r in select_in(
          db, "SELECT turn_id, session_id, date, text FROM turns WHERE user_id = ? AND turn_id "
          "IN ({})", (user,), turn_ids)}
      if unknown := [t for t in turn_ids if t not in turns]:
        raise UnknownRecord(f"user {user!r} has no turn {unknown[0]!r} (snippets must name "
                            f"the user's stored turns)")
      ids = [rows.write_memory(db, self.cipher, user, item, turns, encoder, now)
             for item in [*adds, *merges]]
      emb.check_dims(db, user, encoder)
      self._bump(db, user)
      if _inside_reflection is not None:
        _inside_reflection()
      db.execute("UPDATE sessions SET ended = 1 WHERE user_id = ? AND session_id = ?",
                 (user, session_id))
    return ids

  # LaceMem's layers --------------------------------------------------------------------------

  def load_lace(self, user: str) -> LaceSnapshot | None:
    """The user's saved LaceMem (None when there is none), read in one snapshot."""
    with self._reading() as db:
      return lace_rows.read_rows(db, self.cipher, self._require_user(db, user), self.where)

  def save_lace(self, user: str, snap: LaceSnapshot,
                since: LaceSaved | None = None,
                lists: dict[int, list[tuple[int, float]]] | None = None) -> int:
    """Stores snap as the user's LaceMem; returns its revision. With `since` (its last save or
    load) and `lists` (the neighbour lists that are new or changed) only what is new is
    written, unless another save came in between (LaceMem.save)."""
    with self._writing() as db:
      self._require_user(db, user)
      revision = None if since is None else lace_rows.append_rows(
          db, self.cipher, user, snap, since, lists or {})
      return lace_rows.write_rows(db, self.cipher, user, snap) if revision is None else revision

  # The whole user ---------------------------------------------------------------------------

  def export_user(self, user: str) -> dict:
    """Everything the bank holds of one user, as plain JSON values (decrypted)."""
    with self._reading() as db:
      return portable.export(db, self.cipher, self._require_user(db, user), self.where)

  def import_user(self, data: dict, *, user: str | None = None) -> str:
    """Loads what export_user gave into a user this bank does not have; returns the user id."""
    parsed = portable.parse(data)
    user = text_arg(parsed.user if user is None else user, "user")
    with self._writing() as db:
      self._insert_user(db, user, remedy="; import_user only fills a new user (delete_user "
                        "first to replace one)")
      portable.write(db, self.cipher, parsed, user)
      self._bump(db, user)
    return user

  def delete_user(self, user: str) -> None:
    """Removes every row of the user from every table, then clears the write-ahead log."""
    with self._writing() as db:
      self._require_user(db, user)
      # Deferred: the tables are emptied in any order and the keys are checked at commit.
      db.execute("PRAGMA defer_foreign_keys = ON")
      tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                         "AND name != 'users' ORDER BY name")]
      for table in [*tables, "users"]:
        if "user_id" in {c[1] for c in db.execute(f'PRAGMA table_info("{table}")')}:
          db.execute(f'DELETE FROM "{table}" WHERE user_id = ?', (user,))
      schema_sql.next_write(db)  # a user of that name starts anew
    # secure_delete zeroed the rows in the pages; the log still holds their old copies until a
    # checkpoint (a reader of another process may keep it from finishing: best effort).
    with contextlib.suppress(sqlite3.Error):
      self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
