"""Train steps, whole runs and sweeps: jit equals no-jit, learning happens, nothing recompiles."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rmmjax import core
from rmmjax.learners.embedding.model import EMBEDDING, batch_scores
from rmmjax.train.sweep.chunks import run_chunks

SPEC = core.CoreSpec(model=EMBEDDING, dim=16, k=8, m=3, batch=4)
SIM = core.SimSpec(num_users=8, bank_size=24, min_bank=6, max_relevant=2)


def _state_and_batch(spec=SPEC):
  world = core.make_world(SIM, spec.dim)
  batch = core.sample_batch(world, jax.random.PRNGKey(3), SIM, spec)
  return core.init_state(spec, core.HParams.create()), batch


def test_simulated_batches_are_well_formed():
  world = core.make_world(SIM, SPEC.dim)
  batch = jax.jit(core.sample_batch, static_argnums=(2, 3, 4))(world, jax.random.PRNGKey(0), SIM,
                                                              SPEC, 64)
  assert batch.q_BxD.shape == (256, 16) and batch.mem_BxKxD.shape == (256, 8, 16)
  np.testing.assert_allclose(jnp.linalg.norm(batch.q_BxD, axis=-1), 1.0, rtol=1e-5)
  # Relevant candidates are valid; some banks are smaller than K so some candidates are masked.
  assert not np.asarray(batch.relevant_BxK & ~batch.mask_BxK).any()
  assert (~np.asarray(batch.mask_BxK)).any()
  found = np.asarray(batch.relevant_BxK.sum(-1))
  assert (found <= np.asarray(batch.num_relevant_B)).all() and found.sum() > 0
  # Base order: candidates are sorted by the dot product with the query.
  base = np.einsum("bkd,bd->bk", batch.mem_BxKxD, batch.q_BxD)
  valid = np.asarray(batch.mask_BxK)
  for row, ok in zip(base, valid):
    assert (np.diff(row[ok]) <= 1e-6).all()


@pytest.mark.parametrize("variant,formulation", [("linear", "fast"), ("linear", "naive"),
                                                 ("mlp", "fast")])
def test_train_step_jit_equals_no_jit(variant, formulation):
  spec = core.CoreSpec(model=EMBEDDING, dim=16, k=8, m=3, batch=4, variant=variant,
                       formulation=formulation, hidden=8)
  state, batch = _state_and_batch(spec)
  key = jax.random.PRNGKey(5)
  for _ in range(2):
    eager_state, eager_metrics = core.train_step(state, batch, key)
    jit_state, jit_metrics = jax.jit(core.train_step)(state, batch, key)
    for a, b in zip(jax.tree.leaves(eager_state.params), jax.tree.leaves(jit_state.params)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for name in eager_metrics:
      assert np.isfinite(eager_metrics[name])
      np.testing.assert_allclose(eager_metrics[name], jit_metrics[name], rtol=1e-4, atol=1e-5)
    state = jit_state
  assert int(state.step) == 2


def test_fast_and_naive_formulations_train_identically():
  key = jax.random.PRNGKey(5)
  out = {}
  for formulation in ("fast", "naive"):
    state, batch = _state_and_batch(core.CoreSpec(model=EMBEDDING, dim=16, k=8, m=3, batch=4,
                                                  formulation=formulation))
    for _ in range(3):
      state, metrics = jax.jit(core.train_step)(state, batch, key)
    out[formulation] = (state.params, metrics)
  for a, b in zip(jax.tree.leaves(out["fast"][0]), jax.tree.leaves(out["naive"][0])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(out["fast"][1]["grad_norm"], out["naive"][1]["grad_norm"],
                             rtol=1e-4)


def test_masked_candidates_get_no_gradient_through_the_reranker():
  """A masked candidate's embedding does not influence the update at all."""
  state, batch = _state_and_batch()
  mask = batch.mask_BxK.at[:, -1].set(False)
  batch = batch.replace(mask_BxK=mask)
  poisoned = batch.replace(mem_BxKxD=batch.mem_BxKxD.at[:, -1].set(100.0))
  key = jax.random.PRNGKey(9)
  a, _ = jax.jit(core.train_step)(state, batch, key)
  b, _ = jax.jit(core.train_step)(state, poisoned, key)
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)


def test_supervised_step_lowers_listwise_loss():
  state, batch = _state_and_batch()
  state = state.replace(hparams=state.hparams.replace(lr=jnp.float32(1e-2)))
  step = jax.jit(core.supervised_step)
  _, first = step(state, batch)
  for _ in range(50):
    state, metrics = step(state, batch)
  assert float(metrics["loss"]) < float(first["loss"]) - 0.1


def test_a_short_run_learns_to_rerank():
  """REINFORCE from simulated citations lifts recall@M well above the base retriever's."""
  spec = core.CoreSpec(model=EMBEDDING, dim=32, k=20, m=5, batch=4)
  sim = core.SimSpec(num_users=16, bank_size=64)
  run = jax.jit(core.make_run(spec, sim, steps=3000, eval_sessions=128))
  out = run(core.HParams.create(lr=3e-3), core.make_world(sim, spec.dim))
  base, final = float(out["eval_first"]["recall_at_m_base"]), float(
      out["eval_final"]["recall_at_m"])
  assert float(out["eval_first"]["recall_at_m"]) == pytest.approx(base)  # identity start
  assert final > base + 0.08, (base, final)
  reward = np.asarray(out["metrics"]["reward"])
  assert reward[-300:].mean() > reward[:300].mean()


def test_sweep_compiles_once_for_all_points(caplog):
  sim = core.SimSpec(num_users=4, bank_size=16, min_bank=8, max_relevant=2)
  run_chunk = core.make_sweep(SPEC, sim, steps=5, eval_sessions=2)
  points = [core.HParams.create(tau=t, baseline=b, lr=lr, seed=s)
            for t in (0.2, 1.0) for b in (0.0, 0.5) for lr in (1e-3, 1e-2) for s in (0, 1)]
  hparams = core.stack_hparams(points)
  world = core.make_world(sim, SPEC.dim)
  with jax.log_compiles(True), caplog.at_level(logging.WARNING):
    out = run_chunks(run_chunk, hparams, world, chunk_size=5, devices=jax.devices()[:1])
  compiles = [r for r in caplog.records if "Compiling" in r.getMessage()
              and "run" in r.getMessage()]
  assert len(compiles) == 1, [r.getMessage() for r in compiles]
  assert out["metrics"]["reward"].shape == (16, 5)
  # Different points really ran different configurations.
  assert len({float(x) for x in out["metrics"]["loss"][:, -1]}) > 8


def test_sharded_sweep_equals_single_device(on_four_devices):
  """On 4 (fake CPU) devices the sweep axis is sharded; results equal the one-device run."""
  out = on_four_devices("""
      import jax, numpy as np
      from rmmjax import core
      from rmmjax.learners.embedding.model import EMBEDDING
      from rmmjax.train.sweep.chunks import run_chunks
      assert jax.device_count() == 4
      spec = core.CoreSpec(model=EMBEDDING, dim=16, k=8, m=3, batch=4)
      sim = core.SimSpec(num_users=4, bank_size=16, min_bank=8, max_relevant=2)
      world = core.make_world(sim, spec.dim)
      hp = core.stack_hparams([core.HParams.create(tau=t, seed=s)
                               for t in (0.3, 0.7, 1.0) for s in range(3)])
      run_chunk = core.make_sweep(spec, sim, steps=20, eval_sessions=4)
      sharded = run_chunks(run_chunk, hp, world, chunk_size=8)
      single = run_chunks(run_chunk, hp, world, chunk_size=8, devices=jax.devices()[:1])
      for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(single)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
      print("OK", sharded["metrics"]["reward"].shape)
  """)
  assert "OK (9, 20)" in out


def test_reinforce_update_from_observed_rewards_moves_scores_toward_cited():
  """A generator that always cites candidate 0 of the three shown makes the reranker raise it
  above the two it never cites (per-position credit: each memory its own reward)."""
  state, batch = _state_and_batch(core.CoreSpec(model=EMBEDDING, dim=16, k=8, m=3, batch=4,
                                                credit="position"))
  batch = jax.tree.map(lambda x: jnp.stack([x[0]] * 4), batch)  # one query, four times
  batch = batch.replace(mask_BxK=jnp.ones_like(batch.mask_BxK))
  state = state.replace(hparams=state.hparams.replace(lr=jnp.float32(1e-2)))
  update = jax.jit(core.reinforce_update)
  scores0 = batch_scores(state.params, batch.q_BxD, batch.mem_BxKxD, SPEC)
  selected = jnp.tile(jnp.array([0, 1, 2]), (4, 1))
  rewards = jnp.tile(jnp.array([1.0, -1.0, -1.0]), (4, 1))
  for _ in range(30):
    state, metrics = update(state, batch, selected, rewards)
  scores = batch_scores(state.params, batch.q_BxD, batch.mem_BxKxD, SPEC)
  gain = scores - scores0
  assert (gain[:, 0] > gain[:, 1]).all() and (gain[:, 0] > gain[:, 2]).all(), gain
  assert int(state.step) == 30 and np.isfinite(metrics["loss"])


def test_serving_scores_and_learns_from_a_batch_without_labels():
  """What serving holds (a query, its candidates, their mask) is enough to score and to learn
  from observed rewards: the labels are not read there, so a labelled copy of the same batch
  gives the same update, and recall, which needs them, is not computable."""
  state, labelled = _state_and_batch()
  unlabelled = labelled.replace(relevant_BxK=None, num_relevant_B=None)
  selected = jnp.tile(jnp.array([0, 1, 2]), (4, 1))
  rewards = jnp.tile(jnp.array([1.0, 0.0, 0.0]), (4, 1))
  update = jax.jit(core.reinforce_update)
  with_labels, _ = update(state, labelled, selected, rewards)
  without, _ = update(state, unlabelled, selected, rewards)
  for a, b in zip(jax.tree.leaves(with_labels.params), jax.tree.leaves(without.params)):
    np.testing.assert_array_equal(a, b)
  assert not np.allclose(jax.tree.leaves(without.params)[0], jax.tree.leaves(state.params)[0])
  with pytest.raises((TypeError, AttributeError)):
    core.recall_at_m(selected, unlabelled)


def test_embeddings_entering_the_scorer_are_checked():
  from rmmjax.learners.embedding.serving import check_embeddings
  _, batch = _state_and_batch()
  assert check_embeddings(batch.mem_BxKxD, "mem_BxKxD", 16, 3).dtype == np.float32
  with pytest.raises(ValueError, match=r"mem_BxKxD holds 1 NaN or infinite values"):
    check_embeddings(batch.mem_BxKxD.at[0, 1, 2].set(jnp.inf), "mem_BxKxD", 16, 3)
  with pytest.raises(ValueError, match=r"q_BxD has shape \(4, 16\); expected \(B, D\) with D=32"):
    check_embeddings(batch.q_BxD, "q_BxD", 32, 2)
  with pytest.raises(ValueError, match=r"m_KxD has shape \(4, 8, 16\); expected \(K, D\)"):
    check_embeddings(batch.mem_BxKxD, "m_KxD", 16, 2)


def _with_absent(batch, absent):
  """The batch with the given queries made absent (no candidate)."""
  keep = ~jnp.isin(jnp.arange(batch.mask_BxK.shape[0]), jnp.array(absent))
  return batch.replace(mask_BxK=batch.mask_BxK & keep[:, None],
                       relevant_BxK=batch.relevant_BxK & keep[:, None])


@pytest.mark.parametrize("kind", ["constant", "running", "batch"])
def test_absent_queries_change_nothing(kind):
  """A batch padded with absent queries updates exactly like the batch of its present ones."""
  spec = core.CoreSpec(model=EMBEDDING, dim=16, k=8, m=3, batch=4, rank_prior=True)
  state, batch = _state_and_batch(spec)
  state = state.replace(hparams=state.hparams.replace(
      baseline_kind=jnp.int32(core.BASELINE_KINDS.index(kind))))
  padded = _with_absent(batch, [1, 3])
  present = jax.tree.map(lambda x: x[jnp.array([0, 2])], batch)
  selected = jnp.array([[0, 1, 2], [3, 4, 5], [1, 0, 2], [5, 6, 7]])
  rewards = jnp.array([[1.0, -1, -1], [1, 1, 1], [-1, 1, -1], [1, 1, -1]])
  state = state.replace(reward_mean=jnp.float32(0.2))
  a, ma = core.reinforce_update(state, padded, jnp.where(padded.mask_BxK[:, :1], selected, -1),
                                jnp.where(padded.mask_BxK[:, :1], rewards, 0.0))
  b, mb = core.reinforce_update(state, present, selected[::2], rewards[::2])
  for x, y in zip(jax.tree.leaves((a.params, a.opt_state, a.reward_mean)),
                  jax.tree.leaves((b.params, b.opt_state, b.reward_mean))):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
  for name in ("loss", "reward", "advantage", "log_prob", "grad_norm"):
    np.testing.assert_allclose(ma[name], mb[name], rtol=1e-5, atol=1e-6)


def test_a_batch_of_only_absent_queries_leaves_the_state_unchanged():
  spec = core.CoreSpec(model=EMBEDDING, dim=16, k=8, m=3, batch=4)
  state, batch = _state_and_batch(spec)
  state, _ = core.train_step(state, batch, jax.random.PRNGKey(1))  # non-zero Adam moments
  empty = _with_absent(batch, [0, 1, 2, 3])
  after, metrics = core.train_step(state, empty, jax.random.PRNGKey(2))
  for x, y in zip(jax.tree.leaves((state.params, state.opt_state, state.reward_mean)),
                  jax.tree.leaves((after.params, after.opt_state, after.reward_mean))):
    np.testing.assert_array_equal(x, y)
  assert all(np.isfinite(v) for v in jax.device_get(metrics).values())
  sup, _ = core.supervised_step(state, empty)
  for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(sup.params)):
    np.testing.assert_array_equal(x, y)
