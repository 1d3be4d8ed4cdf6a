"""LongMemEval (Wu et al., 2024): one question per instance over a haystack of chat sessions.

Documented schema: question_id, question_type, question, answer, question_date,
haystack_session_ids, haystack_dates, haystack_sessions (lists of {role, content, has_answer?}),
answer_session_ids. Evidence turns are those marked has_answer; where none is marked, every turn
of the answer sessions is evidence (counted). Abstention questions have no evidence and are
skipped (counted).
"""

from __future__ import annotations

from pathlib import Path

from rmmjax.data.records import read_records
from rmmjax.data.schema import (
  Conversation,
  LoadReport,
  MalformedData,
  Question,
  Session,
  Turn,
  require,
)


def load_longmemeval(path: str | Path) -> tuple[list[Conversation], LoadReport]:
  """One Conversation (with its one question) per LongMemEval instance."""
  path = Path(path)
  records = read_records(path, "a LongMemEval JSON file: a list of instances")
  report = LoadReport()
  conversations = []
  for i, rec in enumerate(records):
    qid = str(require(rec, "question_id", f"record {i}", path))
    where = f"record {i} ({qid})"
    ids = require(rec, "haystack_session_ids", where, path)
    dates = require(rec, "haystack_dates", where, path)
    raw_sessions = require(rec, "haystack_sessions", where, path)
    if not len(ids) == len(dates) == len(raw_sessions):
      raise MalformedData(f"{path}: {where}: haystack_session_ids, haystack_dates and "
                          f"haystack_sessions differ in length ({len(ids)}, {len(dates)}, "
                          f"{len(raw_sessions)})")
    sessions, marked = [], []
    for sid, date, raw in zip(ids, dates, raw_sessions, strict=True):
      turns = []
      for k, turn in enumerate(raw):
        turn_where = f"{where}, session {sid}, turn {k}"
        t = Turn(turn_id=f"{sid}:{k + 1}", speaker=str(require(turn, "role", turn_where, path)),
                 text=str(require(turn, "content", turn_where, path)))
        turns.append(t)
        if turn.get("has_answer"):
          marked.append(t.turn_id)
      if turns:
        sessions.append(Session(str(sid), str(date), tuple(turns)))
      else:
        report.note("empty session (dropped)", f"{qid} {sid}")
    if not sessions:
      raise MalformedData(f"{path}: {where}: no session with turns")
    evidence = marked
    if not evidence:
      answer_sessions = {str(s) for s in rec.get("answer_session_ids", [])}
      evidence = [t.turn_id for s in sessions if s.session_id in answer_sessions
                  for t in s.turns]
      if evidence:
        report.note("no has_answer turn (answer sessions used as evidence)", qid)
    questions = ()
    if evidence:
      questions = (Question(question=str(require(rec, "question", where, path)),
                            answer=str(rec.get("answer", "")), evidence=tuple(evidence),
                            category=str(rec.get("question_type", "unknown"))),)
    else:
      report.note("question without evidence (skipped)", qid)
    conversations.append(Conversation(qid, tuple(sessions), questions))
  if not conversations:
    raise MalformedData(f"{path}: no instances")
  return conversations, report
