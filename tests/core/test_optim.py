"""Adam over low-rank gradients, against optax's own on dense ones, a NumPy Adam and autodiff."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rmmjax import core
from rmmjax.learners.embedding.model import (EMBEDDING, batch_scores, linear_grad_factors,
                                             score_naive)


@pytest.mark.parametrize("rank", [3, 40])  # unrolled in the update, and summed by a matmul
def test_adam_matches_optax_on_dense_and_low_rank_gradients(rank):
  key = jax.random.PRNGKey(0)
  params = {"a": jax.random.normal(key, (6, 5)), "b": {"c": jnp.ones((5, 4))}}
  tx = optax.adam(3e-3)
  ref_params, ref_state = params, tx.init(params)
  ours_params, ours_state = params, core.adam_init(params)
  for t in range(5):
    ka, kb, kc, kd = jax.random.split(jax.random.fold_in(key, t), 4)
    low = core.LowRank(jax.random.normal(ka, (rank, 6)), jax.random.normal(kb, (rank, 5)))
    low_c = core.LowRank(jax.random.normal(kc, (rank, 5)), jax.random.normal(kd, (rank, 4)))
    dense = {"a": low.left_BxP.T @ low.right_BxQ, "b": {"c": low_c.left_BxP.T @ low_c.right_BxQ}}
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int and float internally
      updates, ref_state = tx.update(dense, ref_state, ref_params)
      ref_params = optax.apply_updates(ref_params, updates)
    grads = {"a": low, "b": {"c": dense["b"]["c"]}}  # mixed: one factored, one dense leaf
    ours_params, ours_state = core.adam_update(ours_params, ours_state, grads, jnp.float32(3e-3))
    np.testing.assert_allclose(core.global_norm(grads), optax.tree.norm(dense), rtol=1e-5)
  for ours, ref in zip(jax.tree.leaves(ours_params), jax.tree.leaves(ref_params)):
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)
  assert int(optax.tree.get(ours_state, "count")) == 5


def test_linear_grad_factors_equal_autodiff():
  kq, km, kg, kw = jax.random.split(jax.random.PRNGKey(2), 4)
  d, b, k = 12, 3, 7
  params = {"wq": 0.3 * jax.random.normal(kw, (d, d)),
            "wm": 0.3 * jax.random.normal(jax.random.fold_in(kw, 1), (d, d))}
  q, mem = jax.random.normal(kq, (b, d)), jax.random.normal(km, (b, k, d))
  g = jax.random.normal(kg, (b, k))
  spec = core.CoreSpec(model=EMBEDDING, dim=d, k=k, m=2, batch=b)
  # The reference is autodiff through the naive formula (all memories transformed).
  want = jax.grad(lambda p: jnp.sum(g * jax.vmap(score_naive, (None, 0, 0))(p, q, mem)))(
      params)
  got = linear_grad_factors(params, q, mem, g)
  for name in ("wq", "wm"):
    np.testing.assert_allclose(got[name].dense(), want[name], rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(batch_scores(params, q, mem, spec),
                             jax.vmap(score_naive, (None, 0, 0))(params, q, mem),
                             rtol=1e-4, atol=1e-4)


def test_an_inactive_adam_step_changes_nothing_and_the_next_matches_optax():
  params = {"a": jnp.linspace(-1.0, 1.0, 12).reshape(3, 4)}
  grads = {"a": jnp.full((3, 4), 0.5)}
  state = core.adam_init(params)
  p1, s1 = core.adam_update(params, state, grads, jnp.float32(1e-2))
  p2, s2 = core.adam_update(p1, s1, {"a": jnp.full((3, 4), 7.0)}, jnp.float32(1e-2),
                            active=jnp.bool_(False))
  for a, b in zip(jax.tree.leaves((p1, s1)), jax.tree.leaves((p2, s2))):
    np.testing.assert_array_equal(a, b)
  # After the skipped step, the next one is optax's second step.
  p3, _ = core.adam_update(p2, s2, grads, jnp.float32(1e-2))
  tx = optax.adam(1e-2)
  ref, ref_state = params, tx.init(params)
  for _ in range(2):
    with jax.numpy_dtype_promotion("standard"):
      updates, ref_state = tx.update(grads, ref_state, ref)
      ref = optax.apply_updates(ref, updates)
  np.testing.assert_allclose(p3["a"], ref["a"], rtol=1e-6, atol=1e-7)


def test_adam_with_a_rate_per_leaf_and_skipped_steps_is_the_formula():
  """Against Adam written out in float64 NumPy: each leaf at its own rate (lr times its
  scale), a low-rank leaf, and a skipped step that changes nothing (not even the count)."""
  rng = np.random.default_rng(0)
  params = {"head": rng.normal(size=(4,)).astype(np.float32),
            "w": rng.normal(size=(5, 3)).astype(np.float32)}
  scales, lr, b1, b2, eps = {"head": 50.0, "w": 1.0}, 1e-3, 0.9, 0.999, 1e-8
  ref = {k: v.astype(np.float64) for k, v in params.items()}
  mu = {k: np.zeros_like(v) for k, v in ref.items()}
  nu = {k: np.zeros_like(v) for k, v in ref.items()}
  ours, state, t = params, core.adam_init(params), 0
  for step in range(6):
    active = step != 2
    left, right = rng.normal(size=(2, 5)), rng.normal(size=(2, 3))
    dense = {"head": rng.normal(size=(4,)), "w": left.T @ right}
    grads = {"head": jnp.float32(dense["head"]), "w": core.LowRank(jnp.float32(left),
                                                                  jnp.float32(right))}
    ours, state = core.adam_update(ours, state, grads, jnp.float32(lr), active=active,
                                   lr_scales=scales)
    if active:
      t += 1
      for k in ref:
        mu[k] = b1 * mu[k] + (1 - b1) * dense[k]
        nu[k] = b2 * nu[k] + (1 - b2) * dense[k] ** 2
        ref[k] = ref[k] - lr * scales[k] * (mu[k] / (1 - b1 ** t)) / (
            np.sqrt(nu[k] / (1 - b2 ** t)) + eps)
  for k in ref:
    np.testing.assert_allclose(ours[k], ref[k], rtol=1e-5, atol=1e-6)
  assert int(optax.tree.get(state, "count")) == t == 5
