"""One user's memory bank as plain JSON values, and the checked reading of it back."""

from __future__ import annotations

import dataclasses
from typing import final

import numpy as np

from rmmjax.data.schema import LIST, OBJECT, STRING, MalformedData, check, require
from rmmjax.memory.records import BankTurn, Memory, SessionInfo

FORMAT = "rmmjax-memory-bank-user"
VERSION = 1
_SOURCE = "import_user data"  # what a message names in place of a file
_NUMBER = ((int, float), "a number")
_BOOL = ((bool,), "true or false")


@final
@dataclasses.dataclass(frozen=True)
class Parsed:
  """Checked rows of one exported user, in the order they were stored."""

  user: str
  sessions: list[tuple[str, str, bool]]  # (session_id, date, ended)
  turns: list[tuple[str, str, int, str, str, str]]  # (session, date, ordinal, turn, speaker, text)
  # (summary, created, updated, [(turn_id, session_id, date, text)], {encoder: vector})
  memories: list[tuple[str, float, float, list[tuple[str, str, str, str]], dict]]


def export(user: str, sessions: list[SessionInfo], turns: list[BankTurn], memories: list[Memory],
           embeddings: dict[int, dict[str, np.ndarray]]) -> dict:
  """The export_user document; memory ids are left out (a bank numbers its own)."""
  by_session: dict[str, list[dict]] = {s.session_id: [] for s in sessions}
  for t in turns:
    by_session[t.session_id].append({"turn_id": t.turn_id, "speaker": t.speaker, "text": t.text})
  return {
      "format": FORMAT, "version": VERSION, "user": user,
      "sessions": [{"session_id": s.session_id, "date": s.date, "ended": s.ended,
                    "turns": by_session[s.session_id]} for s in sessions],
      "memories": [{
          "summary": m.summary, "created": m.created, "updated": m.updated,
          "snippets": [s._asdict() for s in m.snippets],
          # float32 -> Python float is exact, and so is JSON's shortest repr of it.
          "embeddings": [{"encoder": e, "vector": v.tolist()}
                         for e, v in sorted(embeddings.get(m.id, {}).items())],
      } for m in memories],
  }


def parse(data: object) -> Parsed:
  """The rows of an export_user document, or a MalformedData naming the field and the value."""
  doc = check(data, OBJECT, "the document", "top level", _SOURCE)
  if doc.get("format") != FORMAT or doc.get("version") != VERSION:
    raise MalformedData(f"{_SOURCE}: format {doc.get('format')!r} version "
                        f"{doc.get('version')!r}; expected {FORMAT!r} version {VERSION} "
                        f"(what export_user gives)")
  user = _text(doc, "user", "top level")
  sessions, turns, stored = [], [], {}
  for i, session in enumerate(require(doc, "sessions", "top level", _SOURCE, LIST)):
    where = f"sessions[{i}]"
    s = _text(session, "session_id", where)
    d = require(session, "date", where, _SOURCE, STRING)
    if s in {seen for seen, _, _ in sessions}:
      raise MalformedData(f"{_SOURCE}: {where}: session id {s!r} appears twice")
    sessions.append((s, d, require(session, "ended", where, _SOURCE, _BOOL)))
    for j, turn in enumerate(require(session, "turns", where, _SOURCE, LIST)):
      at = f"{where}.turns[{j}]"
      t = _text(turn, "turn_id", at)
      if t in stored:
        raise MalformedData(f"{_SOURCE}: {at}: turn id {t!r} appears twice (turn ids are "
                            f"unique per user)")
      text = require(turn, "text", at, _SOURCE, STRING)
      turns.append((s, d, j, t, require(turn, "speaker", at, _SOURCE, STRING), text))
      stored[t] = (t, s, d, text)
  memories = []
  for i, memory in enumerate(require(doc, "memories", "top level", _SOURCE, LIST)):
    where = f"memories[{i}]"
    snippets = []
    for j, snippet in enumerate(require(memory, "snippets", where, _SOURCE, LIST)):
      at = f"{where}.snippets[{j}]"
      row = tuple(require(snippet, k, at, _SOURCE, STRING)
                  for k in ("turn_id", "session_id", "date", "text"))
      if stored.get(row[0]) != row:
        raise MalformedData(f"{_SOURCE}: {at}: turn {row[0]!r} is not among the sessions' turns "
                            f"with that session, date and text (a snippet is a stored turn)")
      snippets.append(row)
    embeddings = {}
    for j, item in enumerate(require(memory, "embeddings", where, _SOURCE, LIST)):
      at = f"{where}.embeddings[{j}]"
      vector = require(item, "vector", at, _SOURCE, LIST)
      if not vector or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                               and np.isfinite(v) for v in vector):
        raise MalformedData(f"{_SOURCE}: {at}: field 'vector' must be a non-empty list of "
                            f"finite numbers")
      embeddings[_text(item, "encoder", at)] = np.asarray(vector, np.float32)
    memories.append((_text(memory, "summary", where),
                     float(require(memory, "created", where, _SOURCE, _NUMBER)),
                     float(require(memory, "updated", where, _SOURCE, _NUMBER)),
                     snippets, embeddings))
  return Parsed(user, sessions, turns, memories)


def _text(record: object, key: str, where: str) -> str:
  value = require(record, key, where, _SOURCE, STRING)
  if not value:
    raise MalformedData(f"{_SOURCE}: {where}: field {key!r} is empty; expected a non-empty string")
  return value
