"""LongMemEval (Wu et al., 2024): one question per instance over a haystack of chat sessions.

Documented schema: question_id, question_type, question, answer, question_date,
haystack_session_ids, haystack_dates, haystack_sessions (lists of {role, content, has_answer?}),
answer_session_ids. Evidence turns are those marked has_answer; where none is marked, every turn
of the answer sessions is evidence (counted). Abstention questions have no evidence and are
skipped (counted).
Fields the loader does not use (question_date) are not checked.
"""

from __future__ import annotations

from pathlib import Path

from rmmjax.data.records import read_records
from rmmjax.data.schema import (LIST, OBJECT, SCALAR, STRING, Conversation, LoadReport,
                                MalformedData, Question, Session, Turn, check, optional, require)

EXPECTED = "a LongMemEval JSON file: a list of instances (such as longmemeval_s.json)"
_BOOLEAN = ((bool,), "true or false")


def _strings(rec: dict, key: str, where: str, path: Path, required: bool = True) -> list[str]:
  expected = "a list of strings"
  values = (require(rec, key, where, path, LIST, expected) if required else
            optional(rec, key, where, path, LIST, [], expected))
  for k, value in enumerate(values):
    check(value, STRING, f"{key}[{k}]", where, path, "a string")
  return values


def _session(raw: object, sid: str, date: str, where: str, path: Path,
             marked: list[str]) -> Session:
  """One haystack session; the ids of its has_answer turns are appended to marked."""
  session_where = f"{where}, session {sid}"
  check(raw, LIST, "the session", session_where, path, "a list of {role, content} turns")
  turns = []
  for k, turn in enumerate(raw):
    turn_where = f"{session_where}, turn {k}"
    check(turn, OBJECT, "the turn", turn_where, path, "an object with role and content")
    t = Turn(turn_id=f"{sid}:{k + 1}", speaker=require(turn, "role", turn_where, path, STRING),
             text=require(turn, "content", turn_where, path, STRING))
    turns.append(t)
    if optional(turn, "has_answer", turn_where, path, _BOOLEAN, False):
      marked.append(t.turn_id)
  return Session(sid, date, tuple(turns))


def load_longmemeval(path: str | Path) -> tuple[list[Conversation], LoadReport]:
  """One Conversation (with its one question) per LongMemEval instance."""
  path = Path(path)
  records = read_records(path, EXPECTED, "instances")
  report = LoadReport()
  conversations = []
  for i, rec in enumerate(records):
    qid = require(rec, "question_id", f"record {i}", path, STRING)
    where = f"record {i} ({qid})"
    ids = _strings(rec, "haystack_session_ids", where, path)
    dates = _strings(rec, "haystack_dates", where, path)
    raw_sessions = require(rec, "haystack_sessions", where, path, LIST, "a list of sessions")
    if not len(ids) == len(dates) == len(raw_sessions):
      raise MalformedData(f"{path}: {where}: haystack_session_ids, haystack_dates and "
                          f"haystack_sessions differ in length ({len(ids)}, {len(dates)}, "
                          f"{len(raw_sessions)})")
    text = require(rec, "question", where, path, STRING)
    answer = optional(rec, "answer", where, path, SCALAR, "")
    category = optional(rec, "question_type", where, path, STRING, "unknown")
    answer_sessions = set(_strings(rec, "answer_session_ids", where, path, required=False))
    sessions, marked = [], []
    for sid, date, raw in zip(ids, dates, raw_sessions, strict=True):
      session = _session(raw, sid, date, where, path, marked)
      if session.turns:
        sessions.append(session)
      else:
        report.note("empty session (dropped)", f"{qid} {sid}")
    if not sessions:
      raise MalformedData(f"{path}: {where}: no session with turns")
    evidence = marked or [t.turn_id for s in sessions if s.session_id in answer_sessions
                          for t in s.turns]
    if evidence and not marked:
      report.note("no has_answer turn (answer sessions used as evidence)", qid)
    if not evidence:
      report.note("question without evidence (skipped)", qid)
    questions = (Question(question=text, answer=str(answer), evidence=tuple(evidence),
                          category=category),) if evidence else ()
    conversations.append(Conversation(qid, tuple(sessions), questions))
  return conversations, report
