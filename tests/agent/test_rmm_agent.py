"""The online agent: citations become rewards and REINFORCE updates, malformed or failing LLMs
earn nothing and never stop it, serving never learns, checkpoints resume, users stay apart."""

import dataclasses
import http.server
import json
import threading

import jax
import numpy as np
import pytest

from hash_encoder import HashEncoder
from rmmjax import core
from rmmjax.learners.embedding.model import EMBEDDING
from rmmjax.agent import Agent, AgentSettings
from rmmjax.learners.loaded import LoadedReranker
from rmmjax.llm.client import LLMSettings, OpenAICompatibleLLM
from scripted_llm import ScriptedLLM
from rmmjax.memory import MemoryBank, NewMemory

TOPICS = {
    "alice": ["Alice adopted a grey cat named Pixel in May", "Alice runs marathons in the spring",
              "Alice works as a nurse at the city hospital", "Alice plays the cello on Sundays",
              "Alice's sister lives in Lisbon", "Alice is learning Japanese"],
    "bob": ["Bob repairs old motorcycles", "Bob is allergic to peanuts",
            "Bob moved to Oslo last winter"],
}


def _bank(path, encoder, key=None):
  bank = MemoryBank(path, key=key)
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
  assert [t.speaker for t in bank.turns("alice", "chat-1")][:2] == ["user", "assistant"]


def test_an_empty_answer_earns_nothing(bank):
  llm = ScriptedLLM([json.dumps({"answer": " ", "citations": [1]})])
  agent = Agent(bank, HashEncoder(), dataclasses.replace(SETTINGS, batch=1), llm=llm)
  response = agent.respond("alice", "the cat?")
  assert (response.rewarded, response.updated, response.failure) == (False, False, "malformed")
  assert agent.stats["updates"] == 0 and agent.stats["cited"] == 0
  assert [t.speaker for t in bank.turns("alice", "chat-1")] == ["user"]


def test_a_workdir_that_cannot_be_written_is_refused_by_name(bank, tmp_path):
  (tmp_path / "a file").write_text("x")
  with pytest.raises(ValueError, match="cannot be written"):
    Agent(bank, HashEncoder(), SETTINGS, llm=ScriptedLLM([]), workdir=tmp_path / "a file" / "w")
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "notes.txt").write_text("not the agent's")
  with pytest.raises(ValueError, match="not an agent workdir"):
    Agent(bank, HashEncoder(), SETTINGS, llm=ScriptedLLM([]), workdir=tmp_path / "other")


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


def _params(agent):
  return [np.asarray(x) for x in jax.tree.leaves(agent.state.params)]


def test_serving_never_updates_where_learning_would(bank):
  questions = ["marathon", "cello", "japanese", "lisbon"] * 2
  learner = Agent(bank, HashEncoder(), SETTINGS, llm=ScriptedLLM([_cite(1)] * 8))
  server = Agent(bank, HashEncoder(), dataclasses.replace(SETTINGS, learn=False),
                 llm=ScriptedLLM([_cite(1)] * 9))
  before = _params(server)
  first = [m.id for m in server.respond("alice", "marathon").memories]
  for question in questions:
    learner.respond("alice", question)
    if question == "marathon":
      assert [m.id for m in server.respond("alice", question).memories] == first
    else:
      server.respond("alice", question)
  # The same answers and citations moved the learner's weights, and left the server's alone.
  assert learner.stats["updates"] == 2 and server.stats["updates"] == 0
  assert max(np.abs(a - b).max() for a, b in zip(_params(learner), before)) > 0
  assert all(np.array_equal(a, b) for a, b in zip(_params(server), before))


def _learn(agent, questions):
  for question in questions:
    agent.respond("alice", question)


QUESTIONS = ["japanese", "cello", "the cat", "marathon", "nurse", "lisbon", "pixel"]


def test_every_update_is_checkpointed_and_pending_answers_survive_a_restart(bank, tmp_path):
  settings = dataclasses.replace(SETTINGS, batch=2)
  whole = Agent(bank, HashEncoder(), settings, llm=ScriptedLLM([_cite(1), _cite(2)] * 4))
  _learn(whole, QUESTIONS)
  # The same questions, the process gone after the third answer (no clean exit).
  first = Agent(bank, HashEncoder(), settings, llm=ScriptedLLM([_cite(1), _cite(2)] * 4),
                workdir=tmp_path / "agent")
  _learn(first, QUESTIONS[:3])
  assert (tmp_path / "agent" / "checkpoints" / "1").exists() and first.pending == 1
  first.workdir.close()  # what the kernel does to the lock of a killed process
  again = Agent(bank, HashEncoder(), settings, llm=ScriptedLLM([_cite(2), _cite(1)] * 2),
                workdir=tmp_path / "agent")
  assert again.stats["updates"] == 1 and again.pending == 1 and again.stats["queries"] == 3
  _learn(again, QUESTIONS[3:])
  assert again.stats["updates"] == whole.stats["updates"] == 3
  assert (tmp_path / "agent" / "checkpoints" / "3").exists()
  for a, b in zip(_params(again), _params(whole)):
    np.testing.assert_array_equal(a, b)
  again.close()


def test_pending_answers_of_another_layout_are_refused_naming_it(tmp_path):
  from rmmjax.agent.workdir import AgentWorkdir
  workdir = AgentWorkdir(tmp_path, {}, learning=False)
  # A cross reranker's pair tokens as they were kept before token segments: nothing converts.
  np.savez(tmp_path / "pending.npz", base_step=np.int64(0), q=np.zeros((1, 2)),
           tokens=np.zeros((1, 2, 4), np.int32), token_mask=np.ones((1, 2, 4), bool))
  with pytest.raises(ValueError, match="pending.npz was written in rmmjax's layout of pair "
                     "tokens with a token_mask; this rmmjax reads their token_segments"):
    workdir._pending(0)


def test_a_restart_with_other_settings_or_a_second_learner_is_refused(bank, tmp_path):
  agent = Agent(bank, HashEncoder(), SETTINGS, llm=ScriptedLLM([_cite(1)] * 4),
                workdir=tmp_path / "agent")
  _learn(agent, QUESTIONS[:4])
  with pytest.raises(ValueError, match="in use by another learning agent"):
    Agent(bank, HashEncoder(), SETTINGS, llm=ScriptedLLM([]), workdir=tmp_path / "agent")
  agent.close()
  changed = dataclasses.replace(SETTINGS, tau=2.0, lr=0.5)
  with pytest.raises(ValueError, match=r"tau: 0.5 -> 2.0; lr: 0.05 -> 0.5"):
    Agent(bank, HashEncoder(), changed, llm=ScriptedLLM([]), workdir=tmp_path / "agent")
  again = Agent(bank, HashEncoder(), SETTINGS, llm=ScriptedLLM([]), workdir=tmp_path / "agent")
  assert int(again.state.step) == 1 and float(again.state.hparams.tau) == 0.5
  again.close()
  # Serving reads the weights whatever it would learn with, but not from other candidates.
  serving = dataclasses.replace(changed, learn=False)
  assert int(Agent(bank, HashEncoder(), serving, workdir=tmp_path / "agent").state.step) == 1
  with pytest.raises(ValueError, match="retriever: 'hybrid' -> 'bm25'"):
    Agent(bank, HashEncoder(), dataclasses.replace(serving, retriever="bm25"),
          workdir=tmp_path / "agent")


def test_an_exchange_whose_session_ended_meanwhile_is_kept_and_then_learnt(bank, tmp_path):
  """Another process reflects the chat session while this answer is being written."""
  other = Agent(bank, HashEncoder(), dataclasses.replace(SETTINGS, learn=False))
  agent = Agent(bank, HashEncoder(), dataclasses.replace(SETTINGS, batch=1),
                llm=ScriptedLLM([_cite(1), lambda messages: (other.end_session("alice"),
                                                              _cite(2))[1]]))
  assert agent.respond("alice", "the cat?").session_id == "chat-1"
  response = agent.respond("alice", "her sister?")
  assert response.updated and response.session_id == "chat-2"
  assert bank.sessions("alice")[-2].ended  # chat-1, reflected by the other agent
  assert [t.text for t in bank.turns("alice", "chat-2")] == ["her sister?", "an answer"]
  assert agent.stats["updates"] == 2


def test_unknown_users_and_unfit_rerankers_are_refused(bank):
  agent = Agent(bank, HashEncoder(), SETTINGS, llm=ScriptedLLM([_cite(1)]))
  with pytest.raises(ValueError, match="user 'alcie' is not in"):
    agent.respond("alcie", "the cat?")
  assert bank.users() == ["alice", "bob"]
  spec = core.CoreSpec(model=EMBEDDING, dim=HashEncoder.dim, k=SETTINGS.k, m=SETTINGS.m, batch=4,
                       rank_prior=True)
  state = core.init_state(spec, core.HParams.create())
  record = {"units": "turn", "retriever": "bm25", "encoder": HashEncoder.identity,
            "dim": HashEncoder.dim, "k": SETTINGS.k, "query_encoder": None}
  trained = LoadedReranker("turns.safetensors", state.params, spec, state.hparams, record)
  with pytest.raises(ValueError, match="units: trained with 'turn', served with 'topic'; "
                                       "retriever: trained with 'bm25', served with 'hybrid'"):
    Agent(bank, HashEncoder(), SETTINGS, reranker=trained)
  other_k = dataclasses.replace(spec, k=SETTINGS.k + 1)
  wrong_shape = LoadedReranker("k7", core.init_state(other_k, core.HParams.create()).params,
                               other_k, state.hparams, record)
  with pytest.raises(ValueError, match="scores 7 candidates"):  # cannot score, allowed or not
    Agent(bank, HashEncoder(), SETTINGS, reranker=wrong_shape, allow_mismatch=True)
  agent = Agent(bank, HashEncoder(), SETTINGS, reranker=trained, allow_mismatch=True)
  assert len(agent.mismatches) == 2 and agent.recall("alice", "cat")[0]
  fits = LoadedReranker("topics", state.params, spec, state.hparams,
                        record | {"units": "topic", "retriever": "hybrid"})
  assert Agent(bank, HashEncoder(), SETTINGS, reranker=fits).mismatches == []
  # Queries embedded by another instance of the memories' encoder are no tuned query encoder.
  assert Agent(bank, HashEncoder(), SETTINGS, reranker=fits,
               query_encoder=HashEncoder()).mismatches == []


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


def test_an_update_interrupted_before_its_checkpoint_loses_no_rewarded_answer(bank, tmp_path):
  settings = dataclasses.replace(SETTINGS, batch=2)
  whole = Agent(bank, HashEncoder(), settings, llm=ScriptedLLM([_cite(1), _cite(2)] * 4))
  _learn(whole, QUESTIONS[:4])
  first = Agent(bank, HashEncoder(), settings, llm=ScriptedLLM([_cite(1), _cite(2)] * 4),
                workdir=tmp_path / "agent")
  _learn(first, QUESTIONS[:3])
  real_update = first._update

  def interrupted(*args):  # Ctrl-C while the update (the first one compiles) is running
    raise KeyboardInterrupt

  first._update = interrupted
  with pytest.raises(KeyboardInterrupt):
    first.respond("alice", QUESTIONS[3])
  first._update = real_update
  first.close()  # what chat does on Ctrl-C: the batch must still be pending, on step 1
  again = Agent(bank, HashEncoder(), settings, llm=ScriptedLLM([]), workdir=tmp_path / "agent")
  assert again.stats["updates"] == 2 and again.pending == 0  # applied on restore
  for a, b in zip(_params(again), _params(whole)):
    np.testing.assert_array_equal(a, b)
  again.close()


def test_a_kill_after_an_updates_checkpoint_keeps_the_counters_consistent(bank, tmp_path):
  settings = dataclasses.replace(SETTINGS, batch=2)
  agent = Agent(bank, HashEncoder(), settings, llm=ScriptedLLM([_cite(1)] * 4),
                workdir=tmp_path / "agent")
  _learn(agent, QUESTIONS[:1])

  def killed(*args):  # the process dies between the update's checkpoint and the save after it
    raise SystemExit(137)

  agent.workdir.save_pending = killed
  with pytest.raises(SystemExit):
    agent.respond("alice", QUESTIONS[1])
  agent.workdir.close()
  again = Agent(bank, HashEncoder(), settings, llm=ScriptedLLM([]), workdir=tmp_path / "agent")
  # Two questions asked, one update from both: never fewer queries than the updates used (the
  # next query's sampling noise is keyed by the count, so a repeat would reuse a key).
  assert again.stats["updates"] == 1 and again.stats["queries"] == 2
  again.close()


def test_an_encrypted_banks_workdir_holds_no_vector_in_the_clear(tmp_path):
  from rmmjax.memory import generate_key
  key, encoder = generate_key(), HashEncoder()
  secret = _bank(tmp_path / "sealed.sqlite", encoder, key)
  vectors = [v for user in TOPICS for v in secret.memory_snapshot(user, encoder.identity)[2]]
  settings = dataclasses.replace(SETTINGS, batch=4)
  agent = Agent(secret, encoder, settings, llm=ScriptedLLM([_cite(1, 2)] * 6),
                workdir=tmp_path / "agent")
  _learn(agent, QUESTIONS[:6])  # one update, two answers pending
  queries = [encoder.encode([q])[0] for q in QUESTIONS[:6]]
  agent.close()
  assert agent.pending == 2
  raw = b"".join(p.read_bytes() for p in (tmp_path / "agent").rglob("*") if p.is_file())
  for vector in [*vectors, *queries]:
    assert np.asarray(vector, np.float32).tobytes()[:64] not in raw
  # The same workdir reopens with the key, and is refused without it or on a plain bank.
  again = Agent(secret, encoder, settings, llm=ScriptedLLM([]), workdir=tmp_path / "agent")
  assert again.pending == 2
  again.close()
  secret.close()
  with pytest.raises(ValueError, match="encrypted bank and this bank is not"):
    Agent(_bank(tmp_path / "other.sqlite", encoder), encoder, settings, llm=ScriptedLLM([]),
          workdir=tmp_path / "agent")


def test_what_the_agent_records_says_what_each_turn_is(bank):
  agent = Agent(bank, HashEncoder(), SETTINGS, llm=ScriptedLLM([_cite(1), "plain text"]))
  agent.respond("alice", "where does her sister live")  # no question mark: still a question
  agent.respond("alice", "what does she play?")
  session = agent.tell("alice", "Her sister moved to Porto in June")
  assert [(t.speaker, t.kind) for t in bank.turns("alice", session)] == [
      ("user", "question"), ("assistant", "answer"), ("user", "question"),
      ("assistant", "answer"), ("user", "statement")]
  # Shown counts the memories of every exchange (a plain-text reply cites none of them).
  assert agent.stats["shown"] == 6 and agent.stats["cited"] == 1 and agent.stats["malformed"] == 1


def test_a_fresh_agent_s_rank_prior_starts_where_its_settings_say(bank):
  """At a prior scale above its embeddings' score spread a fresh agent shows its retriever's
  first M candidates in order; at 0 it ranks by the embeddings' dot products alone."""
  query = "what did Alice adopt?"
  started = Agent(bank, HashEncoder(), AgentSettings(k=6, m=3, prior_scale=100.0))
  candidates = started._candidates("alice", query)[3]
  memories, _ = started.recall("alice", query)
  assert [m.summary for m in memories] == [m.summary for m in candidates[:3]]
  flat = Agent(bank, HashEncoder(), AgentSettings(k=6, m=3, prior_scale=0.0))
  q_D, mem_KxD, mask_K, candidates, _ = flat._candidates("alice", query)
  dots = np.where(mask_K, mem_KxD @ q_D, -np.inf)
  memories, scores = flat.recall("alice", query)
  np.testing.assert_allclose(scores, np.sort(dots)[::-1][:3], rtol=1e-5, atol=1e-6)
  with pytest.raises(ValueError, match="prior_scale=-1.0: expected a finite number >= 0"):
    AgentSettings(prior_scale=-1.0)
