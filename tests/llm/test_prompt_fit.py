"""What one memory and one prompt may hold: prompts cut to the model's context window (longest
texts first, marked, counted), and a summary capped however long the turns it comes from."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hash_encoder import HashEncoder

from rmmjax.agent import Agent, AgentSettings
from rmmjax.data.schema import Conversation, Session, Turn
from rmmjax.llm.base import CHARS_PER_TOKEN, DEFAULT_MAX_TOKENS
from scripted_llm import ScriptedLLM
from rmmjax.llm.context import CUT_MARK, MIN_ITEM_CHARS, fit_texts
from rmmjax.llm.prompts import answer_with_citations, topic_extraction
from rmmjax.memory import MemoryBank, NewMemory
from rmmjax.memory.ingest import ingest_conversations
from rmmjax.memory.reflection import MAX_SUMMARY_CHARS
from rmmjax.memory.topics import OfflineReflector


def _brute_cap(lengths, budget):
  """The largest common length c with sum(min(length, c)) <= budget, by trying every c."""
  return max(c for c in range(0, max(lengths) + 1) if sum(min(n, c) for n in lengths) <= budget)


def test_fit_cuts_the_longest_texts_to_one_length():
  rng = np.random.default_rng(0)
  for _ in range(200):
    texts = ["x" * int(n) for n in rng.integers(1, 400, rng.integers(1, 8))]
    budget = int(rng.integers(len(texts) * MIN_ITEM_CHARS, sum(map(len, texts)) + 50))
    fitted, cut = fit_texts(texts, budget)
    if sum(map(len, texts)) <= budget:
      assert fitted == texts and cut == 0
      continue
    cap = max(_brute_cap([len(t) for t in texts], budget), MIN_ITEM_CHARS)
    assert cut == sum(len(t) > cap for t in texts) > 0
    for old, new in zip(texts, fitted, strict=True):
      assert new == old if len(old) <= cap else (new.endswith(CUT_MARK) and len(new) <= cap)
    assert sum(map(len, fitted)) <= budget
  assert fit_texts(["abc"], None) == (["abc"], 0)


def test_a_huge_memory_is_cut_to_the_context_and_counted(tmp_path):
  encoder, huge = HashEncoder(), "Pixel " * 200_000  # a 1.2 MB memory
  with MemoryBank(tmp_path / "bank.sqlite") as bank:
    bank.add_user("u")
    bank.start_session("u", "s", "2024-01-01")
    texts = [huge, "Alice runs marathons", "Alice plays the cello"]
    bank.add_turns("u", "s", [(f"t{i}", "u", t) for i, t in enumerate(texts)])
    bank.apply_reflection("u", "s", [NewMemory(t[:1000], [f"t{i}"], v) for i, (t, v) in
                                     enumerate(zip(texts, encoder.encode(texts)))], [],
                          encoder.identity)
    llm = ScriptedLLM([json.dumps({"answer": "Pixel", "citations": [1]})], context_tokens=2048)
    agent = Agent(bank, encoder, AgentSettings(k=3, m=3, learn=False), llm=llm)
    agent.respond("u", "what is the cat called, Pixel?")
  (request,) = llm.requests
  sent = sum(len(m["content"]) for m in request.messages)
  assert sent <= (2048 - DEFAULT_MAX_TOKENS) * CHARS_PER_TOKEN
  assert CUT_MARK in request.messages[-1]["content"] and agent.stats["cut_prompts"] == 1
  assert "Alice runs marathons" in request.messages[-1]["content"]  # short memories stay whole
  # Without a known window nothing is cut.
  whole = answer_with_citations("q?", [huge])
  assert whole.cut == 0 and huge.strip() in whole.messages[-1]["content"]


def test_a_huge_turn_becomes_a_capped_summary(tmp_path):
  encoder = HashEncoder()
  huge = "I pasted the whole manual: " + "step " * 200_000
  conv = Conversation("c", (Session("S1", "2024-01-01", (
      Turn("D1:1", "Ann", huge), Turn("D1:2", "Bob", "That is a long manual."))),), ())
  with MemoryBank(tmp_path / "bank.sqlite") as bank:
    counts = ingest_conversations(bank, [conv], OfflineReflector(encoder), encoder, user="u")
    memories = bank.memories("u")
  assert counts["cut_summaries"] == 1
  assert max(len(m.summary) for m in memories) <= MAX_SUMMARY_CHARS
  assert memories[0].summary.endswith(CUT_MARK)
  assert memories[0].snippets[0].text == huge  # the turn itself is kept verbatim
  prompt = topic_extraction([Turn("D1:1", "Ann", huge)], "2024-01-01", max_chars=20_000)
  assert prompt.cut == 1 and sum(len(m["content"]) for m in prompt.messages) <= 20_000


@pytest.mark.parametrize("tokens", [0, 100, 1.5, True])
def test_a_context_window_too_small_is_refused(tokens):
  from rmmjax.llm.client import LLMSettings  # noqa: PLC0415
  with pytest.raises(ValueError, match="context_tokens must be an integer"):
    LLMSettings(base_url="http://127.0.0.1:1", model="m", context_tokens=tokens)
