"""MSC (Multi-Session Chat, Xu et al. 2022), ParlAI JSON Lines: one three-session episode a line.

Sessions 1 and 2 come without speakers (the two alternate, Speaker 1 first); a few session-3
turns carry a number instead of "Speaker 1/2" and are given the alternating speaker, counted.
MSC has no questions; its per-speaker persona summaries are kept as `personas`. A session-3
turn's id may be a string or a number, as in the release.
"""

from __future__ import annotations

from pathlib import Path

from rmmjax.data.records import read_records
from rmmjax.data.schema import (LIST, OBJECT, STRING, Conversation, LoadReport, MalformedData,
                                Session, Turn, check, optional, require)

EXPECTED = "an MSC JSON Lines file, one episode a line (such as msc_dialogue/session_3/valid.txt)"
SPEAKERS = ("Speaker 1", "Speaker 2")
_SPEAKER_ID = ((str, int), "a string or a number")


def _turns(dialog: list, session: int, where: str, path: Path, report: LoadReport,
           named: bool) -> tuple[Turn, ...]:
  turns = []
  for k, turn in enumerate(dialog):
    turn_where = f"{where}, turn {k}"
    check(turn, OBJECT, "the turn", turn_where, path, "an object with a text")
    text = require(turn, "text", turn_where, path, STRING)
    speaker = SPEAKERS[k % 2]
    if named:
      given = str(optional(turn, "id", turn_where, path, _SPEAKER_ID, ""))
      if given in SPEAKERS:
        speaker = given
      else:
        report.note("speaker id not Speaker 1/2 (alternation used)", f"{where} turn {k}: {given}")
    turns.append(Turn(turn_id=f"S{session}:{k + 1}", speaker=speaker, text=text))
  return tuple(turns)


def _personas(episode: dict, where: str, path: Path) -> tuple[tuple[str, ...], ...]:
  personas = optional(episode, "personas", where, path, LIST, [], "a list of lists of facts")
  for s, facts in enumerate(personas):
    check(facts, LIST, f"personas[{s}]", where, path, "a list of fact strings")
    for f, fact in enumerate(facts):
      check(fact, STRING, f"personas[{s}][{f}]", where, path, "a fact string")
  return tuple(tuple(facts) for facts in personas)


def load_msc(path: str | Path) -> tuple[list[Conversation], LoadReport]:
  """Episodes of an MSC session file (e.g. msc_dialogue/session_3/valid.txt)."""
  path = Path(path)
  report = LoadReport()
  conversations = []
  for i, episode in enumerate(read_records(path, EXPECTED, "episodes")):
    meta = require(episode, "metadata", f"record {i}", path, OBJECT,
                   "an object with initial_data_id")
    conv_id = require(meta, "initial_data_id", f"record {i}, metadata", path, STRING)
    where = f"record {i} ({conv_id})"
    sessions = []
    previous_dialogs = require(episode, "previous_dialogs", where, path, LIST,
                               "a list of the earlier sessions")
    for n, previous in enumerate(previous_dialogs, 1):
      session_where = f"{where}, session {n}"
      check(previous, OBJECT, "previous_dialogs entry", session_where, path,
            "an object with a dialog")
      dialog = require(previous, "dialog", session_where, path, LIST, "a list of turns")
      turns = _turns(dialog, n, session_where, path, report, named=False)
      date = optional(previous, "time_back", session_where, path, STRING, "")
      sessions.append(Session(f"S{n}", date.strip(), turns))
    current = len(sessions) + 1
    dialog = require(episode, "dialog", where, path, LIST, "a list of turns")
    sessions.append(Session(f"S{current}", "now", _turns(
        dialog, current, f"{where}, session {current}", path, report, named=True)))
    sessions = [s for s in sessions if s.turns]
    if not sessions:
      raise MalformedData(f"{path}: {where}: no session with turns")
    conversations.append(Conversation(conv_id, tuple(sessions), (), _personas(episode, where,
                                                                               path)))
  return conversations, report
