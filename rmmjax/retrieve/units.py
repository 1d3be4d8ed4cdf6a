"""Memory units at a chosen granularity; every unit knows the turn ids it covers and its size.

How a unit's text is written matters as much as the retriever: questions name people and
dates, so a turn unit reads "[date] Speaker: utterance" with an image caption appended.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from rmmjax.data.schema import Conversation, Session, Turn

GRANULARITIES = ("turn", "session", "mixed")


@dataclasses.dataclass(frozen=True)
class Unit:
  unit_id: str
  text: str
  turn_ids: tuple[str, ...]
  words: int


def turn_line(turn: Turn) -> str:
  line = f"{turn.speaker}: {turn.text}"
  return f"{line} [shares an image: {turn.caption}]" if turn.caption else line


def _unit(unit_id: str, text: str, turn_ids) -> Unit:
  return Unit(unit_id=unit_id, text=text, turn_ids=tuple(turn_ids), words=len(text.split()))


def turn_units(session: Session) -> list[Unit]:
  return [_unit(t.turn_id, f"[{session.date}] {turn_line(t)}", [t.turn_id])
            for t in session.turns]


def session_units(session: Session) -> list[Unit]:
  text = f"[{session.date}]\n" + "\n".join(turn_line(t) for t in session.turns)
  return [_unit(session.session_id, text, [t.turn_id for t in session.turns])]


# Builders per granularity; a new granularity (topics from Prospective Reflection) adds one.
BUILDERS: dict[str, Callable[[Session], list[Unit]]] = {
    "turn": turn_units,
    "session": session_units,
    "mixed": lambda s: turn_units(s) + session_units(s),
}


def build_units(conversation: Conversation, granularity: str) -> list[Unit]:
  """All units of one conversation at the given granularity, in conversation order."""
  return [u for session in conversation.sessions for u in BUILDERS[granularity](session)]
