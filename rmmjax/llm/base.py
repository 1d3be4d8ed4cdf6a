"""The LLM interface (messages in, text or JSON out) and its two errors."""

from __future__ import annotations

import abc
import json

DEFAULT_MAX_TOKENS = 512
ROLES = ("system", "user", "assistant")
# Prompts are fitted to a context window counted in tokens, without the server's tokenizer: 3
# characters a token is cautious (English text averages about 4; code, numbers and other
# scripts take more tokens per character).
CHARS_PER_TOKEN = 3
MIN_PROMPT_TOKENS = 256  # what a prompt may always hold, however small the window left


class LLMError(RuntimeError):
  """A call that failed: the server could not be reached, kept failing, or rejected the request."""


def check_messages(messages: list[dict]) -> None:
  """ValueError naming the first message (or none) that is not {"role": ..., "content": str}."""
  for i, message in enumerate(messages or [None]):
    if (not isinstance(message, dict) or message.get("role") not in ROLES
        or not isinstance(message.get("content"), str)):
      raise ValueError(f"messages[{i}] must be a dict with a role in {ROLES} and string "
                       f"content, got {message!r:.200}")


def with_schema_note(messages: list[dict], schema: dict) -> list[dict]:
  """The messages with the JSON Schema spelled out, for servers that cannot enforce it."""
  note = ("Reply with one JSON value and nothing else. It must match this JSON Schema:\n"
          + json.dumps(schema, separators=(",", ":")))
  if messages[0]["role"] == "system":
    return [{"role": "system", "content": messages[0]["content"] + "\n\n" + note}, *messages[1:]]
  return [{"role": "system", "content": note}, *messages]


class LLM(abc.ABC):
  """A chat model: `chat` for free text, `chat_structured` for JSON replies."""

  context_tokens: int | None = None  # the model's context window, where it is known

  def prompt_chars(self, max_tokens: int = DEFAULT_MAX_TOKENS) -> int | None:
    """How many characters a prompt may hold so that it and a reply of max_tokens fit the
    context window (None: no window is known, nothing is cut)."""
    if self.context_tokens is None:
      return None
    return max(self.context_tokens - max_tokens, MIN_PROMPT_TOKENS) * CHARS_PER_TOKEN

  @abc.abstractmethod
  def chat(self, messages: list[dict], *, max_tokens: int = DEFAULT_MAX_TOKENS,
           temperature: float = 0.0) -> str:
    """The assistant's reply to the messages; LLMError when the call fails."""

  @abc.abstractmethod
  def chat_structured(self, messages: list[dict], schema: dict, *,
                      max_tokens: int = DEFAULT_MAX_TOKENS, temperature: float = 0.0) -> str:
    """The raw reply text to a request for JSON matching `schema` (not parsed, never checked)."""
