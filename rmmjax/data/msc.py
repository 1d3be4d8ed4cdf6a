"""MSC (Multi-Session Chat, Xu et al. 2022), ParlAI JSON Lines: one three-session episode a line.

Sessions 1 and 2 come without speakers (the two alternate, Speaker 1 first); a few session-3
turns carry a number instead of "Speaker 1/2" and are given the alternating speaker, counted.
MSC has no questions; its per-speaker persona summaries are kept as `personas`.
"""

from __future__ import annotations

from pathlib import Path

from rmmjax.data.records import read_records
from rmmjax.data.schema import (
  Conversation,
  LoadReport,
  MalformedData,
  Session,
  Turn,
  require,
)

SPEAKERS = ("Speaker 1", "Speaker 2")


def _turns(dialog: list, session: int, where: str, path: Path, report: LoadReport,
           named: bool) -> tuple[Turn, ...]:
  turns = []
  for k, turn in enumerate(dialog):
    text = str(require(turn, "text", f"{where}, turn {k}", path))
    speaker = SPEAKERS[k % 2]
    if named:
      given = str(turn.get("id", ""))
      if given in SPEAKERS:
        speaker = given
      else:
        report.note("speaker id not Speaker 1/2 (alternation used)", f"{where} turn {k}: {given}")
    turns.append(Turn(turn_id=f"S{session}:{k + 1}", speaker=speaker, text=text))
  return tuple(turns)


def load_msc(path: str | Path) -> tuple[list[Conversation], LoadReport]:
  """Episodes of an MSC session file (e.g. msc_dialogue/session_3/valid.txt)."""
  path = Path(path)
  report = LoadReport()
  conversations = []
  for number, episode in enumerate(read_records(path, "an MSC JSON Lines file"), 1):
    where = f"episode {number}"
    meta = require(episode, "metadata", where, path)
    conv_id = str(require(meta, "initial_data_id", where + ", metadata", path))
    sessions = []
    for n, previous in enumerate(require(episode, "previous_dialogs", where, path), 1):
      turns = _turns(require(previous, "dialog", f"{where}, session {n}", path), n,
                     f"{where}, session {n}", path, report, named=False)
      sessions.append(Session(f"S{n}", str(previous.get("time_back", "")).strip(), turns))
    current = len(sessions) + 1
    sessions.append(Session(f"S{current}", "now", _turns(
        require(episode, "dialog", where, path), current, f"{where}, session {current}", path,
        report, named=True)))
    sessions = [s for s in sessions if s.turns]
    if not sessions:
      raise MalformedData(f"{path}: {where} ({conv_id}): no session with turns")
    personas = tuple(tuple(str(f) for f in facts) for facts in episode.get("personas", []))
    conversations.append(Conversation(conv_id, tuple(sessions), (), personas))
  if not conversations:
    raise MalformedData(f"{path}: no episodes")
  return conversations, report
