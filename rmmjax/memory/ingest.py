"""Replaying conversations into a memory bank, session by session, with reflection at each end.

Resumable at session granularity: a session the bank already holds as ended is checked against
the data and skipped; one that was stored but not reflected (a run stopped between the two
writes) gets its missing turns and its reflection.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import final

import numpy as np
from tqdm import tqdm

from rmmjax.data.schema import Conversation, Session, Turn
from rmmjax.llm.base import LLMError
from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.records import BankTurn, SessionEnded
from rmmjax.memory.reflection import Encoder, Reflector, reflect_session
from rmmjax.memory.topics import OfflineReflector, turn_text

class IngestStopped(LLMError):
  """The LLM failed during an ingest; every session reflected before is kept (`counts`)."""

  def __init__(self, message: str, counts: dict):
    super().__init__(message)
    self.counts = counts


COUNTS = ("users", "sessions", "sessions_skipped", "turns", "topics", "memories_added",
          "memories_merged", "memories_updated", "dropped_turn_ids", "dropped_topics",
          "fallbacks", "uncovered_turns", "cut_summaries")


def bank_text(turn: Turn) -> str:
  """A turn's text as the bank and LaceMem store it: an image turn keeps its caption."""
  return f"{turn.text} [shares an image: {turn.caption}]" if turn.caption else turn.text


def _repeated_ids(conversations: Sequence[Conversation]) -> str | None:
  """The first session or turn id that two of the conversations share, described, or None."""
  for what, ids in (("session", [s.session_id for c in conversations for s in c.sessions]),
                    ("turn", [t.turn_id for c in conversations for s in c.sessions
                              for t in s.turns])):
    counts = collections.Counter(ids)
    if dup := next((i for i, n in counts.items() if n > 1), None):
      return f"{what} id {dup!r} occurs {counts[dup]} times"
  return None


def plan_ingest(conversations: Sequence[Conversation], user: str | None,
                user_per_conversation: bool) -> list[tuple[str, tuple[Session, ...]]]:
  """(user, sessions) per conversation in replay order, after checking the arguments (before
  anything is written: the command line calls it before it opens the bank)."""
  conversations = list(conversations)
  if user_per_conversation:
    if user is not None:
      raise ValueError(f"user {user!r} and a user per conversation (--user-per-conversation): "
                       f"each conversation is its own user; pass one or the other")
    ids = [c.conversation_id for c in conversations]
    if dup := next((i for i, n in collections.Counter(ids).items() if n > 1), None):
      raise ValueError(f"conversation id {dup!r} occurs twice; with a user per conversation "
                       f"each conversation id is a user id and must be unique")
    return [(c.conversation_id, c.sessions) for c in conversations]
  if not isinstance(user, str) or not user:
    raise ValueError(f"the user must be a non-empty string (the user every conversation "
                     f"belongs to), got {user!r}; or make each conversation its own user "
                     f"(--user-per-conversation)")
  if dup := _repeated_ids(conversations):
    raise ValueError(f"the conversations cannot be one user's history: {dup} (ids must be "
                     f"unique per user); make each conversation its own user "
                     f"(--user-per-conversation)")
  return [(user, c.sessions) for c in conversations]


@final
class MemoEncoder:
  """An encoder that keeps what it embedded, so texts embedded ahead in bulk come back free."""

  def __init__(self, encoder: Encoder):
    self.encoder, self.identity = encoder, encoder.identity
    self._vectors: dict[str, np.ndarray] = {}

  def prefetch(self, texts: Sequence[str]) -> None:
    """Embeds the texts not yet seen, in one call (an encoder pads every call to a full batch)."""
    todo = list(dict.fromkeys(t for t in texts if t not in self._vectors))
    if todo:
      rows = np.asarray(self.encoder.encode(todo), np.float32)
      self._vectors.update(zip(todo, rows, strict=True))

  def encode(self, texts: list[str]) -> np.ndarray:
    texts = list(texts)
    self.prefetch(texts)
    return np.stack([self._vectors[t] for t in texts]) if texts else np.zeros((0, 0), np.float32)


def _ahead(reflector: Reflector, encoder: Encoder,
           sessions: Sequence[Session]) -> tuple[Reflector, Encoder]:
  """The reflector and encoder to replay these sessions with: the offline reflector's topics
  depend on the session alone, so its embeddings are computed ahead for all sessions at once."""
  memo = MemoEncoder(encoder)
  if not isinstance(reflector, OfflineReflector) or not sessions:
    return reflector, memo
  turn_memo = memo if reflector.encoder is encoder else MemoEncoder(reflector.encoder)
  offline = reflector.with_encoder(turn_memo)
  turns = [[BankTurn(t.turn_id, s.session_id, t.speaker, bank_text(t), s.date) for t in s.turns]
           for s in sessions]
  turn_memo.prefetch([turn_text(t, t.date) for session in turns for t in session])
  memo.prefetch([topic.summary for session, rows in zip(sessions, turns, strict=True)
                 for topic in offline.extract(rows, session.date).topics])
  return offline, memo


def ingest_conversations(bank: MemoryBank, conversations: Sequence[Conversation],
                         reflector: Reflector, encoder: Encoder, *, user: str | None = None,
                         user_per_conversation: bool = False, progress: bool = False) -> dict:
  """Replays each conversation's sessions in order: store the session with its turns, then
  reflect; returns counts (of this run: skipped sessions add nothing) and the time taken.
  Safe beside other writers of the same users (docs/memory.md): a session that another process
  reflected meanwhile counts as skipped."""
  plan = plan_ingest(conversations, user, user_per_conversation)
  counts = dict.fromkeys(COUNTS, 0)
  start = time.perf_counter()
  for name in dict.fromkeys(u for u, _ in plan):
    bank.add_user(name, exist_ok=True)
    counts["users"] += 1
  with tqdm(total=sum(len(s) for _, s in plan), desc="sessions", unit="session",
            disable=not progress) as bar:
    for name, sessions in plan:
      todo = []
      for session in sessions:  # each checked against the bank, stored if it is not yet
        turns = [(t.turn_id, t.speaker, bank_text(t)) for t in session.turns]
        done, added = bank.ingest_session(name, session.session_id, session.date, turns)
        counts["turns"] += added
        if not done:
          todo.append(session)
      counts["sessions_skipped"] += len(sessions) - len(todo)
      bar.update(len(sessions) - len(todo))
      run_reflector, run_encoder = _ahead(reflector, encoder, todo)
      for session in todo:
        try:
          report = reflect_session(bank, name, session.session_id, run_reflector, run_encoder)
        except SessionEnded:
          counts["sessions_skipped"] += 1
          bar.update(1)
          continue
        except LLMError as err:
          raise IngestStopped(f"{err}; session {session.session_id} of user {name!r} was not "
                              f"reflected, the {counts['sessions']} sessions reflected before it "
                              f"in this run are kept: rerun the same command to resume",
                              counts) from err
        counts["sessions"] += 1
        for key in COUNTS[4:]:  # the report's counts, by its field names
          counts[key] += getattr(report, key.removeprefix("memories_"))
        bar.update(1)
  seconds = time.perf_counter() - start
  return {**counts, "seconds": round(seconds, 3),
          "turns_per_s": round(counts["turns"] / seconds, 2) if seconds > 0 else 0.0}

