"""Gumbel top-M sampling and the Plackett-Luce log-probability, against enumeration."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rmmjax import core

SCORES = jnp.array([1.2, -0.3, 0.5, 2.0, 0.0], jnp.float32)


def pl_prob_naive(scores, order, tau, mask):
  """Plackett-Luce probability by the textbook product, in NumPy float64."""
  logits = np.asarray(scores, np.float64) / tau
  left = [i for i in range(len(logits)) if mask[i]]
  p = 1.0
  for i in order:
    w = np.exp(logits[left])
    p *= np.exp(logits[i]) / w.sum()
    left.remove(i)
  return p


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("mask", [None, (True, True, False, True, True)])
def test_pl_probabilities_sum_to_one_and_match_textbook(m, mask):
  tau = 0.7
  mask_arr = None if mask is None else jnp.array(mask)
  valid = [i for i in range(5) if mask is None or mask[i]]
  total = 0.0
  for order in itertools.permutations(valid, m):
    lp = core.selection_log_prob(SCORES, jnp.array(order), tau, mask_arr)
    want = pl_prob_naive(SCORES, order, tau, mask if mask else [True] * 5)
    np.testing.assert_allclose(np.exp(float(lp)), want, rtol=1e-5)
    total += np.exp(float(lp))
  np.testing.assert_allclose(total, 1.0, rtol=1e-5)


def _frequencies(sample_fn, n, k, m):
  keys = jax.random.split(jax.random.PRNGKey(0), n)
  sel = np.asarray(jax.jit(jax.vmap(sample_fn))(keys))
  counts = {}
  for row in map(tuple, sel):
    counts[row] = counts.get(row, 0) + 1
  return counts


def test_gumbel_top_m_frequencies_match_plackett_luce():
  scores, tau, m, n = SCORES[:4], 0.5, 2, 200_000
  counts = _frequencies(lambda k: core.gumbel_top_m(k, scores, m, tau), n, 4, m)
  for order in itertools.permutations(range(4), m):
    p = float(jnp.exp(core.selection_log_prob(scores, jnp.array(order), tau)))
    freq = counts.get(order, 0) / n
    # 5 standard errors of a binomial proportion.
    assert abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n) + 1e-4, (order, freq, p)


def test_paper_recipe_ignores_temperature():
  """Ranking s + g samples Plackett-Luce(s) whatever tau is: it disagrees with softmax(s/tau)."""
  scores, tau, m, n = SCORES[:4], 0.25, 1, 100_000
  counts = _frequencies(lambda k: core.gumbel_top_m(k, scores, m, tau, paper=True), n, 4, m)
  freq = np.array([counts.get((i,), 0) / n for i in range(4)])
  np.testing.assert_allclose(freq, jax.nn.softmax(scores), atol=0.01)
  assert np.abs(freq - jax.nn.softmax(scores / tau)).max() > 0.1


def test_masked_candidates_never_selected_and_short_banks_padded():
  mask = jnp.array([True, False, True, False, False])
  keys = jax.random.split(jax.random.PRNGKey(1), 500)
  sel = jax.vmap(lambda k: core.gumbel_top_m(k, SCORES, 3, 0.5, mask))(keys)
  sel = np.asarray(sel)
  assert set(sel[:, :2].ravel()) == {0, 2}
  assert (sel[:, 2] == -1).all()
  np.testing.assert_array_equal(np.sort(sel[:, :2], axis=1), np.tile([0, 2], (500, 1)))


def test_top_m_is_deterministic_order():
  np.testing.assert_array_equal(core.top_m(SCORES, 3), [3, 0, 2])
  np.testing.assert_array_equal(core.top_m(SCORES, 3, jnp.array([1, 1, 0, 0, 0], bool)),
                                [0, 1, -1])


def test_surrogate_is_sum_of_log_softmax():
  sel = jnp.array([3, 0, -1])
  got = core.selection_log_prob(SCORES, sel, 0.5, surrogate=True)
  want = jax.nn.log_softmax(SCORES / 0.5)[jnp.array([3, 0])].sum()
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # It is not a probability of the ordered selection: it undercounts the later positions.
  assert float(got) < float(core.selection_log_prob(SCORES, sel, 0.5))


def test_all_masked_gives_zero_log_prob_and_finite_gradients():
  mask = jnp.zeros((5,), bool)
  sel = core.gumbel_top_m(jax.random.PRNGKey(0), SCORES, 2, 0.5, mask)
  np.testing.assert_array_equal(sel, [-1, -1])
  for surrogate in (False, True):
    lp, g = jax.value_and_grad(core.selection_log_prob)(SCORES, sel, 0.5, mask, surrogate)
    assert float(lp) == 0.0
    assert np.isfinite(np.asarray(g)).all() and not np.asarray(g).any()
  assert float(core.selection_entropy(SCORES, 0.5, mask)) == 0.0


def test_entropy_matches_formula():
  p = jax.nn.softmax(SCORES / 0.5)
  np.testing.assert_allclose(core.selection_entropy(SCORES, 0.5), -(p * jnp.log(p)).sum(),
                             rtol=1e-5)
