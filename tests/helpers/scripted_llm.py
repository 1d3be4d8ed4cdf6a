"""A scripted LLM for the tests: replies in a fixed order and records what it was asked (the
LLM protocol of rmmjax.llm.base, without a server)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from typing import final

from rmmjax.llm.base import DEFAULT_MAX_TOKENS, LLM, check_messages

# A reply: text, JSON to send as text, a function of the messages, or an exception to raise.
Scripted = str | dict | list | BaseException | Callable[[list[dict]], str | dict | list]


class ScriptExhausted(AssertionError):
  """The code under test made more LLM calls than the test scripted."""


@final
@dataclasses.dataclass(frozen=True)
class Request:
  messages: list[dict]
  schema: dict | None  # None for a plain chat
  max_tokens: int
  temperature: float


@final
class ScriptedLLM(LLM):
  """Returns the scripted replies in order; `requests` holds every call it received."""

  def __init__(self, script: Iterable[Scripted], *, context_tokens: int | None = None):
    self._script = list(script)
    self.context_tokens = context_tokens
    self.requests: list[Request] = []

  @property
  def remaining(self) -> int:
    return len(self._script) - len(self.requests)

  def chat(self, messages: list[dict], *, max_tokens: int = DEFAULT_MAX_TOKENS,
           temperature: float = 0.0) -> str:
    return self._next(Request(messages, None, max_tokens, temperature))

  def chat_structured(self, messages: list[dict], schema: dict, *,
                      max_tokens: int = DEFAULT_MAX_TOKENS, temperature: float = 0.0) -> str:
    """The next scripted reply (the schema is recorded, not enforced)."""
    return self._next(Request(messages, schema, max_tokens, temperature))

  def _next(self, request: Request) -> str:
    check_messages(request.messages)
    call = len(self.requests)
    if call >= len(self._script):
      last = request.messages[-1]["content"]
      raise ScriptExhausted(f"LLM call {call + 1} but only {len(self._script)} replies were "
                            f"scripted; its last message: {last[:200]!r}")
    self.requests.append(request)
    item = self._script[call]
    if isinstance(item, BaseException):
      raise item
    if callable(item):
      item = item(request.messages)
    return json.dumps(item) if isinstance(item, (dict, list)) else item
