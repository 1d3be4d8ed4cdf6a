"""REINFORCE and the listwise loss, against exact expectations and hand-computed values."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rmmjax import core

K, M, TAU = 4, 2, 0.7
ITEM_REWARD = jnp.array([1.0, -1.0, 1.0, -1.0])  # +1 when the generator would cite the item


def _expected_set_reward(scores):
  """Exact E[R] over every ordered selection of M of K, R the mean of the items' rewards."""
  total = 0.0
  for order in itertools.permutations(range(K), M):
    sel = jnp.array(order)
    p = jnp.exp(core.selection_log_prob(scores, sel, TAU))
    total = total + p * jnp.mean(ITEM_REWARD[sel])
  return total


@pytest.mark.parametrize("credit", ["set", "position"])
def test_reinforce_gradient_matches_exact_gradient_of_expected_reward(credit):
  scores = jnp.array([0.3, 1.0, -0.5, 0.2])
  exact = jax.grad(_expected_set_reward)(scores)
  n = 40_000
  keys = jax.random.split(jax.random.PRNGKey(0), n)
  sel_NxM = jax.vmap(lambda k: core.gumbel_top_m(k, scores, M, TAU))(keys)
  rewards_NxM = ITEM_REWARD[sel_NxM]
  if credit == "position":  # each term weighted by its own reward estimates M * dE[R]/ds
    rewards_NxM = rewards_NxM / M
  scores_NxK = jnp.tile(scores, (n, 1))
  mask = jnp.ones((n, K), bool)
  baseline = jnp.full((n,), 0.5 if credit == "set" else 0.0)
  grad = jax.grad(lambda s: core.reinforce_loss(s, sel_NxM, rewards_NxM, baseline, TAU, mask,
                                                credit)[0])(scores_NxK)
  estimate = -grad.sum(0)  # the loss is the negated batch mean, one row per sample
  if credit == "set":
    np.testing.assert_allclose(estimate, exact, atol=0.02)
  else:
    # Position credit drops the effect of a choice on later positions: a biased but lower
    # variance signal. It must still point uphill.
    assert float(estimate @ exact) > 0
  assert np.abs(exact).max() > 0.1  # the test problem has a real gradient to match


def test_masked_and_unselected_candidates_get_zero_gradient():
  scores = jnp.array([[0.3, 1.0, -0.5, 0.2, 0.9]])
  mask = jnp.array([[True, True, True, False, True]])
  sel = jnp.array([[1, 4]])
  g = jax.grad(lambda s: core.reinforce_loss(s, sel, jnp.ones((1, 2)), jnp.zeros(1), TAU,
                                             mask)[0])(scores)
  assert float(g[0, 3]) == 0.0
  assert np.abs(np.asarray(g[0, [0, 1, 2, 4]])).min() > 0


def test_reinforce_loss_value_and_advantage_is_constant():
  scores = jnp.array([[0.3, 1.0, -0.5, 0.2]])
  sel = jnp.array([[1, 2]])
  rewards = jnp.array([[1.0, -1.0]])
  mask = jnp.ones((1, 4), bool)
  loss, aux = core.reinforce_loss(scores, sel, rewards, jnp.array([0.5]), TAU, mask)
  lp = core.selection_log_prob(scores[0], sel[0], TAU)
  np.testing.assert_allclose(loss, -(0.0 - 0.5) * lp, rtol=1e-6)
  np.testing.assert_allclose(aux["advantage"], -0.5)
  # The gradient is exactly (R - b) * grad log P: nothing flows through the advantage.
  g = jax.grad(lambda s: core.reinforce_loss(s, sel, rewards, jnp.array([0.5]), TAU, mask)[0])(
      scores)
  g_lp = jax.grad(lambda s: core.selection_log_prob(s[0], sel[0], TAU))(scores)
  np.testing.assert_allclose(g, 0.5 * g_lp, rtol=1e-6)


def test_rewards_and_baselines_by_hand():
  sel = jnp.array([[0, 2, -1], [1, 3, 4]])
  cited = jnp.array([[True, False, True], [False, False, True]])
  rewards = core.citation_rewards(cited, sel)
  np.testing.assert_array_equal(rewards, [[1, -1, 0], [-1, -1, 1]])
  r = core.set_reward(rewards, sel)
  np.testing.assert_allclose(r, [0.0, -1 / 3], rtol=1e-6)
  reward_B = jnp.array([1.0, 0.0, -1.0])
  for kind, want in [(0, [0.5] * 3), (1, [0.2] * 3), (2, [-0.5, 0.0, 0.5])]:
    got = core.baseline_values(jnp.int32(kind), jnp.float32(0.5), jnp.float32(0.2), reward_B)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_listwise_loss_by_hand_and_masked_rows():
  scores = jnp.array([[2.0, 1.0, 0.0, 5.0], [1.0, 1.0, 1.0, 1.0]])
  relevant = jnp.array([[True, True, False, False], [False, False, False, False]])
  mask = jnp.array([[True, True, True, False], [True, True, True, True]])
  logz = np.log(np.exp(2.0) + np.exp(1.0) + np.exp(0.0))
  want = -0.5 * ((2.0 - logz) + (1.0 - logz))  # the second row has no positive: ignored
  np.testing.assert_allclose(core.listwise_loss(scores, relevant, mask), want, rtol=1e-6)
  g = jax.grad(lambda s: core.listwise_loss(s, relevant, jnp.zeros_like(mask)))(scores)
  assert np.isfinite(np.asarray(g)).all() and not np.asarray(g).any()
  g = jax.grad(lambda s: core.listwise_loss(s, relevant, mask))(scores)
  assert float(g[0, 3]) == 0.0 and not np.asarray(g[1]).any()


def _lambda_loss_naive(scores, relevant, mask, tau):
  """LambdaLoss written out pair by pair: every (relevant, irrelevant) pair of valid candidates,
  its logistic loss weighted by K |gain_i - gain_j| / ideal DCG * |D(d) - D(d + 1)|, d the two
  ranks' distance, D(r) = 1 / log2(1 + r), gain = 2^y - 1; the mean over those pairs."""
  total, count = 0.0, 0
  b, k = scores.shape
  for q in range(b):
    valid = [i for i in range(k) if mask[q, i]]
    order = sorted(valid, key=lambda i: -scores[q, i])
    rank = {i: r + 1 for r, i in enumerate(order)}
    labels = {i: float(relevant[q, i]) for i in valid}
    gains = {i: 2.0 ** labels[i] - 1.0 for i in valid}
    ideal = sum(g / np.log2(1 + r) for r, g in enumerate(sorted(gains.values(), reverse=True), 1))
    ideal = ideal or 1.0
    discount = lambda r: 1.0 / np.log2(1.0 + r)  # noqa: E731
    for i in valid:
      for j in valid:
        if labels[i] > labels[j]:
          d = abs(rank[i] - rank[j])
          weight = k * abs(gains[i] - gains[j]) / ideal * abs(discount(d) - discount(d + 1))
          total += weight * np.log1p(np.exp(-(scores[q, i] - scores[q, j]) / tau))
          count += 1
  return total / max(count, 1)


def test_lambda_loss_matches_the_pairs_written_out():
  rng = np.random.default_rng(3)
  scores = rng.normal(size=(3, 6))
  relevant = np.array([[1, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0]], bool)
  mask = np.ones((3, 6), bool)
  mask[1, 2] = mask[0, 5] = False  # missing candidates take no part
  got = core.losses.lambda_loss(jnp.asarray(scores, jnp.float32), relevant, mask, 0.5)
  np.testing.assert_allclose(float(got), _lambda_loss_naive(scores, relevant, mask, 0.5),
                             rtol=1e-5)
  # A relevant candidate ranked higher lowers it, and its gradient pushes the relevant up.
  grad = jax.grad(core.losses.lambda_loss)(jnp.asarray(scores, jnp.float32), relevant, mask, 0.5)
  assert float(grad[0, 0]) < 0 and float(grad[1, 5]) < 0 and float(grad[1, 0]) > 0
  assert float(jnp.abs(grad[2]).max()) == 0.0  # (no relevant candidate: no pair)
  assert float(grad[1, 2]) == 0.0


def test_weakest_piece_loss_is_the_hardest_relevant_against_the_irrelevant_written_out():
  rng = np.random.default_rng(5)
  scores = rng.normal(size=(4, 6))
  relevant = np.array([[1, 0, 0, 1, 0, 1], [0, 0, 0, 0, 0, 1], [0] * 6, [1, 1, 0, 0, 0, 0]], bool)
  mask = np.ones((4, 6), bool)
  mask[0, 5] = mask[1, 2] = False  # missing candidates take no part, relevant or not
  tau = 0.5
  want = []
  for q in range(4):
    pos = [i for i in range(6) if mask[q, i] and relevant[q, i]]
    neg = [i for i in range(6) if mask[q, i] and not relevant[q, i]]
    if pos:
      want.append(max(-np.log(np.exp(scores[q, i] / tau) / (
          np.exp(scores[q, i] / tau) + sum(np.exp(scores[q, j] / tau) for j in neg)))
          for i in pos))
  s = jnp.asarray(scores, jnp.float32)
  got = core.losses.weakest_piece_loss(s, relevant, mask, tau)
  np.testing.assert_allclose(float(got), np.mean(want), rtol=1e-5)
  # One relevant candidate per query: the listwise loss itself.
  one = np.zeros_like(relevant)
  one[np.arange(4), [0, 5, 3, 1]] = True
  np.testing.assert_allclose(float(core.losses.weakest_piece_loss(s, one, mask, tau)),
                             float(core.listwise_loss(s, one & mask, mask, tau)), rtol=1e-5)
  # The gradient reaches the hardest piece of a query alone, and no query without evidence.
  grad = np.asarray(jax.grad(core.losses.weakest_piece_loss)(s, relevant, mask, tau))
  hardest = min((0, 3), key=lambda i: scores[0, i])
  assert grad[0, hardest] < 0 and grad[0, 3 - hardest] == 0.0 and grad[0, 5] == 0.0
  assert not grad[2].any() and np.isfinite(grad).all()
