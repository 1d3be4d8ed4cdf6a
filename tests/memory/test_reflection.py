"""Prospective Reflection: offline topics, add or merge, the LLM reflector, atomicity, topic units
and ingestion."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hash_encoder import HashEncoder

from rmmjax.data.locomo import load_locomo
from rmmjax.data.schema import Conversation, Session, Turn
from rmmjax.retrieve.metrics import question_metrics
from scripted_llm import ScriptedLLM
from rmmjax.llm.parse import LLMOutputError, Topic
from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.ingest import bank_text, ingest_conversations
from rmmjax.memory.records import BankTurn
from rmmjax.memory.topic_units import conversation_units
from rmmjax.memory.reflection import (Candidate, Decision, Extraction, LLMReflector,
                                      ReflectionFailed, Reflector, reflect_session)
from rmmjax.memory.topics import OfflineReflector, segment, turn_text
from rmmjax.retrieve.bm25 import BM25Retriever
from rmmjax.retrieve.units import build_units, turn_units

# Words of each synthetic subject; every other word lands on one small shared axis.
SUBJECTS = {"garden": ("garden", "roses", "tulips", "soil", "seeds"),
            "guitar": ("guitar", "chords", "song", "concert", "strings"),
            "cooking": ("pasta", "recipe", "oven", "sauce", "dinner")}
DATE1, DATE2 = "8 May 2023", "25 May 2023"


class KeywordEncoder:
  """Embeds a text by which subject's words it holds: subjects are orthogonal, so a change of
  subject is an unambiguous drop in cosine."""

  identity = "keywords (4)"
  dim = 4

  def encode(self, texts):
    out = np.zeros((len(texts), self.dim), np.float32)
    for i, text in enumerate(texts):
      for word in re.findall(r"\w+", text.lower()):
        axis = next((a for a, words in enumerate(SUBJECTS.values()) if word in words), None)
        if axis is None:
          out[i, 3] += 0.05
        else:
          out[i, axis] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-6)


def _turns(prefix: str, subjects: list[str], start: int = 1) -> tuple[Turn, ...]:
  """One turn per subject, speakers alternating, each naming two of its subject's words."""
  turns = []
  for i, subject in enumerate(subjects):
    words = SUBJECTS[subject]
    speaker = ("Caroline", "Melanie")[i % 2]
    text = f"I keep thinking about {words[i % 5]} and {words[(i + 2) % 5]} lately."
    turns.append(Turn(f"{prefix}:{start + i}", speaker, text))
  return tuple(turns)


def _conversation(cid: str, sessions: list[tuple[str, list[str]]]) -> Conversation:
  return Conversation(cid, tuple(Session(f"S{n}", date, _turns(f"D{n}", subjects))
                                 for n, (date, subjects) in enumerate(sessions, start=1)), ())


def _bank_with_session(tmp_path, turns: tuple[Turn, ...], date: str = DATE1,
                       session: str = "S1", bank: MemoryBank | None = None) -> MemoryBank:
  bank = bank or MemoryBank(tmp_path / "memory.sqlite")
  if not bank.has_user("u"):
    bank.add_user("u")
  bank.start_session("u", session, date)
  bank.add_turns("u", session, [(t.turn_id, t.speaker, bank_text(t)) for t in turns])
  return bank


def test_offline_topics_split_where_the_subject_changes():
  turns = [BankTurn(t.turn_id, "S1", t.speaker, t.text, DATE1)
           for t in _turns("D1", ["garden"] * 5 + ["guitar"] * 4)]
  topics = OfflineReflector(KeywordEncoder()).extract(turns, DATE1).topics
  assert [t.turn_ids for t in topics] == [tuple(f"D1:{i}" for i in range(1, 6)),
                                          tuple(f"D1:{i}" for i in range(6, 10))]
  # The summary is extractive: the date once, then every turn with its speaker.
  first = topics[0].summary
  assert first.startswith(f"[{DATE1}] Caroline: ") and "\nMelanie: " in first
  assert all(t.text in first for t in turns[:5]) and turns[5].text not in first


def test_segment_caps_and_floors_topic_length():
  same = np.tile(np.eye(3, dtype=np.float32)[0], (30, 1))
  assert [len(r) for r in segment(same, split_below=0.5, min_turns=2, max_turns=12)] == [
      12, 12, 6]
  # Every turn unlike the one before: min_turns still holds topics together.
  flip = np.eye(2, dtype=np.float32)[np.arange(7) % 2]
  parts = segment(flip, split_below=0.5, min_turns=3, max_turns=12)
  assert [list(r) for r in parts] == [[0, 1, 2], [3, 4, 5, 6]]  # a 1-row tail joins
  assert segment(np.zeros((0, 3), np.float32), split_below=0.5, min_turns=1, max_turns=2) == []


def test_near_duplicate_topic_merges_and_keeps_every_snippet(tmp_path):
  encoder = KeywordEncoder()
  reflector = OfflineReflector(encoder)
  bank = _bank_with_session(tmp_path, _turns("D1", ["garden"] * 3 + ["guitar"] * 3))
  first = reflect_session(bank, "u", "S1", reflector, encoder)
  assert (first.topics, first.added, first.merged, first.uncovered_turns) == (2, 2, 0, 0)
  _bank_with_session(tmp_path, _turns("D2", ["garden"] * 3 + ["cooking"] * 3), DATE2, "S2", bank)
  second = reflect_session(bank, "u", "S2", reflector, encoder)
  assert (second.added, second.merged, second.updated) == (1, 1, 1)
  garden, guitar, cooking = bank.memories("u")
  assert [s.turn_id for s in garden.snippets] == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2", "D2:3"]
  assert f"[{DATE1}]" in garden.summary and f"\n[{DATE2}] Caroline: " in garden.summary
  assert [s.turn_id for s in guitar.snippets] == ["D1:4", "D1:5", "D1:6"]
  assert [s.turn_id for s in cooking.snippets] == ["D2:4", "D2:5", "D2:6"]
  _, _, vectors = bank.memory_snapshot("u", encoder.identity)
  np.testing.assert_allclose(vectors[0], encoder.encode([garden.summary])[0], atol=1e-6)
  assert all(s.session_id == "S2" for s in garden.snippets[3:])
  with pytest.raises(ValueError, match="has ended"):
    reflect_session(bank, "u", "S2", reflector, encoder)


def test_two_topics_of_one_session_merge_into_one_memory_once(tmp_path):
  encoder = KeywordEncoder()
  reflector = OfflineReflector(encoder)
  bank = _bank_with_session(tmp_path, _turns("D1", ["garden"] * 3 + ["guitar"] * 3))
  reflect_session(bank, "u", "S1", reflector, encoder)
  subjects = ["garden"] * 2 + ["cooking"] * 2 + ["garden"] * 2
  _bank_with_session(tmp_path, _turns("D2", subjects), DATE2, "S2", bank)
  report = reflect_session(bank, "u", "S2", reflector, encoder)
  # Both garden topics merge (the second into the result of the first): one memory rewritten.
  assert (report.topics, report.merged, report.updated, report.added) == (3, 2, 1, 1)
  garden = bank.memories("u")[0]
  assert [s.turn_id for s in garden.snippets] == [
      "D1:1", "D1:2", "D1:3", "D2:1", "D2:2", "D2:5", "D2:6"]
  assert garden.summary.count(f"[{DATE2}]") == 2 and garden.summary.count(f"[{DATE1}]") == 1


class FixedTopics(Reflector):
  """Given topics; decisions by the offline similarity rule at a chosen threshold."""

  def __init__(self, topics: list[Topic], merge_at: float):
    self.topics, self.rule = topics, OfflineReflector(KeywordEncoder(), merge_at=merge_at)

  def extract(self, turns, date):
    return Extraction(tuple(self.topics))

  def decide(self, topic, candidates):
    return self.rule.decide(topic, candidates)


def test_a_later_topic_compares_with_the_merged_text(tmp_path):
  encoder = KeywordEncoder()
  bank = _bank_with_session(tmp_path, _turns("D1", ["garden"]))
  reflect_session(bank, "u", "S1", FixedTopics([Topic("roses", ("D1:1",))], 0.2), encoder)
  _bank_with_session(tmp_path, _turns("D2", ["guitar"] * 2), DATE2, "S2", bank)
  # The first topic is mostly about the guitar; once merged, the memory is too, and the second
  # topic (only the guitar, unlike the stored "roses") merges into it as well.
  topics = [Topic("roses chords song strings concert", ("D2:1",)), Topic("chords", ("D2:2",))]
  report = reflect_session(bank, "u", "S2", FixedTopics(topics, 0.2), encoder)
  assert (report.merged, report.added, report.updated) == (2, 0, 1)
  (memory,) = bank.memories("u")
  assert memory.summary == "roses\nroses chords song strings concert\nchords"


def test_merge_rule_threshold_and_room():
  reflector = OfflineReflector(KeywordEncoder(), merge_at=0.85, max_merged_turns=4)
  topic = reflector.extract([BankTurn("x", "S", "A", "roses", DATE1)], DATE1).topics[0]
  assert reflector.decide(topic, [Candidate("old", 0.84, 1)]).position is None
  merged = reflector.decide(topic, [Candidate("old", 0.85, 1)])
  assert (merged.position, merged.summary) == (0, f"old\n[{DATE1}] A: roses")
  # A memory without room for the topic's turns is passed over for the next similar one.
  assert reflector.decide(topic, [Candidate("a", 0.99, 4), Candidate("b", 0.9, 3)]).position == 1
  assert reflector.decide(topic, [Candidate("a", 0.99, 4), Candidate("b", 0.5, 1)]).position is None


def _topics(*items) -> dict:
  return {"topics": [{"summary": s, "turn_ids": list(ids)} for s, ids in items]}


def test_llm_reflector_valid_reply_and_out_of_range_turn_ids(tmp_path):
  encoder = HashEncoder()
  bank = _bank_with_session(tmp_path, _turns("D1", ["garden"] * 4))
  llm = ScriptedLLM([_topics(("Caroline grows roses.", ["D1:1", "D1:2", "D9:9"]),
                             ("A topic about nothing shown.", ["D7:7"]))])
  report = reflect_session(bank, "u", "S1", LLMReflector(llm), encoder)
  assert (report.topics, report.added, report.dropped_turn_ids, report.dropped_topics) == (
      1, 1, 2, 1)
  assert report.uncovered_turns == 2 and report.fallbacks == 0
  (memory,) = bank.memories("u")
  assert memory.summary == "Caroline grows roses." and len(memory.snippets) == 2
  assert "[D1:3]" in llm.requests[0].messages[-1]["content"]  # the ids shown to the model
  _bank_with_session(tmp_path, _turns("D2", ["garden"] * 2), DATE2, "S2", bank)
  llm = ScriptedLLM([_topics(("Caroline planted tulips.", ["D2:1"])),
                     {"action": "merge", "index": 1, "summary": "Caroline grows roses, tulips."}])
  report = reflect_session(bank, "u", "S2", LLMReflector(llm), encoder)
  assert (report.merged, report.updated, report.added) == (1, 1, 0)
  (memory,) = bank.memories("u")
  assert memory.summary == "Caroline grows roses, tulips."
  assert [s.turn_id for s in memory.snippets] == ["D1:1", "D1:2", "D2:1"]
  assert "[1] Caroline grows roses." in llm.requests[1].messages[-1]["content"]


@pytest.mark.parametrize("reply", ['{"topics": [oops', "Sure! Here are the topics: roses.",
                                   LLMOutputError("reply has no text content", text=""),
                                   '{"topics": ["a string"]}',
                                   '{"topics": [{"summary": "Roses.", "turn_ids": ["D9:9"]}]}'])
def test_an_unusable_topic_list_never_marks_the_session_reflected(tmp_path, reply):
  encoder = HashEncoder()
  bank = _bank_with_session(tmp_path, _turns("D1", ["garden"] * 2))
  with pytest.raises(ReflectionFailed, match="stays unreflected"):
    reflect_session(bank, "u", "S1", LLMReflector(ScriptedLLM([reply])), encoder)
  assert not bank.sessions("u")[0].ended and bank.memories("u") == []
  # With the offline reflector as fallback its topics replace the list, counted.
  reflector = LLMReflector(ScriptedLLM([reply]), fallback=OfflineReflector(encoder))
  report = reflect_session(bank, "u", "S1", reflector, encoder)
  assert (report.topics, report.fallbacks, report.added) == (1, 1, 1)
  assert bank.sessions("u")[0].ended and len(bank.memories("u")) == 1


def test_an_empty_topic_list_is_the_models_answer_that_nothing_is_worth_keeping(tmp_path):
  bank = _bank_with_session(tmp_path, _turns("D1", ["garden"] * 2))
  report = reflect_session(bank, "u", "S1", LLMReflector(ScriptedLLM(['{"topics": []}'])),
                           HashEncoder())
  assert (report.topics, report.fallbacks, report.uncovered_turns) == (0, 0, 2)
  assert bank.sessions("u")[0].ended and bank.memories("u") == []


def test_llm_reflector_malformed_replies_are_counted_not_raised(tmp_path):
  encoder = HashEncoder()
  bank = _bank_with_session(tmp_path, _turns("D1", ["garden"] * 2))
  reflect_session(bank, "u", "S1", LLMReflector(ScriptedLLM([_topics(("Roses.", ["D1:1"]))])),
                  encoder)
  # The fallback reflector's topics replace an unreadable list; an unreadable decision adds.
  _bank_with_session(tmp_path, _turns("D2", ["garden"] * 2), DATE2, "S2", bank)
  reflector = LLMReflector(ScriptedLLM(["no json at all", "no decision either"]),
                           fallback=OfflineReflector(encoder))
  report = reflect_session(bank, "u", "S2", reflector, encoder)
  assert (report.topics, report.fallbacks, report.added) == (1, 2, 1)
  _bank_with_session(tmp_path, _turns("D3", ["garden"] * 2), DATE2, "S3", bank)
  llm = ScriptedLLM([_topics(("More roses.", ["D3:1"])), {"action": "merge", "index": 7}])
  report = reflect_session(bank, "u", "S3", LLMReflector(llm), encoder)
  assert (report.added, report.merged, report.fallbacks) == (1, 0, 1)
  # A decision reply with no text at all adds the topic too.
  _bank_with_session(tmp_path, _turns("D4", ["garden"] * 2), DATE2, "S4", bank)
  llm = ScriptedLLM([_topics(("Seeds.", ["D4:2"])),
                     LLMOutputError("reply has no text content", text="")])
  report = reflect_session(bank, "u", "S4", LLMReflector(llm), encoder)
  assert (report.added, report.merged, report.fallbacks) == (1, 0, 1)


def test_reflection_is_atomic_when_the_reflector_fails_midway(tmp_path):
  encoder = HashEncoder()
  bank = _bank_with_session(tmp_path, _turns("D1", ["garden"] * 2))
  reflect_session(bank, "u", "S1", LLMReflector(ScriptedLLM([_topics(("Roses.", ["D1:1"]))])),
                  encoder)
  _bank_with_session(tmp_path, _turns("D2", ["garden"] * 2), DATE2, "S2", bank)
  before = bank.export_user("u")
  llm = ScriptedLLM([_topics(("Tulips.", ["D2:1"]), ("Seeds.", ["D2:2"])),
                     {"action": "merge", "index": 1, "summary": "Roses and tulips."},
                     RuntimeError("the server went away")])
  with pytest.raises(RuntimeError, match="went away"):
    reflect_session(bank, "u", "S2", LLMReflector(llm), encoder)
  assert llm.remaining == 0 and bank.export_user("u") == before
  assert not bank.sessions("u")[1].ended  # so the reflection can simply be run again


def test_a_reflector_that_breaks_its_contract_is_named(tmp_path):
  class Broken(Reflector):
    def extract(self, turns, date):
      return OfflineReflector(KeywordEncoder()).extract(turns, date)

    def decide(self, topic, candidates):
      return Decision(5, "x")

  encoder = KeywordEncoder()
  bank = _bank_with_session(tmp_path, _turns("D1", ["garden"] * 2 + ["guitar"] * 2))
  with pytest.raises(ValueError, match="Broken.decide chose candidate 5"):
    reflect_session(bank, "u", "S1", Broken(), encoder)


def test_topic_units_of_a_locomo_conversation(three):
  conv = load_locomo(three)[0][0]
  with pytest.raises(ValueError, match="'topic' need an encoder"):
    conversation_units(conv, "topic")
  encoder = HashEncoder()
  units = conversation_units(conv, "topic", encoder=encoder)
  assert [u.text for u in conversation_units(conv, "turn")] == [
      u.text for u in build_units(conv, "turn")]
  covered = [t for u in units for t in u.turn_ids]
  assert sorted(covered) == sorted(conv.turn_ids())  # every turn in exactly one topic
  assert all(u.words == len(u.text.split()) > 0 and u.text.startswith("[") for u in units)
  assert len({u.unit_id for u in units}) == len(units)
  # The offline reflector embeds each turn as exactly the text of its turn unit (a shared cache).
  session = conv.sessions[0]
  assert [turn_text(BankTurn(t.turn_id, "S1", t.speaker, bank_text(t), session.date),
                    session.date) for t in session.turns] == [u.text for u in turn_units(session)]
  questions = [q for q in conv.questions if q.evidence]
  order = BM25Retriever([u.text for u in units]).rank([q.question for q in questions], 5)
  recall = np.mean([question_metrics([(units[i].turn_ids, units[i].words) for i in row],
                                     set(q.evidence), 1, (5,))["recall_all@5"]
                    for q, row in zip(questions, order, strict=True)])
  assert 0.3 < recall <= 1.0


def test_ingest_replays_sessions_and_is_idempotent(tmp_path):
  encoder = KeywordEncoder()
  convs = [_conversation("a", [(DATE1, ["garden"] * 3 + ["guitar"] * 3),
                               (DATE2, ["garden"] * 3)]),
           _conversation("b", [(DATE1, ["cooking"] * 4)])]
  bank = MemoryBank(tmp_path / "memory.sqlite")
  # A run stopped after writing a's first session's turns but before its reflection.
  bank.add_user("a")
  bank.ingest_session("a", "S1", DATE1,
                      [(t.turn_id, t.speaker, t.text) for t in convs[0].sessions[0].turns])
  counts = ingest_conversations(bank, convs, OfflineReflector(encoder), encoder,
                                user_per_conversation=True)
  assert {k: counts[k] for k in ("users", "sessions", "sessions_skipped", "turns", "topics",
                                 "memories_added", "memories_merged")} == {
      "users": 2, "sessions": 3, "sessions_skipped": 0, "turns": 7, "topics": 4,
      "memories_added": 3, "memories_merged": 1}
  exported = {u: bank.export_user(u) for u in ("a", "b")}
  again = ingest_conversations(bank, convs, OfflineReflector(encoder), encoder,
                               user_per_conversation=True)
  assert (again["sessions"], again["sessions_skipped"], again["turns"]) == (0, 3, 0)
  assert {u: bank.export_user(u) for u in ("a", "b")} == exported
  assert len(bank.turns("a")) == 9


def test_ingest_refuses_what_cannot_be_one_history(tmp_path):
  encoder = KeywordEncoder()
  convs = [_conversation("a", [(DATE1, ["garden"])]), _conversation("b", [(DATE1, ["garden"])])]
  bank = MemoryBank(tmp_path / "memory.sqlite")
  with pytest.raises(ValueError, match="session id 'S1' occurs 2 times"):
    ingest_conversations(bank, convs, OfflineReflector(encoder), encoder, user="me")
  with pytest.raises(ValueError, match="the user must be a non-empty string"):
    ingest_conversations(bank, convs, OfflineReflector(encoder), encoder)
  ingest_conversations(bank, convs[:1], OfflineReflector(encoder), encoder, user="me")
  other = _conversation("c", [(DATE2, ["guitar"])])
  with pytest.raises(ValueError, match="differs from the one being ingested"):
    ingest_conversations(bank, [other], OfflineReflector(encoder), encoder, user="me")
  assert bank.users() == ["me"]
