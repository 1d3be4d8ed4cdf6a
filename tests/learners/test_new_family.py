"""A reranker family defined here, in the test, and added as one registry line: the library
trains it (pretraining and online REINFORCE), evaluates it on held-out conversations and serves
it in the agent, with no other change. The family: a learnt weight per embedding dimension,
s_k = sum_d q_d w_d m_kd, plus a learnt bias per base position."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cli_args import sets as sets_of
from hash_encoder import HashEncoder
from safetensors.numpy import load_file, save_file
from rmmjax import core
from rmmjax.agent import Agent, AgentSettings
from rmmjax.cli import main
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.eval.reranked import reranked_orders
from rmmjax.learners.loaded import LoadedReranker
from rmmjax.learners.loading import load_reranker
from rmmjax.learners.embedding.reader import EmbeddingReader
from rmmjax.learners.embedding.task import ReplayTask
from rmmjax.learners.registry import LEARNERS, Learner
from rmmjax.memory import MemoryBank, NewMemory
from rmmjax.replay.candidates import build_replay, to_questions, to_sequence
from rmmjax.replay.protocols import Protocol, train_reranker

K, M, DIM = 20, 5, HashEncoder.dim


@dataclasses.dataclass(frozen=True)
class DiagonalModel(core.Model):
  """The family's scorer as the core sees it (CoreSpec.model)."""

  def scores(self, params, batch, spec):
    del spec
    return (jnp.einsum("bd,d,bkd->bk", batch.q_BxD, params["w"], batch.mem_BxKxD)
            + params["rank_bias"][None, :])


def _init():
  return {"w": jnp.ones((DIM,), jnp.float32), "rank_bias": jnp.zeros((K,), jnp.float32)}


@pytest.fixture
def diagonal_family(monkeypatch):
  # The one line a new family adds to the registry.
  monkeypatch.setitem(LEARNERS, "diagonal", Learner("diagonal", ReplayTask, EmbeddingReader.for_reranker))
  return core.CoreSpec(variant="diagonal", dim=DIM, k=K, m=M, batch=4, model=DiagonalModel())


def _recall(replays, orders):
  """Mean Recall@M of evidence turns over every question of the replays, ranked by `orders`
  (unit indices, as eval ranks them)."""
  recalls = []
  for conv, order in zip(replays, orders):
    for evidence, row in zip(conv.evidence, order):
      covered = {t for u in row[:M] if u >= 0 for t in conv.unit_turns[u]}
      recalls.append(len(covered & set(evidence)) / len(evidence))
  return float(np.mean(recalls))


def test_a_family_defined_in_a_test_trains_evaluates_and_serves(three, tmp_path,
                                                                 diagonal_family):
  spec = diagonal_family
  conversations, _ = load_locomo(three)
  replays = build_replay(conversations, "turn", "bm25", HashEncoder(), k=K)
  train, held_out = replays[:2], replays[2:]
  hp = core.HParams.create(lr=3e-2, tau=0.5)
  state, logs = jax.jit(train_reranker, static_argnums=(0, 5, 6))(
      spec, hp, hp, to_questions(train), to_sequence(train, spec.batch),
      Protocol(pretrain_epochs=5, online_epochs=1), 8, params=_init())
  assert np.all(np.isfinite(np.asarray(logs["pretrain_loss"])))
  assert not np.allclose(np.asarray(state.params["w"]), 1.0)  # it learnt

  record = {"units": "turn", "retriever": "bm25", "encoder": HashEncoder.identity, "dim": DIM,
            "k": K, "query_encoder": None}
  trained = LoadedReranker("diagonal", jax.device_get(state.params), spec, hp, record)
  fresh = LoadedReranker("fresh", _init(), spec, hp, record)
  # Evaluated as every reranker is: the fresh model orders by the plain dot product (computed
  # here in NumPy), and training on these conversations' labels lifts their recall.
  fresh_orders = reranked_orders(train, fresh, False, HashEncoder())
  for conv, order in zip(train, fresh_orders):
    dots = np.where(conv.mask_NxK, np.einsum("nd,nkd->nk", conv.q_NxD, conv.mem_NxKxD), -np.inf)
    for row, base_row, dots_K in zip(order, conv.order_NxR, dots):
      column = {int(u): j for j, u in enumerate(base_row[:K])}
      ranked = dots_K[[column[int(u)] for u in row[:K]]]
      assert sorted(column) == sorted(int(u) for u in row[:K])  # the same K candidates
      assert np.all(np.diff(ranked[np.isfinite(ranked)]) <= 1e-5)  # by descending dot product
  before = _recall(train, fresh_orders)
  after = _recall(train, reranked_orders(train, trained, False, HashEncoder()))
  assert after > before + 0.05, (before, after)
  orders = reranked_orders(held_out, trained, False, HashEncoder())
  assert [o.shape for o in orders] == [conv.order_NxR.shape for conv in held_out]

  # Served by the agent: its scores are the family's own formula over the bank's candidates.
  encoder = HashEncoder()
  bank = MemoryBank(tmp_path / "bank.sqlite")
  bank.add_user("ann")
  bank.start_session("ann", "s1", "2023-05-08")
  texts = [f"Ann mentioned topic number {i} about {word}" for i, word in
           enumerate(["cats", "bikes", "tea", "rain", "maps", "jazz"] * 4)]
  bank.add_turns("ann", "s1", [(f"t{i}", "ann", t) for i, t in enumerate(texts)])
  bank.apply_reflection("ann", "s1", [NewMemory(t, [f"t{i}"], encoder.encode([t])[0])
                                      for i, t in enumerate(texts)], [], encoder.identity)
  served = LoadedReranker("diagonal", trained.params, spec, hp,
                          record | {"units": "topic", "retriever": "hybrid"})
  agent = Agent(bank, encoder, AgentSettings(k=K, m=M, learn=False), reranker=served)
  memories, scores = agent.recall("ann", "which tea did Ann like")
  assert len(memories) == M
  got = {m.summary: s for m, s in zip(memories, scores)}
  q = encoder.encode(["which tea did Ann like"])[0]
  w = np.asarray(trained.params["w"])
  for summary, score in got.items():
    text_emb = encoder.encode([summary])[0]
    # Within the rank prior's spread: the prior depends on the candidate's base position.
    prior = np.asarray(trained.params["rank_bias"])
    assert any(abs(score - (float(q @ (w * text_emb)) + p)) < 1e-4 for p in prior), summary


class DiagonalTask(ReplayTask):
  """The family's training: the shared replay task with its model and first parameters."""

  model = DiagonalModel()

  @classmethod
  def init_params(cls, spec):
    return {"w": jnp.ones((spec.dim,), jnp.float32),
            "rank_bias": jnp.zeros((spec.k,), jnp.float32)}


def _export_diagonal(workdir, out):
  """The family's export: its weights as safetensors (what a serving system would read)."""
  reranker = load_reranker(workdir)
  save_file({k: np.asarray(v) for k, v in reranker.params.items()}, str(out))
  return f"wrote {out}"


@pytest.mark.usefixtures("tiny_encoder")
def test_a_family_defined_in_a_test_trains_evaluates_exports_and_serves_from_the_command_line(
    three, tmp_path, monkeypatch):
  # The family's folder is this file; its one registry line:
  monkeypatch.setitem(LEARNERS, "diagonal", Learner("diagonal", DiagonalTask,
                                                    EmbeddingReader.for_reranker,
                                                    export=_export_diagonal))
  wd = tmp_path / "diagonal"
  sets = sets_of(f"data={three}", "holdout=1", "dim=32", "learner=diagonal",
                 "retriever=bm25",
                 "k=5", "steps=8", "log_every=4", "checkpoint_every=8",
                 "reranker.pretrain_epochs=2", "reranker.pretrain_lr=0.03")
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet", *sets]) == 0
  trained = load_reranker(wd)
  assert trained.spec.model == DiagonalModel()
  assert set(trained.params) == {"w", "rank_bias"}
  assert not np.allclose(trained.params["w"], 1.0)  # it learnt, in its own parameters

  report = tmp_path / "eval.json"
  assert main(["eval", "--data", str(three), "--quiet", "--units", "turn", "--retriever", "bm25",
               "--k", "2,5", "--reranker", str(wd), "--out", str(report)]) == 0
  metrics = json.loads(report.read_text())["metrics"]["overall"]
  assert 0.0 <= metrics["recall_all@5"] <= 1.0

  out = tmp_path / "diagonal.safetensors"
  assert main(["export", "--workdir", str(wd), "--out", str(out)]) == 0
  exported = load_file(str(out))
  np.testing.assert_allclose(exported["w"], trained.params["w"])

  # Served by the agent as loaded from the workdir: its scores are the family's formula.
  encoder = SentenceEncoder(cache=None)
  bank = MemoryBank(tmp_path / "bank.sqlite")
  bank.add_user("ann")
  bank.start_session("ann", "s1", "2023-05-08")
  texts = [f"Ann mentioned {word}" for word in ("cats", "bikes", "tea", "rain", "maps", "jazz")]
  bank.add_turns("ann", "s1", [(f"t{i}", "ann", t) for i, t in enumerate(texts)])
  bank.apply_reflection("ann", "s1", [NewMemory(t, [f"t{i}"], encoder.encode([t])[0])
                                      for i, t in enumerate(texts)], [], encoder.identity)
  served = dataclasses.replace(trained, record=trained.record | {"units": "topic",
                                                                 "retriever": "hybrid"})
  agent = Agent(bank, encoder, AgentSettings(k=5, m=2, learn=False), reranker=served)
  memories, scores = agent.recall("ann", "which tea did Ann like")
  q, w = encoder.encode(["which tea did Ann like"])[0], np.asarray(trained.params["w"])
  for memory, score in zip(memories, scores):
    formula = float(q @ (w * encoder.encode([memory.summary])[0]))
    assert any(abs(score - (formula + p)) < 1e-4 for p in trained.params["rank_bias"])
