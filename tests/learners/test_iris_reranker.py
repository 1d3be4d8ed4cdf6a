"""The RMM reranker inside IRIS: logged episodes, the reranker as IRIS's ranker, and REINFORCE
from simulated citations and from the judge's verdicts."""

from __future__ import annotations

import dataclasses
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hash_encoder import HashEncoder

from rmmjax import core
from rmmjax.learners.embedding.model import EMBEDDING, batch_scores, init_params
from rmmjax.config import apply_overrides, get_config
from rmmjax.data.locomo import load_locomo
from rmmjax.eval.retrieval import evaluate_retrieval
from rmmjax.memory.lace import LaceMem
from rmmjax.learners.iris.episodes import (FactReranker, RewardMix, collect_episodes,
                                         episodes_batch, mixed_rewards, reinforce_steps,
                                         step_episodes)
from rmmjax.retrieve.evidence import Fact, RawTurn
from rmmjax.retrieve.iris import IrisSettings, iris_retrieve
from rmmjax.retrieve.judges import HeuristicJudge, SufficiencyJudge, Verdict
from rmmjax.train.loop import train

TALK = [("S1", "9 May 2023", "Ana", "I signed up for a pottery class and it starts next week."),
        ("S1", "9 May 2023", "Ben", "My sister is a potter; she sells bowls at the market."),
        ("S1", "9 May 2023", "Ana", "I adopted a puppy named Biscuit because I wanted company."),
        ("S2", "20 June 2023", "Ben", "We drove to the coast last weekend to watch the whales."),
        ("S2", "20 June 2023", "Ana", "Biscuit chewed my new sandals at the market."),
        ("S2", "20 June 2023", "Ben", "The pottery market sells whale bowls every weekend."),
        ("S3", "2 July 2023", "Ana", "My pottery class made bowls and a small whale."),
        ("S3", "2 July 2023", "Ben", "I walked Biscuit to the coast while you were away.")]
SETTINGS = IrisSettings(max_iterations=2, base_budget=4, budget_step=2)


@dataclasses.dataclass
class Question:
  question: str
  category: str
  evidence: tuple[str, ...]


QUESTIONS = [Question("What did Ana make in her pottery class?", "single-hop", ("D0", "D6")),
             Question("Where did Ben go with Biscuit?", "multi-hop", ("D7", "D3")),
             Question("What does the market sell?", "single-hop", ("D1", "D5"))]


def _store() -> LaceMem:
  lace = LaceMem(HashEncoder())
  for n, (session, date, speaker, text) in enumerate(TALK):
    lace.add_turn(f"D{n}", session, date, speaker, text)
  return lace


def _spec(k: int, m: int = 2, batch: int = 3) -> core.CoreSpec:
  return core.CoreSpec(model=EMBEDDING, dim=HashEncoder.dim, k=k, m=m, batch=batch,
                       rank_prior=True)


@dataclasses.dataclass
class Says(SufficiencyJudge):
  """The same verdict every time."""

  verdict: Verdict

  def judge(self, question, facts, raws, *, category=None):
    return self.verdict


class TinyStore:
  """An EmbeddedStore whose every answer is written out, so IRIS's order can be worked by hand.

  Fact i comes from turn T{i // 2} and is embedded as (i, 1, -i, i / 2). The anchor searches
  return fixed rankings; any other query (a refinement) returns REFINED.
  """

  ANCHORS = {"What did Ana bake?": [3, 0, 5, 7], "Where does Ben live?": [8]}
  REFINED = [7, 1, 3, 9]
  EDGES = {5: [(2, 0.9)], 8: [(9, 0.6), (6, 0.4)]}
  QUERIES = {"What did Ana bake?": [1.0, 0.0, 0.0, 0.0],
             "Where does Ben live?": [0.0, 1.0, 0.0, 0.0]}

  def search(self, query, k):
    return [(f, 1.0) for f in self.ANCHORS.get(query, self.REFINED)[:k]]

  def fact(self, fact_id):
    return Fact(fact_id, "Ana", "said", f"fact {fact_id}", "1 May 2023", f"T{fact_id // 2}", "S1",
                f"[1 May 2023] Ana: said fact {fact_id}")

  def neighbours(self, fact_id, min_weight):
    return [(f, w) for f, w in self.EDGES.get(fact_id, []) if w >= min_weight]

  def raw(self, turn_id):
    return RawTurn(turn_id, "S1", "1 May 2023", "Ana", f"turn {turn_id}")

  def facts_about(self, entity):
    return []

  def query_vector(self, query):
    return np.asarray(self.QUERIES[query], np.float32)

  def fact_vectors(self, fact_ids):
    return np.asarray([[i, 1.0, -i, i / 2] for i in fact_ids], np.float32).reshape(-1, 4)


def test_episodes_log_iris_candidates_with_their_evidence_labels():
  bake = Question("What did Ana bake?", "single-hop", ("T1", "T3", "T1"))
  live = Question("Where does Ben live?", "single-hop", ("T4", "T0", "T2"))
  judges = {bake.question: Says(Verdict("PARTIAL", 0.5, "")),  # runs both iterations
            live.question: Says(Verdict("EXACT", 1.0, ""))}  # stops after the first
  settings = IrisSettings(max_iterations=2, base_budget=3, budget_step=1)
  episodes = collect_episodes(TinyStore(), [bake, live], lambda q: judges[q.question], settings,
                              5, 3)
  # "bake", worked by hand. Iteration 1 (budget 3): anchor 3, 0, 5, and 2 along 5's edge.
  # Iteration 2 (budget 4): anchor 3, 0, 5, 7 and refinement 7, 1, 3, 9. The final order fuses
  # the two searches (1 / (61 + rank) per list): 3 (1/61 + 1/63) > 7 (1/64 + 1/61) > 0 = 1
  # (1/62 each, 0 entered first) > 5 (1/63) > 9 (1/64) > 2 (edges only). The first 5 are logged.
  # "live": anchor 8; edge 8 -> 9 at 0.6 kept, 8 -> 6 at 0.4 below the 0.5 threshold.
  assert [[f.fact_id for f in e.facts] for e in episodes] == [[3, 7, 0, 1, 5], [8, 9]]
  assert [e.num_evidence for e in episodes] == [2, 3]  # T1 listed twice counts once
  assert sorted(episodes[0].raws) == ["T0", "T1", "T2", "T3"]
  np.testing.assert_array_equal(episodes[0].q_D, [1, 0, 0, 0])
  np.testing.assert_array_equal(episodes[1].q_D, [0, 1, 0, 0])
  np.testing.assert_array_equal(episodes[0].mem_KxD, [[3, 1, -3, 1.5], [7, 1, -7, 3.5],
                                                      [0, 1, 0, 0], [1, 1, -1, 0.5],
                                                      [5, 1, -5, 2.5]])
  np.testing.assert_array_equal(episodes[1].mem_KxD, [[8, 1, -8, 4], [9, 1, -9, 4.5],
                                                      [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
  # Turns T1, T3, T0, T0, T2 against evidence (T1, T3); T4, T4 against (T4, T0, T2).
  np.testing.assert_array_equal(episodes[0].evidence_KxE, [[1, 0, 0], [0, 1, 0], [0, 0, 0],
                                                           [0, 0, 0], [0, 0, 0]])
  np.testing.assert_array_equal(episodes[1].evidence_KxE, [[1, 0, 0], [1, 0, 0], [0, 0, 0],
                                                           [0, 0, 0], [0, 0, 0]])
  batch = episodes_batch(episodes)
  np.testing.assert_array_equal(batch.mask_BxK, [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(batch.relevant_BxK, [[1, 1, 0, 0, 0], [1, 1, 0, 0, 0]])
  # Top 2 by hand: "bake" finds T1 and T3 (2 of 2), "live" T4 only (1 of 3).
  top = jnp.arange(2)[None, :].repeat(len(episodes), 0)
  np.testing.assert_allclose(core.step.recall_per_query(top, batch), [1.0, 1 / 3], rtol=1e-6)
  with pytest.raises(ValueError, match="max_evidence=1"):
    collect_episodes(TinyStore(), [bake], lambda q: judges[q.question], settings, 5, 1)


def test_fact_reranker_scores_the_head_and_keeps_the_tail_after_it():
  store, spec = _store(), _spec(k=4)
  facts = store.facts[:7]
  params = init_params(jax.random.PRNGKey(0), spec)  # the identity: dot products
  scores = FactReranker(params, spec, store, mode="alone")("pottery bowls", facts)
  dots = store.fact_vectors([f.fact_id for f in facts[:4]]) @ store.query_vector("pottery bowls")
  np.testing.assert_allclose(scores[:4], dots, rtol=1e-5, atol=1e-6)
  assert max(scores[4:]) < min(scores[:4]) and scores[4] > scores[5] > scores[6]
  # Fused: reciprocal-rank fusion of the reranker's order and the order given.
  fused = FactReranker(params, spec, store, mode="fused")("pottery bowls", facts)
  by_dot = sorted(range(4), key=lambda i: -dots[i])
  want = [1 / (61 + by_dot.index(i)) + 1 / (61 + i) for i in range(4)]
  np.testing.assert_allclose(fused[:4], want, rtol=1e-9)
  assert max(fused[4:]) < min(fused[:4]) and fused[4] > fused[5] > fused[6]


def test_a_rank_prior_reranker_reorders_iris_evidence():
  store, spec = _store(), _spec(k=5)
  params = init_params(jax.random.PRNGKey(0), spec)
  params["rank_bias"] = 100.0 * jnp.arange(5, dtype=jnp.float32)  # reverses the given order
  question = QUESTIONS[0].question
  plain = iris_retrieve(store, question, judge=HeuristicJudge(), settings=SETTINGS)
  reranked = iris_retrieve(store, question, judge=HeuristicJudge(), settings=SETTINGS,
                           reranker=FactReranker(params, spec, store, mode="alone"))
  assert reranked.fact_ids[:5] == plain.fact_ids[:5][::-1]
  assert reranked.fact_ids[5:] == plain.fact_ids[5:]


def test_mixed_rewards_add_the_weighted_citation_and_verdict_rewards():
  rng = np.random.default_rng(0)
  cited = rng.random((5, 3)) < 0.5
  selected = rng.integers(-1, 6, (5, 3))
  verdict = rng.uniform(-1, 1, 5).astype(np.float32)
  mix = RewardMix(citation=0.5, verdict=2.0)
  got = np.asarray(mixed_rewards(jnp.asarray(cited), jnp.asarray(selected), jnp.asarray(verdict),
                                 mix))
  for b in range(5):
    for m in range(3):
      want = 0.0 if selected[b, m] < 0 else 0.5 * (1 if cited[b, m] else -1) + 2.0 * verdict[b]
      assert got[b, m] == pytest.approx(want, abs=1e-6)


class WantsFact(SufficiencyJudge):
  """EXACT when one fact is shown, else PARTIAL at 0: a verdict that knows no evidence label."""

  def __init__(self, fact_id: int):
    self.fact_id, self.calls = fact_id, 0

  def judge(self, question, facts, raws, *, category=None):
    self.calls += 1
    if any(f.fact_id == self.fact_id for f in facts):
      return Verdict("EXACT", 1.0, "")
    return Verdict("PARTIAL", 0.0, "the fact")


def _top1(state, episodes) -> np.ndarray:
  batch = episodes_batch(episodes)
  scores = batch_scores(state.params, batch.q_BxD, batch.mem_BxKxD, state.spec)
  return np.asarray(jnp.argmax(jnp.where(batch.mask_BxK, scores, -jnp.inf), -1))


def test_verdicts_alone_teach_the_reranker_what_the_judge_wants():
  store, spec = _store(), _spec(k=6, m=1)
  unlabelled = [dataclasses.replace(q, evidence=()) for q in QUESTIONS]
  episodes = collect_episodes(store, unlabelled, lambda q: HeuristicJudge(), SETTINGS, 6, 2)
  assert not any(e.evidence_KxE.any() for e in episodes)
  # The judge wants each question's last candidate, which the untrained reranker never tops.
  wanted = {e.question: len(e.facts) - 1 for e in episodes}
  judges = {e.question: WantsFact(e.facts[-1].fact_id) for e in episodes}
  state = core.init_state(spec, core.HParams.create(lr=3e-2, tau=0.5, baseline_kind="batch"))
  assert all(t != wanted[e.question] for t, e in zip(_top1(state, episodes), episodes))
  state, logs = reinforce_steps(state, episodes * 4, lambda e: judges[e.question],
                                RewardMix(citation=0.0, verdict=1.0),
                                10 * (len(episodes) * 4 // state.spec.batch))  # 10 passes
  assert all(t == wanted[e.question] for t, e in zip(_top1(state, episodes), episodes))
  assert logs["verdict_reward"][-10:].mean() > logs["verdict_reward"][:10].mean()
  assert sum(j.calls for j in judges.values()) == 10 * 4 * len(episodes)


def test_citations_alone_need_no_judge_and_select_evidence_facts():
  store, spec = _store(), _spec(k=6, m=2)
  episodes = collect_episodes(store, QUESTIONS, lambda q: HeuristicJudge(), SETTINGS, 6, 2)
  state = core.init_state(spec, core.HParams.create(lr=3e-2, tau=0.5, baseline_kind="batch",
                                                     p_rel=1.0, p_irr=0.0))
  batch = episodes_batch(episodes)
  relevant = np.asarray(batch.relevant_BxK)
  # A citation rewards any fact from an evidence turn, so the best top 2 is as many of those
  # as the candidates hold.
  best = np.minimum(relevant.sum(-1), 2).sum()

  def relevant_in_top2(state):
    scores = batch_scores(state.params, batch.q_BxD, batch.mem_BxKxD, spec)
    top = np.asarray(jax.vmap(core.top_m, in_axes=(0, None, 0))(scores, 2, batch.mask_BxK))
    return int(np.take_along_axis(relevant, top, -1).sum())

  before = relevant_in_top2(state)
  state, logs = reinforce_steps(state, episodes * 4, lambda e: pytest.fail("judged"),
                                RewardMix(citation=1.0, verdict=0.0),
                                20 * (len(episodes) * 4 // state.spec.batch))  # 20 passes
  assert before < best and relevant_in_top2(state) == best
  assert not logs["verdict_reward"].any()


def test_steps_replay_the_same_batches_when_split_and_each_pass_sees_each_episode_once():
  store, spec = _store(), _spec(k=6, m=2, batch=2)
  episodes = collect_episodes(store, QUESTIONS * 3, lambda q: HeuristicJudge(), SETTINGS, 6, 2)
  per_pass = len(episodes) // 2
  seen = [id(e) for t in range(per_pass) for e in step_episodes(episodes, 2, 7, t)]
  assert len(seen) == len(set(seen)) == per_pass * 2
  assert step_episodes(episodes, 2, 7, per_pass) != step_episodes(episodes, 2, 7, 0)
  state = core.init_state(spec, core.HParams.create(lr=1e-2, tau=0.5, seed=7))
  mix = RewardMix(citation=1.0, verdict=1.0)
  whole, logs = reinforce_steps(state, episodes, lambda e: HeuristicJudge(), mix, 6)
  half, _ = reinforce_steps(state, episodes, lambda e: HeuristicJudge(), mix, 3)
  split, _ = reinforce_steps(half, episodes, lambda e: HeuristicJudge(), mix, 3)
  assert int(split.step) == int(whole.step) == 6 and len(logs["reward"]) == 6
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(split.params)):
    np.testing.assert_array_equal(a, b)


def _first_conversations(source, tmp_path, n):
  path = tmp_path / f"locomo_first{n}.json"
  path.write_text(json.dumps(json.loads(source.read_text())[:n]))
  return path


def test_train_a_reranker_on_iris_evidence_then_evaluate_it_inside_iris(three, tmp_path, capsys):
  data = _first_conversations(three, tmp_path, 3)
  cfg = apply_overrides(get_config("locomo"), [
      "learner=linear", "units=lace", f"data={data}", "dim=32", "k=24", "steps=20",
      "checkpoint_every=10", "holdout=1", "pretrain_epochs=2", "verdict_reward=1.0"]).validate()
  wd = tmp_path / "run"
  summary = train(cfg, wd, progress=False, encoder=HashEncoder())
  assert summary["heldout_conversations"] == ["syn-3"]
  assert summary["pretrain_loss_last"] < summary["pretrain_loss_first"]
  rows = [json.loads(line) for line in (wd / "metrics.jsonl").read_text().splitlines()]
  assert len(rows) == 2
  # With citation and verdict weights 1, a selected fact earns +-1 plus its query's verdict
  # reward, and every query selects M facts, so each step's mean reward is
  # (2 * citation rate - 1) + mean verdict reward; a verdict reward dropped from the reward, or
  # weighted otherwise, breaks it.
  for r in rows:
    assert r["verdict_reward"] != 0.0
    assert r["reward"] == pytest.approx(2 * r["citation_rate"] - 1 + r["verdict_reward"],
                                        abs=1e-5)
  # The summary's held-out Recall@M (the reranker fused with IRIS's order), recomputed through
  # FactReranker over freshly logged episodes of the held-out conversation.
  from rmmjax.learners.loading import load_reranker
  loaded = load_reranker(wd)
  conv = next(c for c in load_locomo(data)[0] if c.conversation_id == "syn-3")
  store = LaceMem.from_conversation(conv, HashEncoder())
  # The held-out Recall@M of IRIS's own order and of all K = 24 candidates, counted from
  # plain IRIS runs: the turns of the first M = 5 and 24 facts against the evidence turns.
  runs = [iris_retrieve(store, q.question, category=q.category, judge=HeuristicJudge())
          for q in conv.questions]
  for key, depth in (("recall_at_m_base", 5), ("recall_at_k", 24)):
    found = [len({f.turn_id for f in run.facts[:depth]} & set(q.evidence)) / len(set(q.evidence))
             for run, q in zip(runs, conv.questions)]
    assert summary[key] == pytest.approx(np.mean(found), abs=1e-6), key
  episodes = collect_episodes(store, conv.questions, lambda q: HeuristicJudge(),
                              IrisSettings(), 24, 50)
  for mode, key in (("fused", "recall_at_m_final"), ("alone", "recall_at_m_alone")):
    ranker, found = FactReranker(loaded.params, loaded.spec, store, mode), []
    for e, q in zip(episodes, conv.questions):
      scores = ranker(q.question, list(e.facts))
      top = sorted(range(len(e.facts)), key=lambda i: -scores[i])[:5]
      turns = {e.facts[i].turn_id for i in top}
      found.append(len(turns & set(q.evidence)) / len(set(q.evidence)))
    assert summary[key] == pytest.approx(np.mean(found), abs=1e-6), mode
  record = json.loads((wd / "record.json").read_text())
  assert (record["units"], record["iris"], record["verdict_reward"]) == ("lace", "default", 1.0)

  def evaluate(**kw):
    return evaluate_retrieval("locomo", data, "lace", "hybrid", (5, 10), encoder=HashEncoder(),
                              **kw)

  plain, reranked = evaluate(iris=True), evaluate(iris=True, reranker=wd, rerank_mode="alone")
  assert reranked["config"]["conversations"] == ["syn-3"]
  assert reranked["config"]["reranker_record"]["iris"] == "default"
  # The same held-out conversation by hand: IRIS with the trained reranker inside.
  ranker = FactReranker(loaded.params, loaded.spec, store, mode="alone")
  found = []
  for q in conv.questions:
    turns = iris_retrieve(store, q.question, category=q.category, judge=HeuristicJudge(),
                          reranker=ranker).turn_ids[:5]
    found.append(len(set(turns) & set(q.evidence)) / len(set(q.evidence)))
  assert reranked["metrics"]["overall"]["recall_all@5"] == pytest.approx(np.mean(found))
  assert reranked["metrics"]["overall"] != plain["metrics"]["overall"]
  assert reranked["config"]["rerank_mode"] == "alone"
  assert evaluate(iris=True, reranker=wd)["config"]["rerank_mode"] == "fused"
  with pytest.raises(ValueError, match="iris: trained with 'default', evaluated with 'wide'"):
    evaluate(iris="wide", reranker=wd)
  from rmmjax.cli import main
  assert main(["eval", "--data", str(data), "--units", "lace", "--reranker", str(wd)]) == 2
  assert "pass --iris" in capsys.readouterr().err
  with pytest.raises(ValueError, match="units: trained with 'lace'"):
    evaluate_retrieval("locomo", data, "turn", "hybrid", (5,), encoder=HashEncoder(),
                       reranker=wd)
  assert (reranked["config"]["reranker_step"], reranked["config"]["reranker_steps_planned"]) == (
      20, 20)
  # Resuming with more steps continues from the last checkpoint.
  more = train(apply_overrides(cfg, ["steps=30"]), wd, progress=False, encoder=HashEncoder())
  assert more["steps"] == 30
  assert len((wd / "metrics.jsonl").read_text().splitlines()) == 3
  # A workdir whose run stopped early is evaluated at the step it reached, and says so.
  partial = tmp_path / "partial"
  shutil.copytree(wd, partial)
  shutil.rmtree(partial / "checkpoints" / "30")
  config = evaluate(iris=True, reranker=partial)["config"]
  assert (config["reranker_step"], config["reranker_steps_planned"]) == (20, 30)


def test_lace_training_settings_are_checked(three):
  base = get_config("locomo")
  for changes, message in (
      (["units=lace", "learner=query_encoder"], "set learner to a reranker family"),
      (["units=lace", "learner=linear", "iris_evidence.preset=narrow"], "iris_evidence.preset='narrow' is not one of"),
      (["units=lace", "learner=linear", "citation_reward=0", "verdict_reward=0"],
       "not both 0"),
      # Keys of the section of a reranker over IRIS's evidence are unknown to other runs.
      (["units=turn", "learner=linear", "verdict_reward=0.5"], "belongs to the iris_evidence"),
      (["units=turn", "learner=linear", "iris_evidence.preset=wide"], "no iris_evidence"),
      (["units=lace", "learner=linear", "iris=wide"], "unknown config key 'iris'")):
    with pytest.raises(ValueError, match=message):
      apply_overrides(base, [f"data={three}", *changes]).validate()
  # The latent simulator refuses the replay's keys instead of storing values it never uses.
  with pytest.raises(ValueError, match="the latent simulator does not use them"):
    apply_overrides(get_config("latent"), ["units=lace"]).validate()


@pytest.mark.parametrize("flags, message", [
    (["--units", "lace", "--judge", "oracle"], "--judge oracle is IRIS's sufficiency judge"),
    (["--units", "lace", "--iris", "--rerank-mode", "alone"], "--rerank-mode alone orders"),
    (["--units", "turn", "--rerank-mode", "fused"], "--rerank-mode fused orders"),
])
def test_eval_refuses_flags_that_would_change_nothing(three, capsys, flags, message):
  from rmmjax.cli import main
  assert main(["eval", "--data", str(three), "--quiet", *flags]) == 2
  assert message in capsys.readouterr().err
