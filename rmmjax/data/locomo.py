"""LoCoMo (Maharana et al., 2024): long two-person chats in dated sessions, with evidence-labelled
questions. Evidence ids are parsed leniently; every repair or drop is counted in a LoadReport."""

from __future__ import annotations

import re
from pathlib import Path

from rmmjax.data.records import read_records
from rmmjax.data.schema import (
  CATEGORY_NAMES,
  Conversation,
  LoadReport,
  MalformedData,
  Question,
  Session,
  Turn,
)
from rmmjax.data.schema import require as _field

_TURN_ID = re.compile(r"D(\d+):(\d+)")
_SESSION_KEY = re.compile(r"session_(\d+)")


def parse_evidence(raw: str, known: set[str], report: LoadReport) -> list[str]:
  """Turn ids in one evidence string: repairs "D8:6; D9:17", "D:11:26", "D30:05"; drops "D" and
  ids that name no turn of the conversation."""
  found = []
  for match in re.finditer(r"D:?(\d+):(\d+)", raw):
    turn_id = f"D{int(match.group(1))}:{int(match.group(2))}"
    if turn_id != match.group(0):
      report.note("evidence id normalised", f"{match.group(0)!r} -> {turn_id!r}")
    if turn_id in known:
      found.append(turn_id)
    else:
      report.note("evidence id names no turn (dropped)", turn_id)
  if len(found) > 1:
    report.note("several evidence ids in one string (split)", repr(raw))
  if not found and not re.search(r"D:?\d+:\d+", raw):
    report.note("evidence string without an id (dropped)", repr(raw))
  return found


def load_locomo(path: str | Path) -> tuple[list[Conversation], LoadReport]:
  """Conversations of a LoCoMo JSON file (the released schema) and what was repaired."""
  path = Path(path)
  records = read_records(path, "a LoCoMo JSON file: a list of conversations")
  report = LoadReport()
  conversations = []
  for i, record in enumerate(records):
    where = f"record {i}"
    conv_id = str(_field(record, "sample_id", where, path))
    where = f"record {i} ({conv_id})"
    chat = _field(record, "conversation", where, path)
    numbers = sorted(int(m.group(1)) for key in chat
                     if (m := _SESSION_KEY.fullmatch(key)) and isinstance(chat[key], list))
    sessions = []
    for n in numbers:
      turns = []
      for j, turn in enumerate(chat[f"session_{n}"]):
        turn_where = f"{where}, session_{n}[{j}]"
        turns.append(Turn(turn_id=str(_field(turn, "dia_id", turn_where, path)),
                          speaker=str(_field(turn, "speaker", turn_where, path)),
                          text=str(_field(turn, "text", turn_where, path)),
                          caption=str(turn.get("blip_caption", "") or "")))
      if not turns:
        report.note("empty session (dropped)", f"{conv_id} session_{n}")
        continue
      sessions.append(Session(session_id=f"S{n}", date=str(chat.get(f"session_{n}_date_time", "")),
                              turns=tuple(turns)))
    if not sessions:
      raise MalformedData(f"{path}: {where}: the conversation has no session with turns")
    conv_turns = {t.turn_id for s in sessions for t in s.turns}
    questions = []
    for j, qa in enumerate(_field(record, "qa", where, path)):
      qa_where = f"{where}, qa[{j}]"
      category = int(_field(qa, "category", qa_where, path))
      if category not in CATEGORY_NAMES:
        raise MalformedData(f"{path}: {qa_where}: category {category} is not one of 1..5")
      evidence = [t for raw in _field(qa, "evidence", qa_where, path)
                  for t in parse_evidence(str(raw), conv_turns, report)]
      if not evidence:
        report.note("question without valid evidence (skipped)", f"{conv_id} qa[{j}]")
        continue
      answer = qa.get("answer", qa.get("adversarial_answer", ""))
      questions.append(Question(question=str(_field(qa, "question", qa_where, path)),
                                answer=str(answer), evidence=tuple(dict.fromkeys(evidence)),
                                category=CATEGORY_NAMES[category]))
    conversations.append(Conversation(conv_id, tuple(sessions), tuple(questions)))
  if not conversations:
    raise MalformedData(f"{path}: no conversations")
  return conversations, report
