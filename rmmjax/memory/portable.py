"""One user's memory bank as plain JSON values (everything the bank keeps of them, every
encoder's embeddings and the LaceMem included), and the checked reading of it back."""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import final

import numpy as np

from rmmjax.data.schema import LIST, OBJECT, STRING, MalformedData, check, require
from rmmjax.io.manifest import another_version
from rmmjax.memory import _embedding_rows as emb
from rmmjax.memory import _lace_rows as lace_rows
from rmmjax.memory import _user_rows as user_rows
from rmmjax.memory.crypto import Cipher
from rmmjax.memory.records import KINDS, ORIGINS, LaceSnapshot, repeated
from rmmjax.retrieve.evidence import Fact, RawTurn

FORMAT = "rmmjax-memory-bank-user"
VERSION = 3
_SOURCE = "import_user data"  # what a message names in place of a file
_NUMBER = ((int, float), "a number")
_INT = ((int,), "an integer")
_BOOL = ((bool,), "true or false")


@final
@dataclasses.dataclass(frozen=True)
class Parsed:
  """Checked rows of one exported user, in the order they were stored."""

  user: str
  sessions: list[tuple[str, str, bool, str]]  # (session_id, date, ended, origin)
  # (session, date, ordinal, turn, speaker, text, kind)
  turns: list[tuple[str, str, int, str, str, str, str]]
  # (summary, created, updated, [(turn_id, session_id, date, text)], {encoder: vector})
  memories: list[tuple[str, float, float, list[tuple[str, str, str, str]], dict]]
  lace: LaceSnapshot | None


def export(db: sqlite3.Connection, cipher: Cipher, user: str, where: str) -> dict:
  """The export_user document of one user, read inside the caller's transaction; memory ids
  are left out (a bank numbers its own)."""
  sessions = user_rows.sessions(db, user)
  embeddings = emb.by_memory(db, cipher, user, where)
  by_session: dict[str, list[dict]] = {s.session_id: [] for s in sessions}
  for t in user_rows.turns(db, cipher, user, None):
    by_session[t.session_id].append({"turn_id": t.turn_id, "speaker": t.speaker, "text": t.text,
                                     "kind": t.kind})
  return {
      "format": FORMAT, "version": VERSION, "user": user,
      "sessions": [{"session_id": s.session_id, "date": s.date, "ended": s.ended,
                    "origin": s.origin, "turns": by_session[s.session_id]} for s in sessions],
      "memories": [{
          "summary": m.summary, "created": m.created, "updated": m.updated,
          "snippets": [s._asdict() for s in m.snippets],
          # float32 -> Python float is exact, and so is JSON's shortest repr of it.
          "embeddings": [{"encoder": e, "vector": v.tolist()}
                         for e, v in sorted(embeddings.get(m.id, {}).items())],
      } for m in user_rows.memories(db, cipher, user)],
      "lace": _lace_doc(lace_rows.read_rows(db, cipher, user, where)),
  }


def _lace_doc(snap: LaceSnapshot | None) -> dict | None:
  if snap is None:
    return None
  return {"settings": snap.settings, "encoder": snap.encoder, "fallbacks": snap.fallbacks,
          "turns": [dataclasses.asdict(t) for t in snap.turns],
          "facts": [{**{k: v for k, v in dataclasses.asdict(f).items() if k != "session_id"},
                     "vector": snap.vectors[f.fact_id].tolist()} for f in snap.facts],
          "links": [[i, j, c] for i, j, c in snap.links]}


def write(db: sqlite3.Connection, cipher: Cipher, parsed: Parsed, user: str) -> None:
  """Writes a parsed document as the user (new, inserted), in the caller's transaction."""
  seal = cipher.seal_text
  db.executemany("INSERT INTO sessions (user_id, session_id, date, ordinal, ended, origin) "
                 "VALUES (?, ?, ?, ?, ?, ?)",
                 [(user, s, d, o, int(e), origin)
                  for o, (s, d, e, origin) in enumerate(parsed.sessions)])
  db.executemany("INSERT INTO turns (user_id, session_id, turn_id, speaker, text, date, "
                 "ordinal, kind) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                 [(user, s, t, seal(speaker), seal(text), d, o, kind)
                  for s, d, o, t, speaker, text, kind in parsed.turns])
  for summary, created, updated, snippets, embeddings in parsed.memories:
    memory_id = db.execute("INSERT INTO memories (user_id, summary, created, updated) VALUES "
                           "(?, ?, ?, ?)", (user, seal(summary), created, updated)).lastrowid
    db.executemany("INSERT INTO snippets VALUES (?, ?, ?, ?, ?, ?, ?)",
                   [(memory_id, user, t, s, d, seal(text), o)
                    for o, (t, s, d, text) in enumerate(snippets)])
    for encoder, vector in embeddings.items():
      emb.put_vector(db, cipher, user, memory_id, encoder, vector)
      emb.check_dims(db, user, encoder)
  if parsed.lace is not None:
    lace_rows.write_rows(db, cipher, user, parsed.lace)


def parse(data: object) -> Parsed:
  """The rows of an export_user document, or a MalformedData naming the field and the value."""
  doc = check(data, OBJECT, "the document", "top level", _SOURCE)
  if doc.get("format") != FORMAT or doc.get("version") != VERSION:
    raise another_version(_SOURCE, f"format {doc.get('format')!r} version {doc.get('version')!r}",
                          f"format {FORMAT!r} version {VERSION}", "give what export_user gives",
                          MalformedData)
  user = _text(doc, "user", "top level")
  sessions, turns, stored = [], [], {}
  for i, session in enumerate(require(doc, "sessions", "top level", _SOURCE, LIST)):
    where = f"sessions[{i}]"
    s, d = _text(session, "session_id", where), _str(session, "date", where)
    origin = _one_of(session, "origin", where, ORIGINS)
    sessions.append((s, d, require(session, "ended", where, _SOURCE, _BOOL), origin))
    for j, turn in enumerate(require(session, "turns", where, _SOURCE, LIST)):
      at = f"{where}.turns[{j}]"
      t, text = _text(turn, "turn_id", at), _str(turn, "text", at)
      speaker, kind = _str(turn, "speaker", at), _one_of(turn, "kind", at, KINDS)
      turns.append((s, d, j, t, speaker, text, kind))
      stored[t] = (t, s, d, text)
  _unique("sessions", [s[0] for s in sessions])
  _unique("sessions' turns", [t[3] for t in turns])
  memories = [_memory(memory, f"memories[{i}]", stored) for i, memory in
              enumerate(require(doc, "memories", "top level", _SOURCE, LIST))]
  if bare := [i for i, m in enumerate(memories) if not m[4]]:
    raise MalformedData(f"{_SOURCE}: memories[{bare[0]}] has no embedding ({len(bare)} such); a "
                        f"bank finds every memory by an encoder's embedding of it")
  open_chats = [s for s, _, ended, origin in sessions if origin == "chat" and not ended]
  if len(open_chats) > 1:
    raise MalformedData(f"{_SOURCE}: chat sessions {open_chats[:3]} are all open; a user has at "
                        f"most one open chat session (the others were reflected)")
  lace = doc.get("lace")
  return Parsed(user, sessions, turns, memories, None if lace is None else _lace(lace))


def _memory(memory: object, where: str, stored: dict) -> tuple:
  snippets = []
  for j, snippet in enumerate(require(memory, "snippets", where, _SOURCE, LIST)):
    at = f"{where}.snippets[{j}]"
    row = tuple(_str(snippet, k, at) for k in ("turn_id", "session_id", "date", "text"))
    if stored.get(row[0]) != row:
      raise MalformedData(f"{_SOURCE}: {at}: turn {row[0]!r} is not among the sessions' turns "
                          f"with that session, date and text (a snippet is a stored turn)")
    snippets.append(row)
  embeddings = {}
  for j, item in enumerate(require(memory, "embeddings", where, _SOURCE, LIST)):
    at = f"{where}.embeddings[{j}]"
    embeddings[_text(item, "encoder", at)] = _vector(item, at)
  return (_text(memory, "summary", where),
          float(require(memory, "created", where, _SOURCE, _NUMBER)),
          float(require(memory, "updated", where, _SOURCE, _NUMBER)), snippets, embeddings)


def _lace(doc: object) -> LaceSnapshot:
  where = "lace"
  check(doc, OBJECT, "field 'lace'", "top level", _SOURCE, "an object or null")
  settings = require(doc, "settings", where, _SOURCE, OBJECT)
  encoder = _str(doc, "encoder", where)
  fallbacks = require(doc, "fallbacks", where, _SOURCE, _INT)
  turns = []
  for i, turn in enumerate(require(doc, "turns", where, _SOURCE, LIST)):
    at = f"lace.turns[{i}]"
    turns.append(RawTurn(_text(turn, "turn_id", at), _text(turn, "session_id", at),
                         *(_str(turn, k, at) for k in ("date", "speaker", "text"))))
  _unique("lace.turns", [t.turn_id for t in turns])
  sessions = {t.turn_id: t.session_id for t in turns}
  facts, vectors = [], []
  for i, fact in enumerate(require(doc, "facts", where, _SOURCE, LIST)):
    at = f"lace.facts[{i}]"
    turn_id = _text(fact, "turn_id", at)
    if require(fact, "fact_id", at, _SOURCE, _INT) != i or turn_id not in sessions:
      raise MalformedData(f"{_SOURCE}: {at}: fact_id {fact['fact_id']!r} of turn {turn_id!r}; "
                          f"expected fact_id {i} (facts are numbered from 0 in order) and a "
                          f"turn of lace.turns")
    facts.append(Fact(i, *(_str(fact, k, at)
                           for k in ("subject", "predicate", "object", "time")),
                      turn_id, sessions[turn_id], _str(fact, "text", at)))
    vectors.append(_vector(fact, at))
  if len(sizes := sorted({v.size for v in vectors})) > 1:
    raise MalformedData(f"{_SOURCE}: lace.facts: vectors of sizes {sizes}; one encoder gives "
                        f"one size")
  links = []
  for i, link in enumerate(require(doc, "links", where, _SOURCE, LIST)):
    ok = (isinstance(link, list) and len(link) == 3
          and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < len(facts)
                  for x in link[:2])
          and isinstance(link[2], (int, float)) and not isinstance(link[2], bool))
    if not ok:
      raise MalformedData(f"{_SOURCE}: lace.links[{i}] is {link!r:.100}; expected [fact id, "
                          f"neighbour id, cosine] with ids below {len(facts)}")
    links.append((link[0], link[1], float(link[2])))
  matrix = np.stack(vectors) if vectors else np.zeros((0, 0), np.float32)
  return LaceSnapshot(settings, encoder, fallbacks, turns, facts, matrix, links)


def _vector(item: object, at: str) -> np.ndarray:
  vector = require(item, "vector", at, _SOURCE, LIST)
  if not vector or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                           and np.isfinite(v) for v in vector):
    raise MalformedData(f"{_SOURCE}: {at}: field 'vector' must be a non-empty list of finite "
                        f"numbers")
  return np.asarray(vector, np.float32)


def _str(record: object, key: str, at: str) -> str:
  return require(record, key, at, _SOURCE, STRING)


def _one_of(record: object, key: str, at: str, allowed: tuple[str, ...]) -> str:
  if (value := _str(record, key, at)) not in allowed:
    raise MalformedData(f"{_SOURCE}: {at}: {key} {value!r} is not one of {', '.join(allowed)}")
  return value


def _unique(where: str, ids: list[str]) -> None:
  if dup := repeated(ids):
    raise MalformedData(f"{_SOURCE}: {where}: id {dup[0]!r} appears twice; expected each once")


def _text(record: object, key: str, where: str) -> str:
  if not (value := _str(record, key, where)):
    raise MalformedData(f"{_SOURCE}: {where}: field {key!r} is empty; expected a non-empty string")
  return value
