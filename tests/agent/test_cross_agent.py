"""The agent with a cross reranker: it scores each bank memory by the text a topic unit holds
(what a reranker trained on topic units read), as the training path builds it from the same
conversation; learns from the LLM's citations, keeps the pending answers' pair tokens in its
workdir, refuses an encoder other than the one the reranker trained beside, and says which units
a bank holds to a reranker trained on others."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hash_encoder import HashEncoder
from rmmjax import core
from rmmjax.learners.cross import CrossModel, cross_scores, init_cross_params
from rmmjax.agent import Agent, AgentSettings
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.bert import load_pooler
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.encode.protocol import tokenizer_identity
from rmmjax.learners.loaded import LoadedReranker
from scripted_llm import ScriptedLLM
from rmmjax.memory import MemoryBank, NewMemory
from rmmjax.memory.ingest import ingest_conversations
from rmmjax.memory.topics import OfflineReflector
from rmmjax.memory.topic_units import conversation_units
from rmmjax.learners.cross.pairs import pair_tokens

FACTS = ["Alice adopted a grey cat named Pixel in May", "Alice runs marathons in the spring",
         "Alice works as a nurse at the city hospital", "Alice plays the cello on Sundays",
         "Alice's sister lives in Lisbon"]
SETTINGS = AgentSettings(retriever="hybrid", k=5, m=2, batch=2, lr=1e-3)
LENGTH = 48


@pytest.fixture(scope="module")
def encoder(tiny_encoder):  # a tiny BERT: the agent's logic is the point
  return SentenceEncoder()


@pytest.fixture
def bank(tmp_path, encoder):
  with MemoryBank(tmp_path / "bank.sqlite") as bank:
    bank.add_user("alice")
    bank.start_session("alice", "s1", "2023-05-08")
    bank.add_turns("alice", "s1", [(f"t{i}", "alice", f) for i, f in enumerate(FACTS)])
    bank.apply_reflection("alice", "s1", [NewMemory(f, [f"t{i}"], encoder.encode([f])[0])
                                          for i, f in enumerate(FACTS)], [], encoder.identity)
    yield bank


def _reranker(encoder, record=None, k=SETTINGS.k):
  weights = dict(encoder.params) | {"pooler": load_pooler(encoder.model_dir)}
  params = init_cross_params(weights, k, 1.0)
  params["encoder"]["classifier"]["kernel"] = jnp.asarray(
      np.random.default_rng(0).normal(0, 0.2, (encoder.dim, 1)), jnp.float32)
  spec = core.CoreSpec(variant="cross", dim=encoder.dim, k=k, m=2, batch=2,
                       model=CrossModel(encoder.cfg))
  record = {"units": "topic", "retriever": "hybrid", "encoder": encoder.identity,
            "dim": encoder.dim, "k": k, "query_encoder": None,
            "cross": {"tokenizer": tokenizer_identity(encoder), "max_length": LENGTH}} | (
                record or {})
  return LoadedReranker("cross-run", params, spec, core.HParams.create(), record)


def test_the_agent_scores_a_bank_as_training_read_its_topic_units(three, tmp_path, encoder):
  # One conversation through both paths: `ingest` into a bank (what the agent serves), and the
  # topic units training and eval build from the same file (replayed through a fresh bank).
  conv = load_locomo(three)[0][0]
  units = conversation_units(conv, "topic", encoder)
  with MemoryBank(tmp_path / "ingested.sqlite") as bank:
    ingest_conversations(bank, [conv], OfflineReflector(encoder), encoder, user="u")
    settings = dataclasses.replace(SETTINGS, k=min(5, len(units)))
    # Pairs as long as BERT reads, so that every word of a memory's text counts.
    loaded = _reranker(encoder, {"cross": {"tokenizer": tokenizer_identity(encoder),
                                           "max_length": 512}}, k=settings.k)
    agent = Agent(bank, encoder, settings, reranker=loaded)
    query = conv.questions[0].question
    shown, scores = agent.recall("u", query)
    _, _, _, candidates, _ = agent._candidates("u", query)
  # The training path's text of each candidate: the unit covering the same turns.
  text_of = {frozenset(u.turn_ids): u.text for u in units}
  texts = [text_of[frozenset(s.turn_id for s in m.snippets)] for m in candidates]
  pairs = pair_tokens(encoder.tokenizer, [query], [texts], 512, length=512)
  want = np.asarray(cross_scores(loaded.params, pairs.packed(),
                                      encoder.cfg))[0]
  order = np.argsort(-want, kind="stable")[:settings.m]
  assert [m.id for m in shown] == [candidates[i].id for i in order]
  np.testing.assert_allclose(scores, want[order], rtol=1e-5, atol=1e-5)


def test_a_reranker_trained_on_turns_is_told_what_a_bank_holds(bank, encoder):
  with pytest.raises(ValueError, match="units=topic"):
    Agent(bank, encoder, SETTINGS, reranker=_reranker(encoder, {"units": "turn"}))
  agent = Agent(bank, encoder, SETTINGS, reranker=_reranker(encoder, {"units": "turn"}),
                allow_mismatch=True)
  assert any("units" in m for m in agent.mismatches)


def test_citations_update_the_cross_reranker_and_pending_tokens_persist(bank, encoder,
                                                                        tmp_path):
  loaded = _reranker(encoder)
  cite = json.dumps({"answer": "Pixel", "citations": [1, 2]})  # a set reward of +1
  agent = Agent(bank, encoder, SETTINGS, llm=ScriptedLLM([cite] * 3), reranker=loaded,
                workdir=tmp_path / "w")
  before = np.asarray(agent.state.params["encoder"]["classifier"]["kernel"])
  assert [agent.respond("alice", "the cat?").updated for _ in range(3)] == [False, True, False]
  after = np.asarray(agent.state.params["encoder"]["classifier"]["kernel"])
  assert np.abs(after - before).max() > 0
  agent.close()
  again = Agent(bank, encoder, SETTINGS, llm=ScriptedLLM([cite]), reranker=loaded,
                workdir=tmp_path / "w")
  assert again.stats["updates"] == 1 and again.pending == 1
  assert again._pending[0][5].shape == (SETTINGS.k, LENGTH)  # the pair tokens came back
  assert again.respond("alice", "the cat?").updated  # the pending one completes a batch
  leaves = jax.tree.leaves(again.state.params)
  assert all(np.isfinite(np.asarray(x)).all() for x in leaves)
  again.close()


def test_another_encoder_or_tokenizer_is_refused_naming_both(bank, encoder):
  with pytest.raises(ValueError, match="this one is"):
    Agent(bank, encoder, SETTINGS, reranker=_reranker(encoder, {"encoder": "other/model:0123"}))
  other = _reranker(encoder)
  other = dataclasses.replace(other, record=other.record | {
      "cross": {"tokenizer": "f" * 64, "max_length": LENGTH}})
  with pytest.raises(ValueError, match="ffffffffffff"):
    Agent(bank, encoder, SETTINGS, reranker=other)
  with pytest.raises(ValueError, match="HashEncoder has none"):
    Agent(bank, HashEncoder(), SETTINGS, reranker=_reranker(encoder))
