"""One user's rows of the sessions, turns and memories tables, inside the caller's transaction
(ids a writer does not bring are chosen here, under the bank's write lock: docs/memory.md)."""

from __future__ import annotations

import sqlite3

import numpy as np

from rmmjax.memory import _embedding_rows as emb
from rmmjax.memory.crypto import Cipher
from rmmjax.memory._embedding_rows import MEMORY
from rmmjax.memory.records import (
    BankTurn, Memory, Merge, NewMemory, ReflectionInput, SessionEnded, SessionInfo,
    Snippet, StaleRead, UnknownRecord, select_in)

CHAT_PREFIX = "chat-"  # chat sessions are chat-1, chat-2, ...; datasets name their own


def sessions(db: sqlite3.Connection, user: str, where: str = "",
             params: tuple = ()) -> list[SessionInfo]:
  """The user's sessions (those that the SQL condition `where` keeps), oldest first."""
  return [SessionInfo(s, d, o, bool(e), origin) for s, d, o, e, origin in db.execute(
      f"SELECT session_id, date, ordinal, ended, origin FROM sessions WHERE user_id = ? {where} "
      f"ORDER BY ordinal", (user, *params))]


def session(db: sqlite3.Connection, user: str, session_id: str) -> SessionInfo | None:
  return next(iter(sessions(db, user, "AND session_id = ?", (session_id,))), None)


def require_session(db: sqlite3.Connection, user: str, session_id: str) -> SessionInfo:
  if (found := session(db, user, session_id)) is None:
    raise UnknownRecord(f"user {user!r} has no session {session_id!r}")
  return found


def require_unended(db: sqlite3.Connection, user: str, session_id: str) -> SessionInfo:
  """The session, refused once its reflection is applied (by this process or another one)."""
  if (found := require_session(db, user, session_id)).ended:
    raise SessionEnded(f"session {session_id!r} of user {user!r} has ended: its reflection "
                       f"is already applied")
  return found


def newest_open(db: sqlite3.Connection, user: str, origin: str) -> SessionInfo | None:
  """The user's most recent session of this origin that has not ended."""
  return ([None] + sessions(db, user, "AND origin = ? AND ended = 0", (origin,)))[-1]


def insert_session(db: sqlite3.Connection, user: str, session_id: str, date: str,
                   origin: str) -> SessionInfo:
  if session(db, user, session_id) is not None:
    raise ValueError(f"user {user!r} already has session {session_id!r}")
  db.execute("INSERT INTO sessions (user_id, session_id, date, ordinal, ended, origin) "
             "SELECT ?, ?, ?, COALESCE(MAX(ordinal) + 1, 0), 0, ? FROM sessions "
             "WHERE user_id = ?", (user, session_id, date, origin, user))
  return require_session(db, user, session_id)


def new_chat_session_id(db: sqlite3.Connection, user: str) -> str:
  """chat-<n> for the first n above every chat session the user has (never a dataset's id)."""
  n = 1 + db.execute("SELECT COUNT(*) FROM sessions WHERE user_id = ? AND origin = 'chat'",
                     (user,)).fetchone()[0]
  while session(db, user, f"{CHAT_PREFIX}{n}") is not None:
    n += 1
  return f"{CHAT_PREFIX}{n}"


def turn_count(db: sqlite3.Connection, user: str, session_id: str) -> int:
  return db.execute("SELECT COUNT(*) FROM turns WHERE user_id = ? AND session_id = ?",
                    (user, session_id)).fetchone()[0]


def turn_ids(db: sqlite3.Connection, user: str, session_id: str) -> list[str]:
  return [r[0] for r in db.execute("SELECT turn_id FROM turns WHERE user_id = ? AND "
                                   "session_id = ? ORDER BY ordinal", (user, session_id))]


def next_turn_ids(db: sqlite3.Connection, user: str, session_id: str, n: int) -> list[str]:
  """n fresh turn ids <session>:<position>, continuing the session's numbering."""
  start = turn_count(db, user, session_id) + 1
  ids: list[str] = []
  while len(ids) < n:
    candidate = f"{session_id}:{start}"
    start += 1
    if not db.execute("SELECT 1 FROM turns WHERE user_id = ? AND turn_id = ?",
                      (user, candidate)).fetchone():
      ids.append(candidate)
  return ids


def insert_turns(db: sqlite3.Connection, cipher: Cipher, user: str, info: SessionInfo,
                 rows: list[tuple[str, str, str]], kinds: list[str] | None = None) -> None:
  """Appends (turn_id, speaker, text) rows to a session that has not ended, each of its kind
  (KINDS; statements by default)."""
  if info.ended:
    raise SessionEnded(f"session {info.session_id!r} of user {user!r} has ended (its "
                       f"reflection is applied); start a new session for more turns")
  taken = select_in(db, "SELECT turn_id, session_id FROM turns WHERE user_id = ? AND "
                    "turn_id IN ({})", (user,), [r[0] for r in rows])
  if taken:
    raise ValueError(f"user {user!r} already has turn {taken[0][0]!r} (in session "
                     f"{taken[0][1]!r}); turn ids must be unique per user")
  start = db.execute("SELECT COALESCE(MAX(ordinal) + 1, 0) FROM turns WHERE user_id = ? AND "
                     "session_id = ?", (user, info.session_id)).fetchone()[0]
  seal = cipher.seal_text
  kinds = kinds or ["statement"] * len(rows)
  db.executemany("INSERT INTO turns (user_id, session_id, turn_id, speaker, text, date, ordinal, "
                 "kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                 [(user, info.session_id, t, seal(speaker), seal(text), info.date, start + i, k)
                  for i, ((t, speaker, text), k) in enumerate(zip(rows, kinds, strict=True))])


def turns(db: sqlite3.Connection, cipher: Cipher, user: str,
          session_id: str | None) -> list[BankTurn]:
  rows = db.execute(
      "SELECT t.turn_id, t.session_id, t.speaker, t.text, t.date, t.kind FROM turns t JOIN "
      "sessions s USING (user_id, session_id) WHERE t.user_id = ? AND (? IS NULL OR "
      "t.session_id = ?) ORDER BY s.ordinal, t.ordinal", (user, session_id, session_id))
  return [BankTurn(t, s, cipher.open_text(speaker), cipher.open_text(text), d, kind)
          for t, s, speaker, text, d, kind in rows]


def turns_not_in(db: sqlite3.Connection, cipher: Cipher, user: str, have: set[str],
                 kind: str) -> list[BankTurn]:
  """MemoryBank.turns_not_in: the ids are listed first (no text is opened), then only the
  missing rows are read."""
  ids = [t for t, k in db.execute(
      "SELECT t.turn_id, t.kind FROM turns t JOIN sessions s USING (user_id, session_id) WHERE "
      "t.user_id = ? ORDER BY s.ordinal, t.ordinal", (user,)) if k == kind and t not in have]
  rows = {r[0]: r for r in select_in(
      db, "SELECT turn_id, session_id, speaker, text, date, kind FROM turns WHERE user_id = ? "
      "AND turn_id IN ({})", (user,), ids)}
  return [BankTurn(t, rows[t][1], cipher.open_text(rows[t][2]), cipher.open_text(rows[t][3]),
                   rows[t][4], rows[t][5]) for t in ids]


def memories(db: sqlite3.Connection, cipher: Cipher, user: str) -> list[Memory]:
  snippets: dict[int, list[Snippet]] = {}
  for m, t, s, d, text in db.execute(
      "SELECT memory_id, turn_id, session_id, date, text FROM snippets WHERE user_id = ? "
      "ORDER BY memory_id, ordinal", (user,)):
    snippets.setdefault(m, []).append(Snippet(t, s, d, cipher.open_text(text)))
  return [Memory(m, cipher.open_text(summary), tuple(snippets.get(m, ())), c, u)
          for m, summary, c, u in db.execute(
              "SELECT memory_id, summary, created, updated FROM memories WHERE user_id = ? "
              "ORDER BY memory_id", (user,))]


def check_unchanged(db: sqlite3.Connection, user: str, session_id: str,
                    expect: ReflectionInput, version: int) -> None:
  """StaleRead when the user's memories (now at `version`) or the session's turns changed
  since `expect` was read."""
  held = turn_count(db, user, session_id)
  if version != expect.version or held != len(expect.turns):
    raise StaleRead(f"user {user!r} changed while session {session_id!r} was being reflected "
                    f"(memory version {expect.version} -> {version}, session turns "
                    f"{len(expect.turns)} -> {held})")


def write_memory(db: sqlite3.Connection, cipher: Cipher, user: str, item: NewMemory | Merge,
                 turns: dict, encoder: str, now: float) -> int:
  """Writes one add (a new memory) or merge (a new summary, more snippets) with its
  embedding; returns the memory's id. `turns` maps a turn id to (session, date, text)."""
  if isinstance(item, NewMemory):
    memory_id = db.execute("INSERT INTO memories (user_id, summary, created, updated) "
                           "VALUES (?, ?, ?, ?)", (user, cipher.seal_text(item.summary),
                                                   now, now)).lastrowid
  else:
    memory_id = int(item.memory_id)
    db.execute("UPDATE memories SET summary = ?, updated = ? WHERE memory_id = ? AND "
               "user_id = ?", (cipher.seal_text(item.summary), now, memory_id, user))
    # The old summary's embeddings from other encoders no longer describe it.
    db.execute("DELETE FROM embeddings WHERE kind = ? AND owner_id = ? AND encoder != ?",
               (MEMORY, memory_id, encoder))
  # A merge keeps every old snippet and appends the new turns it does not have yet.
  db.executemany(
      "INSERT OR IGNORE INTO snippets SELECT ?, ?, ?, ?, ?, ?, COALESCE(MAX(ordinal) + 1, "
      "0) FROM snippets WHERE memory_id = ?",
      [(memory_id, user, t, *turns[t], memory_id) for t in dict.fromkeys(item.turn_ids)])
  emb.put_vector(db, cipher, user, memory_id, encoder, np.asarray(item.embedding, np.float32))
  return memory_id
