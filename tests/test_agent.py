"""The online agent: citations become rewards and REINFORCE updates, malformed or failing LLMs
earn nothing and never stop it, serving never learns, checkpoints resume, users stay apart."""

import http.server
import json
import threading

import jax
import numpy as np
import pytest

from hash_encoder import HashEncoder
from rmmjax.agent import Agent, AgentSettings
from rmmjax.llm.client import LLMSettings, OpenAICompatibleLLM
from rmmjax.llm.fake import ScriptedLLM
from rmmjax.memory import MemoryBank, NewMemory

TOPICS = {
    "alice": ["Alice adopted a grey cat named Pixel in May", "Alice runs marathons in the spring",
              "Alice works as a nurse at the city hospital", "Alice plays the cello on Sundays",
              "Alice's sister lives in Lisbon", "Alice is learning Japanese"],
    "bob": ["Bob repairs old motorcycles", "Bob is allergic to peanuts",
            "Bob moved to Oslo last winter"],
}


def _bank(path, encoder):
  bank = MemoryBank(path)
  for user, topics in TOPICS.items():
    bank.add_user(user)
    bank.start_session(user, "s1", "2023-05-08")
    bank.add_turns(user, "s1", [(f"{user}-t{i}", user, text) for i, text in enumerate(topics)])
    adds = [NewMemory(text, [f"{user}-t{i}"], encoder.encode([text])[0])
            for i, text in enumerate(topics)]
    bank.apply_reflection(user, "s1", adds, [], encoder.identity)
  return bank


def _cite(*numbers):
  return json.dumps({"answer": "an answer", "citations": list(numbers)})


@pytest.fixture
def bank(tmp_path):
  with _bank(tmp_path / "bank.sqlite", HashEncoder()) as bank:
    yield bank


SETTINGS = AgentSettings(retriever="hybrid", k=6, m=3, batch=4, lr=0.05)


def test_citations_become_rewards_and_every_fourth_answer_updates(bank):
  llm = ScriptedLLM([_cite(1), _cite(2, 3), _cite(), _cite(1)] * 2)
  agent = Agent(bank, HashEncoder(), SETTINGS, llm=llm)
  before = jax.tree.map(np.asarray, agent.state.params)
  updates = [agent.respond("alice", "what is the name of the cat?").updated for _ in range(8)]
  assert updates == [False, False, False, True] * 2
  assert agent.stats["updates"] == 2 and agent.stats["cited"] == 8 and agent.stats["shown"] == 24
  moved = [np.abs(np.asarray(a) - b).max() for a, b in zip(jax.tree.leaves(agent.state.params),
                                                           jax.tree.leaves(before))]
  assert max(moved) > 0
  # The exchange was recorded in alice's open session.
  assert [t.speaker for t in bank.turns("alice", "session-2")][:2] == ["user", "assistant"]


def test_malformed_and_out_of_range_citations_earn_nothing(bank):
  llm = ScriptedLLM(["not json at all", _cite(9, 1), json.dumps({"answer": 3})] + [_cite(1)] * 3)
  agent = Agent(bank, HashEncoder(), SETTINGS, llm=llm)
  responses = [agent.respond("alice", "cello?") for _ in range(6)]
  assert [r.rewarded for r in responses] == [False, True, False, True, True, True]
  assert agent.stats["malformed"] == 2 and agent.stats["invalid_citations"] == 1
  assert responses[1].cited == (0,)
  assert agent.stats["updates"] == 1  # the fourth rewarded answer


class _Failing(http.server.BaseHTTPRequestHandler):
  def do_POST(self):  # noqa: N802
    self.send_response(500)
    self.end_headers()
    self.wfile.write(b"boom")

  def log_message(self, *args):
    pass


def test_a_failing_llm_server_is_counted_and_the_agent_keeps_serving(bank):
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Failing)
  threading.Thread(target=server.serve_forever, daemon=True).start()
  try:
    llm = OpenAICompatibleLLM(LLMSettings(base_url=f"http://127.0.0.1:{server.server_port}",
                                          model="m", retries=1, backoff_s=0.0, timeout_s=5))
    agent = Agent(bank, HashEncoder(), SETTINGS, llm=llm)
    response = agent.respond("alice", "where does her sister live?")
  finally:
    server.shutdown()
  assert response.answer is None and len(response.memories) == 3 and not response.rewarded
  assert agent.stats["llm_errors"] == 1 and agent.stats["updates"] == 0


def test_serving_never_updates_and_is_deterministic(bank):
  agent = Agent(bank, HashEncoder(), AgentSettings(k=6, m=3, learn=False),
                llm=ScriptedLLM([_cite(1)] * 8))
  before = jax.tree.map(np.asarray, agent.state.params)
  first = [m.id for m in agent.respond("alice", "marathon").memories]
  for _ in range(7):
    assert [m.id for m in agent.respond("alice", "marathon").memories] == first
  assert agent.stats["updates"] == 0
  for a, b in zip(jax.tree.leaves(agent.state.params), jax.tree.leaves(before)):
    np.testing.assert_array_equal(a, b)


def test_checkpoints_resume_the_reranker(bank, tmp_path):
  settings = AgentSettings(k=6, m=3, batch=1, lr=0.05, checkpoint_every=2)
  agent = Agent(bank, HashEncoder(), settings, llm=ScriptedLLM([_cite(1)] * 4),
                workdir=tmp_path / "agent")
  for _ in range(4):
    agent.respond("alice", "japanese")
  assert agent.stats["updates"] == 4 and (tmp_path / "agent" / "checkpoints" / "4").exists()
  again = Agent(bank, HashEncoder(), settings, llm=ScriptedLLM([]), workdir=tmp_path / "agent")
  assert again.stats["updates"] == 4 and int(again.state.step) == 4
  for a, b in zip(jax.tree.leaves(again.state.params), jax.tree.leaves(agent.state.params)):
    np.testing.assert_array_equal(a, b)


def test_recall_never_returns_another_users_memory(bank):
  agent = Agent(bank, HashEncoder(), AgentSettings(k=6, m=5, learn=False))
  bob = {m.summary for m in bank.memories("bob")}
  for query in ["Bob motorcycles Oslo peanuts", "cat", "what did Bob repair?"]:
    memories, _ = agent.recall("alice", query)
    assert memories and not {m.summary for m in memories} & bob
  memories, _ = agent.recall("bob", "Bob motorcycles Oslo peanuts")
  assert {m.summary for m in memories} == bob  # the bank holds only three of his


def test_a_bank_embedded_by_another_encoder_is_refused(bank):
  class Other(HashEncoder):
    identity = "another encoder"

  agent = Agent(bank, Other(), AgentSettings(k=6, m=3, learn=False))
  with pytest.raises(ValueError, match="another encoder"):
    agent.recall("alice", "cat")
