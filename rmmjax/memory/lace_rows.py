"""LaceMem's three layers as rows of the memory bank file, per user (tables of schema version 2).

The functions run inside the caller's transaction (LaceMem.save and load, a user's export and
import); a save replaces the user's whole layered memory. The Raw layer is its own
table rather than the bank's turns: a layered memory is rebuilt and replaced as a unit, apart
from the sessions that Prospective Reflection ends. The Edge layer is stored as each fact's
ranked semantic neighbour list; same-turn and same-session links follow from the facts' order
and the saved settings. Text and vectors go through the bank's cipher, as its other rows do.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from typing import final

import numpy as np

from rmmjax.memory.crypto import Cipher
from rmmjax.memory.embedding_rows import open_vector
from rmmjax.memory.records import BankFileError
from rmmjax.retrieve.evidence import Fact, RawTurn


@final
@dataclasses.dataclass(frozen=True)
class Snapshot:
  """Everything a LaceMem holds, as plain values."""

  settings: dict
  encoder: str  # the identity of the encoder that embedded the facts ("" when none did)
  fallbacks: int  # turns the LLM extractor handed to the offline one
  turns: list[RawTurn]  # in the order they were added
  facts: list[Fact]  # by fact id, from 0
  vectors: np.ndarray  # N x D float32, row i embedding fact i
  links: list[tuple[int, int, float]]  # (fact, neighbour, cosine), each fact's list in rank order


def write_rows(db: sqlite3.Connection, cipher: Cipher, user: str, snap: Snapshot) -> None:
  """Replaces the user's layered memory with snap, inside the caller's write transaction."""
  seal, seal_bytes = cipher.seal_text, cipher.seal_bytes
  vectors = np.ascontiguousarray(snap.vectors, np.float32)
  if vectors.shape[0] != len(snap.facts):
    raise ValueError(f"{len(snap.facts)} facts but {vectors.shape[0]} vectors")
  db.execute("DELETE FROM lace_meta WHERE user_id = ?", (user,))  # cascades to the layers
  db.execute("INSERT INTO lace_meta VALUES (?, ?, ?, ?, ?)",
             (user, json.dumps(snap.settings, sort_keys=True), snap.encoder,
              vectors.shape[1] if vectors.ndim == 2 else 0, snap.fallbacks))
  db.executemany("INSERT INTO lace_turns VALUES (?, ?, ?, ?, ?, ?, ?)", [
      (user, t.turn_id, o, t.session_id, t.date, seal(t.speaker), seal(t.text))
      for o, t in enumerate(snap.turns)])
  db.executemany("INSERT INTO lace_facts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", [
      (user, f.fact_id, f.turn_id, seal(f.subject), seal(f.predicate), seal(f.object),
       f.time, seal(f.text), seal_bytes(v.tobytes()))
      for f, v in zip(snap.facts, vectors, strict=True)])
  rank = {}
  rows = []
  for i, j, cos in snap.links:
    rank[i] = rank.get(i, -1) + 1
    rows.append((user, i, rank[i], j, cos))
  db.executemany("INSERT INTO lace_links VALUES (?, ?, ?, ?, ?)", rows)


def read_rows(db: sqlite3.Connection, cipher: Cipher, user: str, where: str) -> Snapshot | None:
  """The user's layered memory as stored, or None when none is; inside the caller's
  transaction."""
  opened = cipher.open_text
  meta = db.execute("SELECT settings, encoder, dim, fallbacks FROM lace_meta WHERE "
                    "user_id = ?", (user,)).fetchone()
  if meta is None:
    return None
  settings, encoder, dim, fallbacks = meta
  turns = [RawTurn(t, s, d, opened(speaker), opened(text)) for t, s, d, speaker, text in
           db.execute("SELECT turn_id, session_id, date, speaker, text FROM lace_turns "
                      "WHERE user_id = ? ORDER BY ordinal", (user,))]
  sessions = {t.turn_id: t.session_id for t in turns}
  facts, vectors = [], []
  for row in db.execute("SELECT fact_id, turn_id, subject, predicate, object, time, text, "
                        "vector FROM lace_facts WHERE user_id = ? ORDER BY fact_id", (user,)):
    fact_id, turn_id, subject, predicate, obj, time, text, blob = row
    if fact_id != len(facts):
      raise BankFileError(f"{where}: user {user!r}'s LaceMem facts skip from id "
                          f"{len(facts) - 1} to {fact_id}: the file is corrupt")
    facts.append(Fact(fact_id, opened(subject), opened(predicate), opened(obj), time,
                      turn_id, sessions[turn_id], opened(text)))
    vectors.append(open_vector(cipher, dim, blob, f"{where}: LaceMem fact {fact_id}"))
  links = _links(db, user)
  matrix = np.stack(vectors) if vectors else np.zeros((0, dim), np.float32)
  return Snapshot(json.loads(settings), encoder, fallbacks, turns, facts, matrix, links)


def _links(db: sqlite3.Connection, user: str) -> list[tuple[int, int, float]]:
  return [(i, j, float(np.float32(c))) for i, j, c in db.execute(
      "SELECT fact_id, neighbour_id, cosine FROM lace_links WHERE user_id = ? "
      "ORDER BY fact_id, rank", (user,))]
