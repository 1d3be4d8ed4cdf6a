"""IRIS's learned parts against independent computations: the grouped listwise loss, the
sufficiency judge, verdicts from probabilities, search by vector, and IRIS with a vector refiner."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import final

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hash_encoder import HashEncoder

from rmmjax import core
from rmmjax.core import judge
from rmmjax.core.losses import grouped_listwise_loss
from rmmjax.memory.lace import LaceMem, LaceSettings
from rmmjax.learners.iris.fit import JudgeExamples, fit_judge
from rmmjax.retrieve.evidence import Fact, RawTurn
from rmmjax.retrieve.iris import IRIS_PRESETS, iris_retrieve
from rmmjax.retrieve.judges import OracleJudge, SufficiencyJudge, Verdict
from rmmjax.retrieve.learned import EXACT_AT, verdict_of
from rmmjax.retrieve.refine import RefineRequest, VectorRefiner

# -- the grouped listwise loss ---------------------------------------------------------------


def _naive_grouped(scores, covers, mask, tau):
  """The loss by its definition, one query and one evidence item at a time, in float64."""
  scores, total, pairs = np.asarray(scores, np.float64), 0.0, 0
  for b in range(scores.shape[0]):
    valid = [k for k in range(scores.shape[1]) if mask[b, k]]
    if not valid:
      continue
    z = scores[b, valid] / tau
    p = dict(zip(valid, np.exp(z - z.max()) / np.exp(z - z.max()).sum()))
    for e in range(covers.shape[2]):
      covering = [k for k in valid if covers[b, k, e]]
      if covering:
        total -= np.log(sum(p[k] for k in covering))
        pairs += 1
  return total / pairs if pairs else 0.0


def _grouped_case(seed: int, b: int = 3, k: int = 5, e: int = 3):
  rng = np.random.default_rng(seed)
  scores = rng.normal(size=(b, k)).astype(np.float32)
  covers = rng.random((b, k, e)) < 0.35
  mask = rng.random((b, k)) < 0.75
  mask[:, 0] = True
  covers[-1] = False  # a query covering nothing
  covers[0, 0, 0] = True  # and one pair that surely counts
  mask[1, -1], covers[1, :, -1], covers[1, -1, -1] = False, False, True  # masked cover only
  return scores, covers, mask


@pytest.mark.parametrize("seed,tau", [(0, 1.0), (1, 0.5), (2, 2.0), (3, 0.1)])
def test_grouped_listwise_loss_matches_the_naive_definition(seed, tau):
  scores, covers, mask = _grouped_case(seed)
  got = grouped_listwise_loss(jnp.asarray(scores), jnp.asarray(covers), jnp.asarray(mask), tau)
  assert float(got) == pytest.approx(_naive_grouped(scores, covers, mask, tau), rel=1e-5)


def test_grouped_listwise_loss_ignores_masked_candidates_and_uncovered_queries():
  scores, covers, mask = _grouped_case(4)
  mask[0, 1] = False
  covers[0, 1, :] = True  # a masked candidate covering everything must not count
  base = float(grouped_listwise_loss(scores, covers, mask, 0.7))
  moved = scores.copy()
  moved[~mask] = 50.0 * np.random.default_rng(0).normal(size=int((~mask).sum()))
  assert float(grouped_listwise_loss(moved, covers, mask, 0.7)) == pytest.approx(base, rel=1e-6)
  # Only query 0 counts: the loss is its own, whatever the others' scores.
  only = np.zeros_like(covers)
  only[0] = covers[0]
  alone = float(grouped_listwise_loss(scores[:1], only[:1], mask[:1], 0.7))
  other = scores.copy()
  other[1:] += 10.0 * np.random.default_rng(1).normal(size=other[1:].shape).astype(np.float32)
  assert float(grouped_listwise_loss(other, only, mask, 0.7)) == pytest.approx(alone, rel=1e-5)
  assert float(grouped_listwise_loss(scores, np.zeros_like(covers), mask, 0.7)) == 0.0
  # Every candidate of query 0 covering item 0: its term is -log 1 = 0.
  full = np.zeros_like(covers)
  full[0, :, 0] = True
  assert float(grouped_listwise_loss(scores, full, mask, 0.7)) == pytest.approx(0.0, abs=1e-6)


def test_grouped_listwise_loss_gradient_matches_finite_differences():
  scores, covers, mask = _grouped_case(5)
  tau = 0.6
  grad = np.asarray(jax.grad(grouped_listwise_loss)(jnp.asarray(scores), covers, mask, tau))
  fd = np.zeros(scores.shape)
  eps = 1e-6  # central differences of the float64 definition
  for idx in np.ndindex(scores.shape):
    up, down = scores.astype(np.float64), scores.astype(np.float64)
    up[idx] += eps
    down[idx] -= eps
    fd[idx] = (_naive_grouped(up, covers, mask, tau) - _naive_grouped(down, covers, mask, tau)) / (
        2 * eps)
  assert np.abs(fd).max() > 1e-2  # the check compares something
  np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-5)
  assert np.all(grad[~mask] == 0.0) and np.all(grad[-1] == 0.0)


# -- the learned sufficiency judge -----------------------------------------------------------

D, N = 8, 6
# Compiled once per shape: op-by-op dispatch would be most of this file's time.
judge_init = judge.judge_init
judge_logit, judge_logits = jax.jit(judge.judge_logit), jax.jit(judge.judge_logits)
judge_loss = jax.jit(judge.judge_loss)
judge_loss_grad = jax.jit(jax.grad(judge.judge_loss))


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _judge_inputs(seed: int, b: int = 5):
  rng = np.random.default_rng(seed)
  q = _unit(rng.normal(size=(b, D))).astype(np.float32)
  facts = rng.normal(size=(b, N, D)).astype(np.float32)
  mask = rng.random((b, N)) < 0.7
  mask[:, 0] = True
  return q, facts, mask


def _params(seed: int = 0, hidden: int = 16):
  params = judge_init(jax.random.PRNGKey(seed), D, hidden)
  # Non-zero attention and a larger output layer, so every path moves the logit.
  params["attend"] = jax.random.normal(jax.random.PRNGKey(seed + 1), params["attend"].shape)
  params["out"]["w"] = params["out"]["w"] * 10.0
  return params


def test_judge_is_invariant_to_the_facts_order():
  params = _params()
  q, facts, mask = _judge_inputs(0)
  logits = np.asarray(judge_logits(params, q, facts, mask))
  assert np.ptp(logits) > 1e-3  # the inputs tell the examples apart
  rng = np.random.default_rng(1)
  for b in range(len(q)):
    single = float(judge_logit(params, q[b], facts[b], mask[b]))
    assert single == pytest.approx(logits[b], abs=1e-5)
    for _ in range(3):
      perm = rng.permutation(N)
      shuffled = float(judge_logit(params, q[b], facts[b][perm], mask[b][perm]))
      assert shuffled == pytest.approx(single, abs=1e-5)


def test_judge_is_invariant_to_padding_and_finite_without_facts():
  params = _params()
  q, facts, mask = _judge_inputs(2)
  rng = np.random.default_rng(3)
  for b in range(len(q)):
    valid = facts[b][mask[b]]
    plain = float(judge_logit(params, q[b], valid, np.ones(len(valid), bool)))
    pad = 100.0 * rng.normal(size=(4, D)).astype(np.float32)
    pad[0] = q[b] * 5.0  # a masked row that would be the best match
    padded = float(judge_logit(params, q[b], np.concatenate([valid, pad]),
                               np.concatenate([np.ones(len(valid), bool), np.zeros(4, bool)])))
    assert padded == pytest.approx(plain, abs=1e-4)
  # All masked: finite, and the same whatever the masked rows hold.
  none = np.zeros(N, bool)
  empty = [float(judge_logit(params, q[0], 10.0 * rng.normal(size=(N, D)).astype(np.float32),
                             none)) for _ in range(3)]
  assert all(np.isfinite(empty)) and np.ptp(empty) < 1e-5
  grads = jax.jit(jax.grad(judge.judge_logit))(params, q[0], facts[0], none)
  assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


def test_judge_loss_is_weighted_binary_cross_entropy():
  params = _params()
  q, facts, mask = _judge_inputs(4, b=6)
  label = np.array([1, 0, 1, 0, 1, 0], bool)
  weight = np.array([1.0, 0.5, 0.0, 2.0, 0.0, 1.5], np.float32)
  logits = np.array([float(judge_logit(params, q[b], facts[b], mask[b])) for b in range(6)])
  sig = 1.0 / (1.0 + np.exp(-logits))
  per = -(label * np.log(sig) + (1 - label) * np.log(1.0 - sig))
  want = np.sum(per * weight) / np.sum(weight)
  got = float(judge_loss(params, q, facts, mask, label, weight))
  assert got == pytest.approx(want, rel=1e-5)
  # Weight-0 rows count for nothing: their labels and facts can be anything.
  label2, facts2 = label.copy(), facts.copy()
  label2[[2, 4]] = ~label2[[2, 4]]
  facts2[[2, 4]] = 50.0
  assert float(judge_loss(params, q, facts2, mask, label2, weight)) == pytest.approx(got, rel=1e-6)
  assert float(judge_loss(params, q, facts, mask, ~label, weight)) != pytest.approx(got, rel=1e-3)


@pytest.mark.parametrize("leaf", [("fact", "w"), ("attend",), ("head", "b")])
def test_judge_loss_gradient_matches_finite_differences(leaf):
  params = _params(seed=7)
  q, facts, mask = _judge_inputs(5, b=4)
  label = np.array([1, 0, 1, 1], bool)
  weight = np.array([1.0, 2.0, 0.5, 1.0], np.float32)

  def get(tree):
    for name in leaf:
      tree = tree[name]
    return tree

  def with_leaf(value):
    tree = jax.tree.map(lambda x: x, params)
    node = tree
    for name in leaf[:-1]:
      node = node[name]
    node[leaf[-1]] = value
    return tree

  grad = np.asarray(get(judge_loss_grad(params, q, facts, mask, label, weight)), np.float64)
  w = get(params)
  loss = jax.jit(lambda v: judge.judge_loss(with_leaf(v), q, facts, mask, label, weight))
  rng = np.random.default_rng(0)
  eps = 1e-2  # float32: a step large enough that rounding stays well below the difference
  for _ in range(3):
    direction = _unit(rng.normal(size=w.size)).reshape(w.shape).astype(np.float32)
    fd = (float(loss(w + eps * direction)) - float(loss(w - eps * direction))) / (2 * eps)
    analytic = float(np.sum(grad * direction))
    assert abs(analytic) > 1e-3
    assert fd == pytest.approx(analytic, rel=3e-2, abs=2e-4)


def _separable(n: int, seed: int) -> JudgeExamples:
  """Label: some valid fact is close to the question; negatives keep their valid facts far from
  it, but half of them hide a close vector in a masked row."""
  rng = np.random.default_rng(seed)
  q = _unit(rng.normal(size=(n, D))).astype(np.float32)
  facts = np.zeros((n, N, D), np.float32)
  mask = np.zeros((n, N), bool)
  label = rng.random(n) < 0.5
  for i in range(n):
    count = int(rng.integers(1, N))
    rows = []
    while len(rows) < N:  # far from q: cosine below 0.4
      r = _unit(rng.normal(size=D))
      if r @ q[i] < 0.4:
        rows.append(r)
    facts[i] = np.stack(rows)
    mask[i, :count] = True
    close = _unit(q[i] + 0.1 * rng.normal(size=D))
    if label[i]:
      facts[i, rng.integers(count)] = close
    elif rng.random() < 0.5:
      facts[i, count] = close  # masked: must not count
  return JudgeExamples(q, facts, mask, label)


def test_fit_judge_learns_whether_a_fact_matches_the_question():
  train, test = _separable(256, 0), _separable(200, 1)
  params, losses = fit_judge(train, epochs=60, batch=64, lr=3e-3, seed=0, hidden=16)
  assert len(losses) == 60 * 4 and losses[-4:].mean() < losses[:4].mean()
  logits = np.asarray(judge_logits(params, test.q_NxD, test.facts_NxFxD, test.mask_NxF))
  accuracy = np.mean((logits > 0) == test.label_N)
  assert accuracy > 0.9, accuracy


def test_adam_on_judge_loss_reaches_the_same_problem():
  train, test = _separable(256, 2), _separable(200, 3)
  params = judge_init(jax.random.PRNGKey(1), D, 16)
  state = core.adam_init(params)
  weight = np.ones(len(train.label_N), np.float32)

  @jax.jit
  def step(params, state):
    grads = jax.grad(judge.judge_loss)(params, train.q_NxD, train.facts_NxFxD, train.mask_NxF,
                                 train.label_N, weight)
    return core.adam_update(params, state, grads, jnp.asarray(3e-3, jnp.float32))

  for _ in range(300):
    params, state = step(params, state)
  logits = np.asarray(judge_logits(params, test.q_NxD, test.facts_NxFxD, test.mask_NxF))
  assert np.mean((logits > 0) == test.label_N) > 0.9


# -- verdicts from probabilities ---------------------------------------------------------------


def test_verdict_of_thresholds_and_clips():
  below_exact, below_half = float(np.nextafter(EXACT_AT, 0.0)), float(np.nextafter(0.5, 0.0))
  cases = [(EXACT_AT, "EXACT", EXACT_AT), (0.99, "EXACT", 0.99), (1.0, "EXACT", 1.0),
           (1.7, "EXACT", 1.0), (below_exact, "INFERRABLE", below_exact),
           (0.5, "INFERRABLE", 0.5), (below_half, "PARTIAL", below_half),
           (0.1, "PARTIAL", 0.1), (0.0, "PARTIAL", 0.0), (-0.3, "PARTIAL", 0.0),
           (np.float32(0.9), "EXACT", float(np.float32(0.9)))]
  for p, label, confidence in cases:
    verdict = verdict_of(p)
    assert (verdict.label, verdict.confidence) == (label, confidence), p
    assert isinstance(verdict.confidence, float)


# -- search by vector ------------------------------------------------------------------------

TALK = [("S1", "9 May 2023", "Ana", "I signed up for a pottery class and it starts next week."),
        ("S1", "9 May 2023", "Ben", "Nice! My sister is a potter; she sells bowls at the market."),
        ("S1", "9 May 2023", "Ana", "I adopted a puppy named Biscuit because I wanted company."),
        ("S2", "20 June 2023", "Ben", "We drove to the coast last weekend to watch the whales."),
        ("S2", "20 June 2023", "Ana", "Biscuit chewed my new sandals; I was furious.")]


def _lace(turns, retrieval: str) -> LaceMem:
  lace = LaceMem(HashEncoder(), settings=LaceSettings(retrieval=retrieval))
  for n, (session, date, speaker, text) in enumerate(turns):
    lace.add_turn(f"D{n}", session, date, speaker, text)
  return lace


@pytest.mark.parametrize("retrieval", ["dense", "hybrid", "bm25"])
def test_search_vector_of_the_query_vector_is_search(retrieval):
  lace = _lace(TALK, retrieval)
  for query in ("pottery class", "whales at the coast", "Biscuit sandals", "the"):
    for k in (1, 3, 50):
      assert lace.search_vector(lace.query_vector(query), k, query) == lace.search(query, k)
  if retrieval == "bm25":  # BM25 alone: the vector does not matter
    other = np.random.default_rng(0).normal(size=HashEncoder.dim)
    assert lace.search_vector(other, 4, "pottery") == lace.search("pottery", 4)


def test_dense_search_vector_ranks_by_the_dot_product():
  lace = _lace(TALK, "dense")
  vectors = lace.fact_vectors(list(range(len(lace))))
  rng = np.random.default_rng(0)
  for _ in range(5):
    v = rng.normal(size=HashEncoder.dim).astype(np.float32)
    scores = vectors.astype(np.float64) @ v.astype(np.float64)
    for k in (1, 4, len(lace) + 3):
      hits = lace.search_vector(v, k, "anything at all")
      assert [f for f, _ in hits] == list(np.argsort(-scores, kind="stable")[:k])
      np.testing.assert_allclose([s for _, s in hits], np.sort(scores)[::-1][:k], rtol=1e-5,
                                 atol=1e-6)


def test_search_vector_of_an_empty_store_finds_nothing():
  assert LaceMem(HashEncoder()).search_vector(np.zeros(HashEncoder.dim), 3, "q") == []


# -- IRIS with a vector refiner --------------------------------------------------------------

THINGS = ["heron", "kettle", "violin", "tulip", "glacier", "lantern", "compass", "walnut",
          "meteor", "pebble", "saddle", "quill", "harbor", "marble", "cactus", "ferry", "goblet",
          "anchor", "turnip", "zephyr", "canyon", "beacon", "thimble", "orchid", "falcon",
          "mosaic", "pretzel", "sonnet", "tundra", "velvet", "yodel", "ember"]


def _big_lace() -> LaceMem:
  turns = [("S1", "8 May 2023", "Ana" if i % 2 else "Ben", f"My {a} sits beside a {b}.")
           for i, (a, b) in enumerate(zip(THINGS, THINGS[3:] + THINGS[:3]))]
  lace = _lace(turns, "dense")
  assert len(lace) == len(turns) > 2 * 10  # more facts than a learned-preset search returns
  return lace


@final
class NeverStop(SufficiencyJudge):
  def judge(self, question: str, facts: Sequence[Fact], raws: Mapping[str, RawTurn], *,
            category: str | None = None) -> Verdict:
    return Verdict("PARTIAL", 0.5, "")


@final
class PointAt(VectorRefiner):
  """Refines to a fixed vector, recording what it was asked."""

  def __init__(self, vector: np.ndarray):
    self.vector = vector
    self.requests: list[RefineRequest] = []
    self.embedded: list[tuple[str, np.ndarray]] = []

  def refine(self, request: RefineRequest) -> str:
    self.requests.append(request)
    return "where is the thing"

  def query_vector(self, text: str, question_vector: np.ndarray) -> np.ndarray:
    self.embedded.append((text, np.array(question_vector)))
    return self.vector


def test_iris_with_a_vector_refiner_searches_by_its_vector_and_leads_with_it():
  lace = _big_lace()
  settings = IRIS_PRESETS["learned"]
  question = "Where does the heron sit beside the tulip?"
  anchor = [f for f, _ in lace.search(question, settings.budget(2))]
  target = next(f for f in reversed(range(len(lace))) if f not in anchor[:settings.budget(1)])
  vector = lace.fact_vectors([target])[0]
  scores = lace.fact_vectors(list(range(len(lace)))) @ vector
  assert np.sum(scores >= scores[target] - 1e-6) == 1  # the target is the one best match
  refiner = PointAt(vector)
  result = iris_retrieve(lace, question, judge=NeverStop(), settings=settings, refiner=refiner)
  assert result.iterations == 2 and not result.stopped
  first, second = result.trace
  assert first.refine_hits == () and first.anchor_hits == tuple(anchor[:settings.budget(1)])
  # The second iteration searches by the refiner's vector: its ranking, the target first.
  k = settings.budget(2)
  assert second.refine_hits[0] == target
  assert list(second.refine_hits) == list(np.argsort(-scores, kind="stable")[:k])
  assert second.query == "where is the thing"
  # final_order "last": the refinement hits in order, then the other anchor hits by rank.
  assert result.fact_ids[:k] == second.refine_hits
  rest = [f for f in anchor if f not in set(second.refine_hits)]
  assert list(result.fact_ids[k:]) == rest
  # The refiner saw the question, and as evidence the clauses of iteration 1's best facts.
  (request,) = refiner.requests
  top = anchor[:settings.feedback_facts]
  assert request.question == question and request.stage_index == 0
  assert request.evidence == tuple(lace.fact(f).text.split("] ", 1)[1] for f in top)
  assert request.evidence[0].startswith(("Ana: ", "Ben: "))
  ((text, question_vector),) = refiner.embedded
  assert text == "where is the thing"
  np.testing.assert_array_equal(question_vector, lace.query_vector(question))


# -- the oracle's note ---------------------------------------------------------------------


def test_oracle_judge_without_note_hides_the_missing_turns():
  lace = _lace(TALK, "dense")
  evidence = ["D0", "D3", "D4"]
  shown = [lace.fact(f) for f in range(len(lace)) if lace.fact(f).turn_id == "D0"]
  noted = OracleJudge(evidence, lace, note=True).judge("q", shown, {})
  quiet = OracleJudge(evidence, lace, note=False).judge("q", shown, {})
  assert noted.label == quiet.label == "PARTIAL"
  assert noted.confidence == quiet.confidence == pytest.approx(1 / 3)
  assert noted.missing == (f"Ben: {TALK[3][3]} Ana: {TALK[4][3]}")
  assert quiet.missing == ""
  assert OracleJudge(evidence, None, note=False).judge("q", shown, {}).missing == ""
  everything = [lace.fact(f) for f in range(len(lace))]
  assert OracleJudge(evidence, lace, note=False).judge("q", everything, {}) == Verdict(
      "EXACT", 1.0, "")


def test_hybrid_iris_fuses_the_vector_with_bm25_over_the_question():
  lace = _lace(TALK, "hybrid")
  question = "What did Biscuit chew?"
  vector = lace.fact_vectors([3])[0]
  settings = IRIS_PRESETS["learned"]
  result = iris_retrieve(lace, question, judge=NeverStop(), settings=settings,
                         refiner=PointAt(vector))
  k = settings.budget(2)
  by_question = [f for f, _ in lace.search_vector(vector, k, question)]
  assert by_question != [f for f, _ in lace.search_vector(vector, k, "where is the thing")]
  assert list(result.trace[1].refine_hits) == by_question


def test_ranking_examples_mix_the_searchs_top_hits_with_facts_from_the_whole_store():
  """A fit that ranks the evidence only against the question's nearest hits never sees the
  rest of the store (with K = 20 that drove the anchor below the base encoder)."""
  from rmmjax.learners.iris.fit import ranking_example
  store = LaceMem(HashEncoder())
  store.add_turns([(f"t{i}", "s", "1 May", "Ann", f"Ann said thing number {i} today.")
                   for i in range(60)])
  facts = store.facts
  evidence = ["t0", "t1"]
  hard = [f.fact_id for f in facts if f.turn_id not in evidence][:40]  # the search's top hits
  asked = []
  vectors = store.fact_vectors
  store.fact_vectors = lambda ids: asked.append(list(ids)) or vectors(ids)
  for share, hard_wanted in ((0.5, 9), (1.0, 18), (0.0, 0)):
    rng = np.random.default_rng(0)
    _, mem, covers = ranking_example(store, "q", evidence, set(), hard, 20, 2, rng, share)
    chosen = asked[-1]
    positives = [f for f in chosen if facts[f].turn_id in evidence]
    assert len(set(chosen)) == 20 and covers.any(-1).sum() == len(positives) <= 5
    n_hard = round((20 - len(positives)) * share)
    assert set(hard[:n_hard]) <= set(chosen) and n_hard == hard_wanted
    # The rest are drawn from the store at large, never from the evidence turns.
    rest = set(chosen) - set(positives) - set(hard[:n_hard])
    assert len(rest) == 20 - len(positives) - n_hard
    assert all(facts[f].turn_id not in evidence for f in rest)


def test_a_judge_file_of_another_format_is_refused_naming_it(tmp_path):
  from safetensors.numpy import save_file
  from rmmjax.learners.iris.files import load_judge
  path = tmp_path / "judge.safetensors"
  save_file({"attend": np.zeros(2, np.float32)}, str(path),
            metadata={"rmmjax_format": "rmmjax-sufficiency-judge-0"})
  with pytest.raises(ValueError, match="judge.safetensors was written in rmmjax's judge format "
                     "'rmmjax-sufficiency-judge-0'; this rmmjax reads judge format "
                     "'rmmjax-sufficiency-judge-1'; export its training workdir again"):
    load_judge(path)
