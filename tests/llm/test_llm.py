"""LLM layer: the HTTP client against a scripted local server, the fake, prompts and parsers."""

from __future__ import annotations

import dataclasses
import http.server
import json
import socket
import threading
import time

import pytest

from rmmjax.llm import (
    LLMError, LLMOutputError, LLMSettings, OpenAICompatibleLLM, add_or_merge, answer_judge,
    answer_with_citations, extract_json, parse_answer, parse_merge, parse_sufficiency,
    parse_topics, parse_verdict, sufficiency_judge, topic_extraction)
from scripted_llm import ScriptedLLM, ScriptExhausted

KEY = "sk-test-very-secret-4242"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
SCHEMA = {"title": "verdict", "type": "object", "properties": {"correct": {"type": "boolean"}},
          "required": ["correct"], "additionalProperties": False}


def _ok(content: str) -> tuple:
  return ("json", 200, {"id": "x", "choices": [{"index": 0, "finish_reason": "stop",
                                                 "message": {"role": "assistant",
                                                             "content": content}}]})


class _ScriptedServer(http.server.ThreadingHTTPServer):
  """Answers each POST with the next scripted action and records what it received."""

  daemon_threads = True
  block_on_close = False  # a handler still sleeping past a client timeout must not block teardown

  def __init__(self):
    super().__init__(("127.0.0.1", 0), _Handler)
    self.actions: list[tuple] = []
    self.seen: list[dict] = []

  @property
  def base_url(self) -> str:
    return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):

  def log_message(self, *args) -> None:  # keeps the test output clean
    pass

  def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
    server: _ScriptedServer = self.server  # type: ignore[assignment]
    raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
    server.seen.append({"path": self.path, "headers": dict(self.headers),
                        "body": json.loads(raw)})
    kind, *args = server.actions.pop(0) if server.actions else _ok("default")
    if kind == "sleep":
      time.sleep(args[0])
      kind, *args = _ok("too late")
    status, payload = args[0], args[1]
    if kind == "json":
      payload = json.dumps(payload).encode()
    elif kind == "echo_auth":  # a careless server that repeats the credentials it got
      payload = f"bad credentials: {self.headers.get('Authorization')}".encode()
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(payload)))
      self.end_headers()
      self.wfile.write(payload)
    except (BrokenPipeError, ConnectionResetError):
      pass  # the client gave up (timeout test)


@pytest.fixture
def server():
  srv = _ScriptedServer()
  thread = threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True)
  thread.start()
  yield srv
  srv.shutdown()
  srv.server_close()


@pytest.fixture
def keyed(monkeypatch):
  monkeypatch.setenv("RMMJAX_LLM_API_KEY", KEY)


def _client(base_url: str, sleeps: list | None = None, **overrides) -> OpenAICompatibleLLM:
  settings = LLMSettings(base_url=base_url, model="tiny-model", timeout_s=2.0, **overrides)
  return OpenAICompatibleLLM(settings, sleep=(sleeps.append if sleeps is not None else
                                              lambda _: None))


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_chat_sends_model_messages_and_key(server, keyed, suffix):
  server.actions = [_ok("hello there")]
  with _client(server.base_url + suffix) as llm:
    assert llm.chat(MESSAGES, max_tokens=7, temperature=0.5) == "hello there"
  (request,) = server.seen
  assert request["path"] == "/v1/chat/completions"
  assert request["headers"]["Authorization"] == f"Bearer {KEY}"
  assert request["body"] == {"model": "tiny-model", "messages": MESSAGES, "max_tokens": 7,
                             "temperature": 0.5}


def test_no_key_no_header_and_key_name_is_a_setting(server, monkeypatch):
  monkeypatch.delenv("RMMJAX_LLM_API_KEY", raising=False)
  monkeypatch.setenv("OTHER_KEY_VAR", "k-2")
  server.actions = [_ok("a"), _ok("b")]
  _client(server.base_url).chat(MESSAGES)
  _client(server.base_url, api_key_env="OTHER_KEY_VAR").chat(MESSAGES)
  assert "Authorization" not in server.seen[0]["headers"]
  assert server.seen[1]["headers"]["Authorization"] == "Bearer k-2"


def test_structured_output_forms(server):
  body = {key: value for key, value in SCHEMA.items() if key != "title"}
  server.actions = [_ok('{"correct": true}')] * 3
  for form in ("json_schema", "json_object", "none"):
    reply = _client(server.base_url, structured_output=form).chat_structured(MESSAGES, SCHEMA)
    assert extract_json(reply) == {"correct": True}
  sent = [request["body"] for request in server.seen]
  assert sent[0]["response_format"] == {"type": "json_schema", "json_schema": {
      "name": "verdict", "schema": body, "strict": True}}
  assert sent[1]["response_format"] == {"type": "json_object", "schema": body}
  assert "response_format" not in sent[2]
  assert sent[2]["messages"][0]["role"] == "system"
  assert json.dumps(SCHEMA, separators=(",", ":")) in sent[2]["messages"][0]["content"]
  assert sent[2]["messages"][1:] == MESSAGES[1:]
  assert all(body_["messages"] == MESSAGES for body_ in sent[:2])


def test_5xx_is_retried_with_backoff_then_succeeds(server):
  server.actions = [("raw", 500, b"boom"), ("raw", 503, b"busy"), _ok("fine")]
  sleeps: list[float] = []
  llm = _client(server.base_url, sleeps, retries=3, backoff_s=0.25)
  assert llm.chat(MESSAGES) == "fine"
  assert len(server.seen) == 3
  assert sleeps == [0.25, 0.5]


def test_persistent_5xx_raises_naming_url_and_status_without_the_key(server, keyed):
  server.actions = [("echo_auth", 500, b"")] * 4
  sleeps: list[float] = []
  llm = _client(server.base_url, sleeps, retries=3, backoff_s=1.0, backoff_max_s=3.0)
  with pytest.raises(LLMError) as err:
    llm.chat(MESSAGES)
  message = str(err.value)
  assert len(server.seen) == 4 and sleeps == [1.0, 2.0, 3.0]
  assert f"{server.base_url}/v1/chat/completions" in message and "HTTP 500" in message
  assert "4 attempt" in message
  assert KEY not in message and KEY not in repr(llm) and "RMMJAX_LLM_API_KEY" in repr(llm)


def test_timeout_is_retried_then_raised(server):
  server.actions = [("sleep", 0.4)] * 3
  llm = OpenAICompatibleLLM(LLMSettings(base_url=server.base_url, model="m", timeout_s=0.1,
                                        retries=2), sleep=lambda _: None)
  with pytest.raises(LLMError, match="timed out after 0.1 s"):
    llm.chat(MESSAGES)
  assert len(server.seen) == 3


@pytest.mark.parametrize("body, why", [
    (b"<html>gateway hiccup</html>", "not JSON"),
    (b'{"id": "x", "object": "chat.completion"}', "no choices"),
    (b'{"choices": []}', "no choices"),
    (b'["choices"]', "no choices")])
def test_garbage_bodies_are_retried_then_raised(server, body, why):
  server.actions = [("raw", 200, body)] * 3
  llm = _client(server.base_url, retries=2)
  with pytest.raises(LLMError, match=why):
    llm.chat(MESSAGES)
  assert len(server.seen) == 3


@pytest.mark.parametrize("status, hint", [(400, "not retried"), (401, "API key"),
                                          (404, "not retried")])
def test_4xx_is_not_retried(server, keyed, status, hint):
  server.actions = [("echo_auth", status, b"")]
  with pytest.raises(LLMError, match=f"HTTP {status}") as err:
    _client(server.base_url, retries=3).chat(MESSAGES)
  assert len(server.seen) == 1
  assert hint in str(err.value) and KEY not in str(err.value)


def test_rate_limit_is_retried(server):
  server.actions = [("raw", 429, b"slow down"), _ok("ok")]
  assert _client(server.base_url).chat(MESSAGES) == "ok"
  assert len(server.seen) == 2


def test_connection_refused_is_retried_then_raised():
  with socket.socket() as probe:  # a port that nothing listens on once closed
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
  sleeps: list[float] = []
  with pytest.raises(LLMError, match="ConnectError") as err:
    _client(f"http://127.0.0.1:{port}", sleeps, retries=1).chat(MESSAGES)
  assert f"127.0.0.1:{port}/v1/chat/completions" in str(err.value)
  assert "2 attempt" in str(err.value) and len(sleeps) == 1


def test_unusable_content_raises_output_errors(server):
  server.actions = [_ok("I think it is correct."),
                    ("json", 200, {"choices": [{"message": {"content": None},
                                                "finish_reason": "content_filter"}]})]
  llm = _client(server.base_url)
  with pytest.raises(LLMOutputError, match="no JSON") as err:
    extract_json(llm.chat_structured(MESSAGES, SCHEMA))
  assert err.value.text == "I think it is correct."
  with pytest.raises(LLMOutputError, match="content_filter"):
    llm.chat(MESSAGES)
  assert len(server.seen) == 2


@pytest.mark.parametrize("overrides, named", [
    ({"base_url": "localhost:8080"}, "localhost:8080"),
    ({"timeout_s": 0}, "timeout_s")])
def test_settings_are_validated(overrides, named):
  values = {"base_url": "http://127.0.0.1:1", "model": "m", **overrides}
  with pytest.raises(ValueError, match=named):
    LLMSettings(**values)


def test_bad_messages_are_rejected_before_sending():
  with pytest.raises(ValueError, match=r"messages\[0\]"):
    _client("http://127.0.0.1:1").chat([{"role": "robot", "content": "x"}])


# The fake.


def test_scripted_llm_replies_in_order_and_records():
  llm = ScriptedLLM(["plain", {"correct": False}, lambda m: m[-1]["content"].upper(),
                     TimeoutError("scripted")])
  assert llm.chat(MESSAGES) == "plain"
  assert extract_json(llm.chat_structured(MESSAGES, SCHEMA)) == {"correct": False}
  assert llm.chat(MESSAGES, max_tokens=3) == "HI?"
  with pytest.raises(TimeoutError):
    llm.chat(MESSAGES)
  assert [r.schema for r in llm.requests] == [None, SCHEMA, None, None]
  assert llm.requests[2].max_tokens == 3 and llm.remaining == 0
  with pytest.raises(ScriptExhausted, match="only 4 replies"):
    llm.chat(MESSAGES)


# Reading JSON out of replies.


@pytest.mark.parametrize("text, expected", [
    ('{"a": 1}', {"a": 1}),
    ('  [1, 2] ', [1, 2]),
    ('```json\n{"a": [1, {"b": "}"}]}\n```', {"a": [1, {"b": "}"}]}),
    ('Sure! Here it is:\n```\n{"a": 2}\n```\nAnything else?', {"a": 2}),
    ('The answer [see notes] is {"a": 3} as shown.', {"a": 3}),
    ("{'a': 1} then {\"a\": 4}", {"a": 4})])
def test_extract_json_tolerates_fences_and_text(text, expected):
  assert extract_json(text) == expected


@pytest.mark.parametrize("text", ["", "no json here", "42", '"just a string"',
                                  '{"topics": [{"summary": "x", "turn_ids": ["D1:1"]}, {"su'])
def test_extract_json_rejects_text_without_a_whole_value(text):
  with pytest.raises(LLMOutputError, match="no JSON"):
    extract_json(text)


# Prompts and their parsers.


@dataclasses.dataclass(frozen=True)
class _Turn:
  turn_id: str
  speaker: str
  text: str


TURNS = [_Turn("D1:1", "Ana", "I start my new job at the bakery on Monday."),
         _Turn("D1:2", "Ben", "Congrats!\nWhich  bakery?"), _Turn("D1:3", "Ana", "Rosa's.")]


def _strict_shape(schema: object) -> None:
  """Every object in the schema lists all its properties as required and allows no others."""
  if isinstance(schema, dict):
    if schema.get("type") == "object":
      assert schema["required"] == list(schema["properties"])
      assert schema["additionalProperties"] is False
    for value in schema.values():
      _strict_shape(value)
  elif isinstance(schema, list):
    for value in schema:
      _strict_shape(value)


def test_topic_prompt_shows_ids_speakers_and_dates():
  prompt = topic_extraction(TURNS, "8 May 2023")
  user = prompt.messages[-1]["content"]
  assert "[D1:2] 8 May 2023 - Ben: Congrats! Which bakery?" in user
  topic = prompt.schema["properties"]["topics"]["items"]
  assert topic["properties"]["turn_ids"]["items"]["enum"] == ["D1:1", "D1:2", "D1:3"]
  _strict_shape(prompt.schema)


def test_parse_topics_keeps_only_shown_turn_ids():
  reply = {"topics": [
      {"summary": " Ana starts a job at Rosa's bakery. ", "turn_ids": ["D1:1", "[D1:3]", "D9:9",
                                                                        "D1:1"]},
      {"summary": "Invented", "turn_ids": ["D7:1", 5]},
      {"summary": "", "turn_ids": ["D1:2"]},
      {"summary": "no ids", "turn_ids": "D1:2"},
      "not a topic"]}
  result = parse_topics(json.dumps(reply), [t.turn_id for t in TURNS])
  assert [(t.summary, t.turn_ids) for t in result.topics] == [
      ("Ana starts a job at Rosa's bakery.", ("D1:1", "D1:3"))]
  assert (result.dropped_turn_ids, result.dropped_topics, result.malformed) == (3, 4, False)


def test_parse_topics_numbers_bare_lists_and_garbage():
  numeric = parse_topics('```json\n[{"summary": "s", "turn_ids": [3, "4"]}]\n```', ["3", "4"])
  assert numeric.topics[0].turn_ids == ("3", "4") and not numeric.malformed
  assert parse_topics('{"topics": []}', ["1"]).topics == ()
  for bad in ("sorry, no", '{"topic": []}', None, '{"topics": "none"}'):
    assert parse_topics(bad, ["1"]).malformed


def test_merge_prompt_and_parser():
  prompt = add_or_merge("Ana now bakes at Rosa's.", ["Ana likes bread.", "Ben runs.", "x"])
  assert "[1] Ana likes bread.\n[2] Ben runs.\n[3] x" in prompt.messages[-1]["content"]
  assert prompt.schema["properties"]["index"]["anyOf"][0]["enum"] == [1, 2, 3]
  _strict_shape(prompt.schema)
  merged = parse_merge('{"action": "merge", "index": 2, "summary": "Both."}', 3)
  assert (merged.action, merged.position, merged.summary, merged.fell_back) == (
      "merge", 1, "Both.", False)
  assert parse_merge({"action": "ADD"}, 3) == parse_merge(
      {"action": "add", "index": None, "summary": None}, 3)
  assert not parse_merge({"action": "add"}, 3).fell_back
  assert parse_merge({"action": "merge", "index": "[3]", "summary": "s"}, 3).position == 2


@pytest.mark.parametrize("reply", [
    {"action": "merge", "index": 4, "summary": "s"},
    {"action": "merge", "index": 0, "summary": "s"},
    {"action": "merge", "index": True, "summary": "s"},
    {"action": "merge", "index": 1, "summary": "  "},
    {"action": "delete", "index": 1, "summary": "s"},
    "merge it into 2",
    [{"action": "merge"}]])
def test_invalid_merge_falls_back_to_add(reply):
  decision = parse_merge(reply, 3)
  assert (decision.action, decision.position, decision.fell_back) == ("add", None, True)


def test_answer_prompt_numbers_memories():
  prompt = answer_with_citations("Where does Ana work?", ["Ana bakes.", "Ben runs."],
                                 current_session="Ana: hi")
  user = prompt.messages[-1]["content"]
  assert "[1] Ana bakes.\n[2] Ben runs." in user and "Ana: hi" in user
  assert prompt.schema["properties"]["citations"]["items"]["enum"] == [1, 2]
  _strict_shape(prompt.schema)
  empty = answer_with_citations("Where?", [])
  assert empty.schema["properties"]["citations"]["maxItems"] == 0


def test_parse_answer_validates_citations():
  result = parse_answer('Here: {"answer": " Rosa\'s bakery ", "citations": [2, "1", 2, 7, 0, '
                        'true, "two", null]}', 3)
  assert (result.answer, result.cited, result.invalid_citations, result.malformed) == (
      "Rosa's bakery", (1, 0), 5, False)
  assert parse_answer({"answer": 1987, "citations": []}, 3).answer == "1987"
  assert parse_answer({"answer": "x", "citations": [1]}, 0).invalid_citations == 1


@pytest.mark.parametrize("reply, answer", [
    ("She works at Rosa's [1].", "She works at Rosa's [1]."),
    ('{"answer": "x", "citations": 1}', "x"),
    ('{"answer": ["x"], "citations": [1]}', ""),
    ('{"answer": "cut off", "citations": [1', '{"answer": "cut off", "citations": [1'),
    (None, "")])
def test_malformed_answers_earn_no_citations(reply, answer):
  result = parse_answer(reply, 3)
  assert (result.answer, result.cited, result.malformed) == (answer, (), True)


def test_judge_prompt_and_verdicts():
  prompt = answer_judge("When?", "May 2023", "in May")
  assert "Reference answer: May 2023" in prompt.messages[-1]["content"]
  _strict_shape(prompt.schema)
  assert parse_verdict('{"correct": true}') == parse_verdict({"correct": "True"})
  assert parse_verdict({"correct": False}).correct is False
  for bad in ('{"correct": "maybe"}', '{"correct": 1}', "yes", {"verdict": True}):
    verdict = parse_verdict(bad)
    assert verdict.malformed and not verdict.correct


def test_sufficiency_prompt_and_parser():
  prompt = sufficiency_judge("When did Ana start?", ["Ana starts Monday.", "It is May."])
  assert "[2] It is May." in prompt.messages[-1]["content"]
  _strict_shape(prompt.schema)
  good = parse_sufficiency('{"label": "inferrable", "confidence": 0.8, "missing": ""}')
  assert (good.label, good.confidence, good.malformed) == ("INFERRABLE", 0.8, False)
  clipped = parse_sufficiency({"label": "EXACT", "confidence": 3, "missing": "none"})
  assert (clipped.confidence, clipped.missing) == (1.0, "none")
  for bad in ({"label": "SURE", "confidence": 0.9}, {"label": "EXACT", "confidence": "high"},
              {"label": "EXACT", "confidence": float("nan")}, "EXACT"):
    result = parse_sufficiency(bad)
    assert (result.label, result.confidence, result.malformed) == ("PARTIAL", 0.0, True)


def test_prompts_through_the_fake_end_to_end():
  llm = ScriptedLLM(['{"topics": [{"summary": "Ana bakes.", "turn_ids": ["D1:1"]}]}',
                     '{"answer": "Rosa\'s", "citations": [1, 9]}'])
  shown = [t.turn_id for t in TURNS]
  topics = topic_extraction(TURNS, "today")
  extracted = parse_topics(llm.chat_structured(topics.messages, topics.schema), shown)
  assert extracted.topics[0].turn_ids == ("D1:1",)
  memories = [t.summary for t in extracted.topics]
  prompt = answer_with_citations("Where?", memories)
  answer = parse_answer(llm.chat_structured(prompt.messages, prompt.schema), len(memories))
  assert (answer.cited, answer.invalid_citations) == ((0,), 1)
  assert llm.requests[1].schema == prompt.schema
