"""An LLM behind an OpenAI-compatible /v1/chat/completions endpoint (vLLM, llama.cpp, hosted)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Callable
from typing import Literal, final

import httpx

from rmmjax.llm.base import (DEFAULT_MAX_TOKENS, LLM, MIN_PROMPT_TOKENS, LLMError,
                             check_messages, with_schema_note)
from rmmjax.llm.parse import LLMOutputError

log = logging.getLogger(__name__)

StructuredOutput = Literal["json_schema", "json_object", "none"]
STRUCTURED_OUTPUTS = ("json_schema", "json_object", "none")
_RETRIED_STATUS = frozenset({408, 429})  # the 4xx that pass with time, retried like a 5xx
_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]")


@final
@dataclasses.dataclass(frozen=True)
class LLMSettings:
  """Where the server is and how to talk to it. The key itself is never stored here."""

  base_url: str  # with or without a trailing /v1
  model: str
  api_key_env: str = "RMMJAX_LLM_API_KEY"  # name of the environment variable holding the key
  timeout_s: float = 60.0
  retries: int = 3  # attempts after the first, for timeouts, connection errors and 5xx
  backoff_s: float = 0.5  # wait before retry i is backoff_s * 2**i, capped at backoff_max_s
  backoff_max_s: float = 8.0
  # How JSON is asked for: json_schema (OpenAI, vLLM), json_object with a schema (llama.cpp's
  # server), or none (the schema only described in the prompt).
  structured_output: StructuredOutput = "json_schema"
  strict: bool = True  # json_schema's "strict" flag
  # The server's context window in tokens: prompts are cut to fit it with the reply (8,192
  # suits most served models; set the server's own, e.g. llama.cpp's --ctx-size).
  context_tokens: int = 8192

  def __post_init__(self):
    # The flags that reach here unchecked (--model and --structured-output are checked where
    # they are parsed; the retries and backoff have no flag).
    for name, expected, ok in (
        ("base_url", "a URL starting with http:// or https:// and a host",
         lambda v: re.match(r"https?://[^/\s]+", v or "")),
        ("context_tokens", f"an integer of at least {2 * MIN_PROMPT_TOKENS}",
         lambda v: type(v) is int and v >= 2 * MIN_PROMPT_TOKENS),
        ("timeout_s", "> 0", lambda v: v > 0)):
      if not ok(getattr(self, name)):
        raise ValueError(f"{name} must be {expected}, got {getattr(self, name)!r}")

  @property
  def url(self) -> str:
    base = self.base_url.rstrip("/")
    base = base[:-len("/v1")] if base.endswith("/v1") else base
    return base + "/v1/chat/completions"


@final
class _Retryable(Exception):
  """One failed attempt worth trying again; the message names what happened."""


@final
class OpenAICompatibleLLM(LLM):
  """Chat completions over HTTP with retries."""

  def __init__(self, settings: LLMSettings, *, sleep: Callable[[float], None] = time.sleep,
               transport: httpx.BaseTransport | None = None):
    self.settings = settings
    self.context_tokens = settings.context_tokens
    self._sleep = sleep
    self._key = os.environ.get(settings.api_key_env) or ""
    headers = {"Authorization": f"Bearer {self._key}"} if self._key else {}
    self._http = httpx.Client(headers=headers, timeout=settings.timeout_s, transport=transport)

  def __repr__(self) -> str:
    key = "set" if self._key else "unset"
    return (f"OpenAICompatibleLLM(url={self.settings.url!r}, model={self.settings.model!r}, "
            f"key from ${self.settings.api_key_env} ({key}), "
            f"structured_output={self.settings.structured_output!r})")

  def close(self) -> None:
    self._http.close()

  def __enter__(self) -> OpenAICompatibleLLM:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()

  def chat(self, messages: list[dict], *, max_tokens: int = DEFAULT_MAX_TOKENS,
           temperature: float = 0.0) -> str:
    return self._complete(messages, max_tokens, temperature, response_format=None)

  def chat_structured(self, messages: list[dict], schema: dict, *,
                      max_tokens: int = DEFAULT_MAX_TOKENS, temperature: float = 0.0) -> str:
    """The raw reply to a request for JSON, in the configured structured-output form."""
    form = self.settings.structured_output
    if form == "none":
      check_messages(messages)
      return self._complete(with_schema_note(messages, schema), max_tokens, temperature, None)
    body = {key: value for key, value in schema.items() if key != "title"}
    if form == "json_object":
      response_format = {"type": "json_object", "schema": body}
    else:
      name = _SCHEMA_NAME.sub("_", str(schema.get("title") or "reply"))[:64]
      response_format = {"type": "json_schema", "json_schema": {
          "name": name, "schema": body, "strict": self.settings.strict}}
    return self._complete(messages, max_tokens, temperature, response_format)

  def _complete(self, messages: list[dict], max_tokens: int, temperature: float,
                response_format: dict | None) -> str:
    check_messages(messages)
    payload = {"model": self.settings.model, "messages": messages, "max_tokens": max_tokens,
               "temperature": temperature}
    if response_format is not None:
      payload["response_format"] = response_format
    return self._content(self._post_with_retries(payload))

  def _post_with_retries(self, payload: dict) -> dict:
    url, attempts = self.settings.url, self.settings.retries + 1
    for attempt in range(attempts):
      try:
        return self._post_once(url, payload)
      except _Retryable as err:
        last = str(err)
      if attempt + 1 < attempts:
        delay = min(self.settings.backoff_s * 2 ** attempt, self.settings.backoff_max_s)
        log.warning("LLM request to %s failed (%s); retry %d of %d in %.2f s", url, last,
                    attempt + 1, self.settings.retries, delay)
        self._sleep(delay)
    raise LLMError(f"POST {url} failed after {attempts} attempt(s); last error: {last}")

  def _post_once(self, url: str, payload: dict) -> dict:
    """The decoded reply of one attempt; _Retryable for faults that may pass, LLMError if not."""
    try:
      response = self._http.post(url, json=payload)
    except httpx.TimeoutException as err:
      raise _Retryable(f"timed out after {self.settings.timeout_s} s "
                       f"({type(err).__name__})") from err
    except httpx.TransportError as err:
      raise _Retryable(self._redact(f"{type(err).__name__}: {err}")) from err
    status, text = response.status_code, self._redact(response.text[:300])
    if status >= 500 or status in _RETRIED_STATUS:
      raise _Retryable(f"HTTP {status}: {text}")
    if status >= 400:
      hint = " (check the API key variable)" if status in (401, 403) else ""
      raise LLMError(f"POST {url} was rejected with HTTP {status}{hint}, not retried: {text}")
    try:
      reply = response.json()
    except ValueError:
      # A proxy or a half-started server can answer 200 with a page that is not the API's.
      raise _Retryable(f"HTTP {status} with a body that is not JSON: {text!r}") from None
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
      raise _Retryable(f"HTTP {status} with JSON that has no choices: {text!r}")
    return reply

  def _content(self, reply: dict) -> str:
    choice = reply["choices"][0]
    message = choice.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
      # The model answered with nothing usable (a refusal, a tool call): retrying will not help.
      raise LLMOutputError(f"reply from {self.settings.url} has no text content "
                           f"(finish_reason={choice.get('finish_reason')!r}): "
                           f"{self._redact(json.dumps(choice)[:300])}", text="")
    if choice.get("finish_reason") == "length":
      log.warning("LLM reply from %s was cut at max_tokens", self.settings.url)
    return content

  def _redact(self, text: str) -> str:
    """Text with the API key blanked out, in case a server echoes it."""
    return text.replace(self._key, "<redacted>") if self._key else text
