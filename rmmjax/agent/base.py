"""What every chat agent (RMM's in `rmm.py`, IRIS's in `iris.py`) is to the chat loop and to
`rmmjax answer`: it answers a user's question from their memory (recording the exchange), takes a
statement, ends a session with Prospective Reflection, says what of its learning a run keeps."""

from __future__ import annotations

import abc
import datetime

from rmmjax.llm.base import LLM
from rmmjax.llm.exchange import COUNTERS, ask_cited
from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.reflection import Encoder, ReflectionReport, reflect_session
from rmmjax.memory.topics import OfflineReflector

# Every agent's counters: questions asked, reranker updates, the cited-answer exchange's
# (rmmjax.llm.exchange.COUNTERS), turns it wrote to the bank.
STATS = ("queries", "updates", *COUNTERS, "turns_written")


class Reply(abc.ABC):
  """One answer of a chat agent, as the chat loop prints it."""

  answer: str | None  # None without an LLM, or when the LLM failed
  cited: tuple[int, ...]  # positions among the shown texts the answer cited
  failure: str | None  # "llm_error" or "malformed" when the LLM gave no usable answer
  error: str  # what the failure was
  session_id: str | None  # where the exchange was recorded

  @property
  def abstained(self) -> bool:
    """Whether retrieval judged the evidence missing (only IRIS does)."""
    return False

  @property
  @abc.abstractmethod
  def shown_texts(self) -> list[str]:
    """The texts shown to the LLM, in the order they were numbered."""


class ChatAgent(abc.ABC):
  """A memory agent over one bank; every call names the user it serves."""

  bank: MemoryBank
  llm: LLM | None
  encoder: Encoder
  stats: dict  # STATS and the agent's own counters

  @abc.abstractmethod
  def respond(self, user: str, query: str) -> Reply:
    """Answers one question and records the exchange in the user's open chat session."""

  @abc.abstractmethod
  def tell(self, user: str, text: str) -> str:
    """Records a statement of the user's (nothing retrieved or answered); its session's id."""

  def end_session(self, user: str) -> ReflectionReport:
    """Prospective Reflection over the user's open chat session; returns its report."""
    if (info := self.bank.open_session(user, "chat")) is None:
      raise ValueError(f"user {user!r} has no open chat session to end")
    # A session another process reflected meanwhile is refused by the bank (SessionEnded).
    reflector = OfflineReflector(self.encoder)
    return reflect_session(self.bank, user, info.session_id, reflector, self.encoder)

  @abc.abstractmethod
  def kept(self) -> str:
    """What this run's learning leaves behind (said when the chat ends or is interrupted)."""

  def close(self) -> None:
    """Saves what needs saving and releases what the agent holds (nothing by default)."""

  def _record(self, user: str, turns: list[tuple[str, str, str]]) -> str:
    """The chat session's id, after appending (speaker, text, kind) turns to it."""
    session_id, ids = self.bank.append_chat(user, turns, datetime.date.today().isoformat())
    self.stats["turns_written"] += len(ids)
    return session_id

  def _record_exchange(self, user: str, query: str, answer: str | None) -> str:
    return self._record(user, [("user", query, "question")]
                        + ([("assistant", answer, "answer")] if answer else []))

  def _ask(self, query: str, texts: list[str], missing: bool = False) -> tuple:
    """(answer, cited positions, failure, error) of the LLM over the numbered texts (nothing
    without an LLM), counted in the stats."""
    if self.llm is None:
      return None, (), None, ""
    got = ask_cited(self.llm, query, texts, evidence_missing=missing)
    got.count(self.stats)
    return got.answer, got.cited, got.failure, got.error
