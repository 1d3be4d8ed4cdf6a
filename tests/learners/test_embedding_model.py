"""The embedding rerankers' model: identity at initialisation, fast linear scores equal the
naive formula, and the core's step takes its low-rank gradients."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rmmjax import core
from rmmjax.learners.embedding.model import (EMBEDDING, init_params, linear_grad_factors, score,
                                             score_naive)


def _random_problem(d=16, k=7, seed=0):
  kq, km = jax.random.split(jax.random.PRNGKey(seed))
  return jax.random.normal(kq, (d,)), jax.random.normal(km, (k, d))


@pytest.mark.parametrize("variant", ["linear", "mlp"])
def test_identity_initialisation_reproduces_base_scores(variant):
  q, m = _random_problem()
  spec = core.CoreSpec(variant=variant, dim=16, hidden=8, k=7, m=3)
  params = init_params(jax.random.PRNGKey(1), spec)
  np.testing.assert_allclose(score(params, q, m, variant), m @ q, rtol=1e-6, atol=1e-6)


def test_fast_linear_equals_naive_formula():
  q, m = _random_problem(d=32, k=20)
  kq, km = jax.random.split(jax.random.PRNGKey(3))
  params = {"wq": 0.2 * jax.random.normal(kq, (32, 32)),
            "wm": 0.2 * jax.random.normal(km, (32, 32))}
  fast = score(params, q, m, "linear")
  # Independent computation: transform every memory explicitly, in float64 NumPy.
  qn, mn = np.asarray(q, np.float64), np.asarray(m, np.float64)
  wq, wm = (np.asarray(params[k], np.float64) for k in ("wq", "wm"))
  want = (mn + mn @ wm) @ (qn + qn @ wq)
  np.testing.assert_allclose(fast, want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(score_naive(params, q, m), want, rtol=1e-4, atol=1e-4)


def test_fast_and_naive_gradients_agree():
  q, m = _random_problem(d=8, k=5)
  params = init_params(jax.random.PRNGKey(0), core.CoreSpec(dim=8, k=5, m=2))
  params = jax.tree.map(lambda x: x + 0.1, params)
  w = jnp.arange(5.0)
  g_fast = jax.grad(lambda p: score(p, q, m) @ w)(params)
  g_naive = jax.grad(lambda p: score_naive(p, q, m) @ w)(params)
  for name in ("wq", "wm"):
    np.testing.assert_allclose(g_fast[name], g_naive[name], rtol=1e-5, atol=1e-5)


def test_mlp_learns_a_nonlinear_residual():
  q, m = _random_problem()
  spec = core.CoreSpec(variant="mlp", dim=16, hidden=8)
  params = init_params(jax.random.PRNGKey(1), spec)
  params = jax.tree.map(lambda x: x + 0.05, params)
  assert "b2" in params["q_mlp"] and "b2" not in params["m_mlp"]
  mlp = lambda p, x, b2: x + jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"] + b2
  want = (jax.vmap(mlp, (None, 0, None))(params["m_mlp"], m, 0.0)
          @ mlp(params["q_mlp"], q, params["q_mlp"]["b2"]))
  np.testing.assert_allclose(score(params, q, m, "mlp"), want, rtol=1e-5, atol=1e-5)


def test_mismatched_dimensions_are_refused():
  params = init_params(jax.random.PRNGKey(0), core.CoreSpec(dim=16))
  q, m = _random_problem(d=16)
  with pytest.raises(ValueError, match="query dimension 16 != memory dimension 8"):
    score(params, q, m[:, :8])
  with pytest.raises(ValueError, match="embedding dimension 8 != reranker dimension 16"):
    score(params, q[:8], m[:, :8])
  with pytest.raises(ValueError, match="vmap"):
    score(params, m, m)


def test_spec_refuses_m_above_k():
  with pytest.raises(ValueError, match="m=21 > k=20"):
    core.CoreSpec(k=20, m=21)


@pytest.mark.parametrize("variant", ["linear", "mlp"])
def test_rank_prior_adds_a_bias_per_candidate_position(variant):
  q, m = _random_problem(k=7)
  spec = core.CoreSpec(variant=variant, dim=16, hidden=8, k=7, m=3, rank_prior=True)
  params = init_params(jax.random.PRNGKey(1), spec)
  np.testing.assert_allclose(score(params, q, m, variant), m @ q, rtol=1e-6, atol=1e-6)
  bias = jnp.arange(7.0) / 10
  params = params | {"rank_bias": bias}
  np.testing.assert_allclose(score(params, q, m, variant), m @ q + bias, rtol=1e-5,
                             atol=1e-5)
  with pytest.raises(ValueError, match="6 candidates, but the rank prior was trained for k=7"):
    score(params, q, m[:6], variant)


def test_fast_low_rank_gradients_with_rank_prior_equal_autodiff_of_the_naive_formula():
  kq, km, kg = jax.random.split(jax.random.PRNGKey(4), 3)
  q_BxD, mem_BxKxD = jax.random.normal(kq, (3, 8)), jax.random.normal(km, (3, 5, 8))
  g_BxK = jax.random.normal(kg, (3, 5))
  spec = core.CoreSpec(dim=8, k=5, m=2, rank_prior=True)
  params = jax.tree.map(lambda x: x + 0.1, init_params(jax.random.PRNGKey(0), spec))
  naive = jax.grad(lambda p: jnp.sum(g_BxK * jax.vmap(score_naive, in_axes=(None, 0, 0))(
      p, q_BxD, mem_BxKxD)))(params)
  fast = linear_grad_factors(params, q_BxD, mem_BxKxD, g_BxK)
  for name in ("wq", "wm"):
    np.testing.assert_allclose(fast[name].dense(), naive[name], rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(fast["rank_bias"], naive["rank_bias"], rtol=1e-5, atol=1e-6)


def test_the_core_step_takes_the_models_low_rank_pullback_and_autodiff_elsewhere():
  kq, km, kg = jax.random.split(jax.random.PRNGKey(5), 3)
  batch = core.Batch(q_BxD=jax.random.normal(kq, (3, 8)),
                     mem_BxKxD=jax.random.normal(km, (3, 5, 8)), mask_BxK=jnp.ones((3, 5), bool))
  g_BxK = jax.random.normal(kg, (3, 5))
  fast = core.CoreSpec(dim=8, k=5, m=2, model=EMBEDDING)
  params = jax.tree.map(lambda x: x + 0.1, init_params(jax.random.PRNGKey(0), fast))
  _, pull_fast = core.scores_and_pullback(params, batch, fast)
  naive = dataclasses.replace(fast, formulation="naive")
  scores, pull_naive = core.scores_and_pullback(params, batch, naive)
  np.testing.assert_allclose(scores, core.scores(params, batch, fast), rtol=1e-5, atol=1e-5)
  assert isinstance(pull_fast(g_BxK)["wq"], core.LowRank)
  for name in ("wq", "wm"):
    np.testing.assert_allclose(pull_fast(g_BxK)[name].dense(), pull_naive(g_BxK)[name],
                               rtol=1e-4, atol=1e-4)


def test_a_spec_without_a_model_is_refused_in_one_line():
  with pytest.raises(ValueError, match="variant='linear': the spec has no scoring model"):
    core.init_state(core.CoreSpec(dim=8, k=5, m=2), core.HParams.create())


@pytest.mark.parametrize("variant", ["linear", "mlp"])
def test_a_rank_prior_started_at_a_scale_ranks_as_the_candidates_came(variant):
  """A fresh reranker scores by its embeddings' dot products; with the rank prior started at a
  scale above their spread it keeps the base order instead, and at scale 0 it adds nothing."""
  key_q, key_m = jax.random.split(jax.random.PRNGKey(3))
  q_D = jax.random.normal(key_q, (16,))
  m_KxD = jax.random.normal(key_m, (10, 16))
  spec = core.CoreSpec(variant=variant, dim=16, k=10, m=3, rank_prior=True)
  flat = init_params(jax.random.PRNGKey(0), spec)
  np.testing.assert_allclose(score(flat, q_D, m_KxD, variant), m_KxD @ q_D, rtol=1e-5, atol=1e-5)
  spread = float(jnp.ptp(m_KxD @ q_D))
  # the smallest gap of -s log(1 + position) is between the last two positions: s log(10 / 9)
  scale = 2 * spread / np.log(10 / 9)
  started = init_params(jax.random.PRNGKey(0), dataclasses.replace(spec, prior_scale=scale))
  np.testing.assert_array_equal(np.argsort(-score(started, q_D, m_KxD, variant)), np.arange(10))
  np.testing.assert_allclose(started["rank_bias"], -scale * np.log1p(np.arange(10)), rtol=1e-6)
