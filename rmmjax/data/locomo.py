"""LoCoMo (Maharana et al., 2024): long two-person chats in dated sessions, with evidence-labelled
questions. Evidence ids are parsed leniently; every repair or drop is counted in a LoadReport.

Field types follow the released schema (a null session_<N> is absent; answer and
adversarial_answer may be a string or a number); anything else is a MalformedData. Two
departures are read and counted as repairs:
- evidence given as one string instead of a list ("D1:3", or "D1:3; D2:4") is read as a list
  holding that string;
- category given as its digit string ("2") or as the name the loader gives it ("temporal";
  one of multi-hop, temporal, open-domain, single-hop, adversarial).
Any other category (0, 6, 2.0, "Temporal", true) is refused. Fields the loader does not use
(observations, summaries, image URLs) are not checked; `load_observations` reads the
observations leniently, for the runs that ask for them.
"""

from __future__ import annotations

import re
from pathlib import Path

from rmmjax.data.records import read_records
from rmmjax.data.schema import (CATEGORY_NAMES, LIST, OBJECT, SCALAR, STRING, Conversation,
                                LoadReport, MalformedData, Question, Session, Turn, check, describe,
                                optional, require)

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


EXPECTED = "a LoCoMo JSON file: a list of conversations (such as locomo10.json)"
CATEGORY_EXPECTED = (f"a category number 1..5 (or its string \"1\"..\"5\") or one of the names "
                     f"{', '.join(CATEGORY_NAMES.values())}")
EVIDENCE_EXPECTED = "a list of turn ids such as [\"D1:3\"] (or one id as a string)"
_CATEGORY_BY_NAME = {name: name for name in CATEGORY_NAMES.values()} | {
    str(n): name for n, name in CATEGORY_NAMES.items()}


def _category(raw: object, where: str, path: Path, report: LoadReport, example: str) -> str:
  """The category name of a question's category field (see the module docstring)."""
  if isinstance(raw, int) and not isinstance(raw, bool) and raw in CATEGORY_NAMES:
    return CATEGORY_NAMES[raw]
  if isinstance(raw, str) and raw in _CATEGORY_BY_NAME:
    named = raw in CATEGORY_NAMES.values()
    report.note("category given as a name (kept)" if named else
                "category given as a digit string (read as its number)", f"{example}: {raw!r}")
    return _CATEGORY_BY_NAME[raw]
  raise MalformedData(f"{path}: {where}: field 'category' is {describe(raw)}; expected "
                      f"{CATEGORY_EXPECTED}")


def _evidence(qa: dict, where: str, path: Path, report: LoadReport, example: str) -> list[str]:
  """A question's raw evidence strings: a list of strings, or one string (counted)."""
  raw = require(qa, "evidence", where, path, expected=EVIDENCE_EXPECTED)
  if isinstance(raw, str):
    report.note("evidence given as a string, not a list (read as a list of it)",
                f"{example}: {raw!r}")
    return [raw]
  check(raw, LIST, "field 'evidence'", where, path, EVIDENCE_EXPECTED)
  for k, item in enumerate(raw):
    check(item, STRING, f"evidence[{k}]", where, path, "a turn id string such as \"D1:3\"")
  return raw


def _session(chat: dict, n: int, where: str, path: Path) -> tuple[str, list[Turn]]:
  date = optional(chat, f"session_{n}_date_time", where, path, STRING, "")
  turns = []
  for j, turn in enumerate(chat[f"session_{n}"]):
    turn_where = f"{where}, session_{n}[{j}]"
    check(turn, OBJECT, "the turn", turn_where, path,
          "an object with speaker, dia_id and text")
    turns.append(Turn(turn_id=require(turn, "dia_id", turn_where, path, STRING),
                      speaker=require(turn, "speaker", turn_where, path, STRING),
                      text=require(turn, "text", turn_where, path, STRING),
                      caption=optional(turn, "blip_caption", turn_where, path, STRING, "")))
  return date, turns


def load_locomo(path: str | Path) -> tuple[list[Conversation], LoadReport]:
  """Conversations of a LoCoMo JSON file (the released schema) and what was repaired."""
  path = Path(path)
  records = read_records(path, EXPECTED, "conversations")
  report = LoadReport()
  conversations = []
  for i, record in enumerate(records):
    conv_id = require(record, "sample_id", f"record {i}", path, STRING)
    where = f"record {i} ({conv_id})"
    chat = require(record, "conversation", where, path, OBJECT,
                   "an object holding session_<N> lists of turns")
    numbers = []
    for key, value in chat.items():
      if (m := _SESSION_KEY.fullmatch(key)) and value is not None:
        check(value, LIST, f"field {key!r}", f"{where}, conversation", path, "a list of turns")
        numbers.append(int(m.group(1)))
    sessions = []
    for n in sorted(numbers):
      date, turns = _session(chat, n, where, path)
      if not turns:
        report.note("empty session (dropped)", f"{conv_id} session_{n}")
        continue
      sessions.append(Session(session_id=f"S{n}", date=date, turns=tuple(turns)))
    if not sessions:
      raise MalformedData(f"{path}: {where}: the conversation has no session with turns")
    conv_turns = {t.turn_id for s in sessions for t in s.turns}
    questions = []
    qas = require(record, "qa", where, path, LIST, "a list of questions")
    for j, qa in enumerate(qas):
      qa_where = f"{where}, qa[{j}]"
      check(qa, OBJECT, "the question", qa_where, path,
            "an object with question, evidence and category")
      # Every field is checked before the question may be skipped for want of evidence.
      text = require(qa, "question", qa_where, path, STRING)
      category = _category(require(qa, "category", qa_where, path, expected=CATEGORY_EXPECTED),
                           qa_where, path, report, f"{conv_id} qa[{j}]")
      raw_evidence = _evidence(qa, qa_where, path, report, f"{conv_id} qa[{j}]")
      answer = optional(qa, "answer", qa_where, path, SCALAR, None)
      if answer is None:
        answer = optional(qa, "adversarial_answer", qa_where, path, SCALAR, "")
      evidence = [t for raw in raw_evidence for t in parse_evidence(raw, conv_turns, report)]
      if not evidence:
        report.note("question without valid evidence (skipped)", f"{conv_id} qa[{j}]")
        continue
      if not text.strip():  # nothing to retrieve for: no evaluation could score it
        report.note("empty question (skipped)", f"{conv_id} qa[{j}]")
        continue
      questions.append(Question(question=text, answer=str(answer),
                                evidence=tuple(dict.fromkeys(evidence)), category=category))
    conversations.append(Conversation(conv_id, tuple(sessions), tuple(questions)))
  return conversations, report


def load_observations(path: str | Path, conversations: list[Conversation]
                      ) -> dict[str, tuple[Question, ...]]:
  """Each conversation's observations as questions of category "observation": LoCoMo's
  annotators wrote, per session and speaker, statements of what the dialogue established, each
  naming the turn it comes from ([text, "D1:3"], or several ids), so each is one more labelled
  (text, turn) pair of the same conversation. Read leniently (an optional field, for the runs
  that ask): an item of another shape, or naming no turn of its conversation, is skipped.
  Conversations are matched to the file's records by id (an id given twice is refused: one
  record's observations would go to the other); one whose record has none is absent."""
  ids = [c.conversation_id for c in conversations]
  if len(set(ids)) < len(ids):
    twice = next(i for i in ids if ids.count(i) > 1)
    raise MalformedData(f"{path}: conversation id {twice!r} is given to more than one "
                        "conversation; expected each sample_id once (observations are matched "
                        "to their conversation by it)")
  known = {c.conversation_id: c.turn_ids() for c in conversations}
  found: dict[str, tuple[Question, ...]] = {}
  ignored = LoadReport()  # (its counts are not reported: the field is optional)
  for record in read_records(Path(path), EXPECTED, "conversations"):
    conv_id = record.get("sample_id") if isinstance(record, dict) else None
    sessions = record.get("observation") if conv_id in known else None
    if not isinstance(sessions, dict):
      continue
    out = []
    for by_speaker in sessions.values():
      for items in by_speaker.values() if isinstance(by_speaker, dict) else ():
        for item in items if isinstance(items, list) else ():
          if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                  and item[0].strip()):
            continue
          raw = item[1] if isinstance(item[1], list) else [item[1]]
          evidence = [t for r in raw if isinstance(r, str)
                      for t in parse_evidence(r, known[conv_id], ignored)]
          if evidence:
            out.append(Question(question=item[0].strip(), answer="",
                                evidence=tuple(dict.fromkeys(evidence)), category="observation"))
    found[conv_id] = tuple(out)
  return found
