"""LaceMem's three layers as rows of the memory bank file, per user, in the caller's transaction.

A save replaces the whole or appends what is new (docs/memory.md): a turn added to a LaceMem of
10,000 facts writes a few rows. The Raw layer is its own table, not the bank's turns: a layered
memory is rebuilt and replaced as a unit. The Edge layer is stored as each fact's ranked semantic
neighbour list (the other links follow from the facts' order and the settings). The links'
cosines go through the bank's cipher like text and vectors do: a cosine says how alike two facts
are.
"""

from __future__ import annotations

import json
import sqlite3

import numpy as np

from rmmjax.memory._embedding_rows import open_vector
from rmmjax.memory._schema import next_write
from rmmjax.memory.crypto import Cipher
from rmmjax.memory.records import BankFileError, LaceSaved, LaceSnapshot
from rmmjax.retrieve.evidence import Fact, RawTurn


def seal_cosine(cipher: Cipher, cosine: float) -> float | bytes:
  """A link's cosine as stored: a float, or a sealed float32 in an encrypted bank."""
  return cipher.seal_bytes(np.float32(cosine).tobytes()) if cipher.encrypted else cosine


def _open_cosine(cipher: Cipher, stored: float | bytes) -> float:
  if isinstance(stored, (bytes, memoryview)):
    return float(np.frombuffer(cipher.open_bytes(stored), np.float32)[0])
  return float(np.float32(stored))


def write_rows(db: sqlite3.Connection, cipher: Cipher, user: str, snap: LaceSnapshot) -> int:
  """Replaces the user's layered memory with snap; returns its revision."""
  vectors = np.ascontiguousarray(snap.vectors, np.float32)
  revision = next_write(db)
  db.execute("DELETE FROM lace_meta WHERE user_id = ?", (user,))  # cascades to the layers
  db.execute("INSERT INTO lace_meta (user_id, settings, encoder, dim, fallbacks, revision) "
             "VALUES (?, ?, ?, ?, ?, ?)",
             (user, json.dumps(snap.settings, sort_keys=True), snap.encoder,
              vectors.shape[1] if vectors.ndim == 2 else 0, snap.fallbacks, revision))
  lists: dict[int, list[tuple[int, float]]] = {}
  for i, j, cos in snap.links:
    lists.setdefault(i, []).append((j, cos))
  _insert(db, cipher, user, snap, LaceSaved(revision, 0, 0), lists)
  return revision


def append_rows(db: sqlite3.Connection, cipher: Cipher, user: str, snap: LaceSnapshot,
                since: LaceSaved, lists: dict[int, list[tuple[int, float]]]) -> int | None:
  """Writes what snap added since `since` (its turns and facts beyond those counts, and the
  neighbour lists in `lists`); returns the new revision, or None (nothing written) when another
  process saved after `since.revision`."""
  row = db.execute("SELECT revision, dim FROM lace_meta WHERE user_id = ?", (user,)).fetchone()
  if row is None or row[0] != since.revision or (row[1] == 0 and len(snap.facts)):
    return None  # (a LaceMem saved before it had facts has no dimension yet: write it whole)
  revision = next_write(db)
  db.execute("UPDATE lace_meta SET fallbacks = ?, revision = ? WHERE user_id = ?",
             (snap.fallbacks, revision, user))
  old = [i for i in lists if i < since.facts]
  db.executemany("DELETE FROM lace_links WHERE user_id = ? AND fact_id = ?",
                 [(user, i) for i in old])
  _insert(db, cipher, user, snap, since, lists)
  return revision


def _insert(db: sqlite3.Connection, cipher: Cipher, user: str, snap: LaceSnapshot, since: LaceSaved,
            lists: dict[int, list[tuple[int, float]]]) -> None:
  seal, seal_bytes = cipher.seal_text, cipher.seal_bytes
  vectors = np.ascontiguousarray(snap.vectors, np.float32)
  db.executemany("INSERT INTO lace_turns VALUES (?, ?, ?, ?, ?, ?, ?)", [
      (user, t.turn_id, o, t.session_id, t.date, seal(t.speaker), seal(t.text))
      for o, t in enumerate(snap.turns) if o >= since.turns])
  db.executemany("INSERT INTO lace_facts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", [
      (user, f.fact_id, f.turn_id, seal(f.subject), seal(f.predicate), seal(f.object),
       f.time, seal(f.text), seal_bytes(vectors[f.fact_id].tobytes()))
      for f in snap.facts[since.facts:]])
  db.executemany("INSERT INTO lace_links VALUES (?, ?, ?, ?, ?)", [
      (user, i, rank, j, seal_cosine(cipher, cos))
      for i in sorted(lists) for rank, (j, cos) in enumerate(lists[i])])


def read_rows(db: sqlite3.Connection, cipher: Cipher, user: str, where: str) -> LaceSnapshot | None:
  """The user's layered memory as stored, or None when none is."""
  opened = cipher.open_text
  meta = db.execute("SELECT settings, encoder, dim, fallbacks, revision FROM lace_meta WHERE "
                    "user_id = ?", (user,)).fetchone()
  if meta is None:
    return None
  settings, encoder, dim, fallbacks, revision = meta
  turns = [RawTurn(t, s, d, opened(speaker), opened(text)) for t, s, d, speaker, text in
           db.execute("SELECT turn_id, session_id, date, speaker, text FROM lace_turns "
                      "WHERE user_id = ? ORDER BY ordinal", (user,))]
  sessions = {t.turn_id: t.session_id for t in turns}
  facts, vectors = [], []
  for row in db.execute("SELECT fact_id, turn_id, subject, predicate, object, time, text, "
                        "vector FROM lace_facts WHERE user_id = ? ORDER BY fact_id", (user,)):
    fact_id, turn_id, subject, predicate, obj, time, text, blob = row
    if fact_id != len(facts):
      raise BankFileError(f"{where}: the LaceMem facts of user {user!r} skip from id "
                          f"{len(facts) - 1} to {fact_id}: the file is corrupt")
    facts.append(Fact(fact_id, opened(subject), opened(predicate), opened(obj), time,
                      turn_id, sessions[turn_id], opened(text)))
    vectors.append(open_vector(cipher, dim, blob, f"{where}: LaceMem fact {fact_id}"))
  links = [(i, j, _open_cosine(cipher, c)) for i, j, c in db.execute(
      "SELECT fact_id, neighbour_id, cosine FROM lace_links WHERE user_id = ? "
      "ORDER BY fact_id, rank", (user,))]
  matrix = np.stack(vectors) if vectors else np.zeros((0, dim), np.float32)
  return LaceSnapshot(json.loads(settings), encoder, fallbacks, turns, facts, matrix, links,
                  revision)
