"""The cross reranker in the core: the base order at initialisation, pairs packed several to a
row scoring as each alone in a row of its own, gradients that match finite differences, one
compile for every batch of a shape, bfloat16 computation over float32 state, and the core's
losses and steps unchanged over it."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rmmjax import core
from rmmjax.config import get_config, with_values
from rmmjax.learners.cross.spec import cross_spec
from rmmjax.learners.cross import (CrossModel, cross_params_template, cross_scores,
                                   init_cross_params)
from rmmjax.learners.cross.pairs import pack

SEP_ID = 102
TINY = core.BertConfig(vocab_size=128, hidden_size=16, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=32, max_position_embeddings=24,
                       type_vocab_size=2, layer_norm_eps=1e-12)
B, K, L = 3, 5, 12


# Compiled once each: run op by op, the tiny model's init and scoring spend tens of seconds
# compiling hundreds of single operations.
_init = jax.jit(core.bert.BertCrossEncoder(TINY).init)
_scores = jax.jit(cross_scores, static_argnames=("cfg", "dtype"))
_batch_scores = jax.jit(core.scores, static_argnames="spec")


def _encoder_params(seed=0):
  ids = jnp.zeros((1, L), jnp.int32)
  params = _init(jax.random.PRNGKey(seed), ids, ids, ids, ids, ids[:, :1])["params"]
  return {name: value for name, value in params.items() if name != "classifier"}


def _pairs(seed=0, b=B, k=K, length=L):
  """Random pairs "[CLS] q [SEP] m [SEP]" of varied lengths, 0-padded, one candidate missing,
  with their segments (1 the question's side, 2 the memory's, 0 padding)."""
  rng = np.random.default_rng(seed)
  ids = np.zeros((b, k, length), np.int32)
  segments = np.zeros((b, k, length), np.int8)
  for i in range(b):
    for j in range(k):
      q, m = rng.integers(1, 4), rng.integers(0, length - 6)  # an empty memory text included
      row = [101, *rng.integers(1, 100, q), SEP_ID, *rng.integers(1, 100, m), SEP_ID]
      ids[i, j, :len(row)] = row
      segments[i, j, :len(row)] = [1] * (q + 2) + [2] * (m + 1)
  ids[0, -1], segments[0, -1] = 0, 0  # a missing candidate
  return ids, segments


def _packed(seed=0, **kw):
  """The pairs of `_pairs`, packed several to a row."""
  return pack(*_pairs(seed, **kw), 2 * L)[0]


def _spec(**kw):
  return core.CoreSpec(variant="cross", dim=16, k=K, m=2, batch=B, model=CrossModel(TINY, **kw))


def _batch(seed=0):
  tokens, segments = _pairs(seed)
  rng = np.random.default_rng(seed + 1)
  cand = segments.any(-1)
  relevant = (rng.random((B, K)) < 0.4) & cand
  relevant[:, 0] |= True
  return core.Batch(q_BxD=jnp.zeros((B, 16)), mem_BxKxD=jnp.zeros((B, K, 16)),
                    mask_BxK=jnp.asarray(cand), relevant_BxK=jnp.asarray(relevant),
                    num_relevant_B=jnp.asarray(relevant.sum(1), jnp.int32),
                    inputs=pack(tokens, segments, 2 * L)[0])


def test_a_fresh_cross_reranker_keeps_the_base_order():
  params = init_cross_params(_encoder_params(), K, prior_scale=1.0)
  scores = _scores(params, _packed(), TINY)
  want = -np.log1p(np.arange(K))
  np.testing.assert_array_equal(np.asarray(scores), np.broadcast_to(want, (B, K)).astype(
      np.float32))
  batch = _batch()
  top = jax.vmap(core.top_m, in_axes=(0, None, 0))(scores, 2, batch.mask_BxK)
  np.testing.assert_array_equal(np.asarray(top), np.tile([0, 1], (B, 1)))


def test_positions_pick_the_rank_prior_of_the_base_order():
  params = init_cross_params(_encoder_params(), 8, prior_scale=2.0)
  positions = jnp.asarray(np.tile([0, 2, 3, 6, 7], (B, 1)), jnp.int32)
  scores = _scores(params, _packed(), TINY, positions_BxK=positions)
  np.testing.assert_allclose(np.asarray(scores[0]), -2.0 * np.log1p([0, 2, 3, 6, 7]), rtol=1e-6)
  # Without positions, the candidates are the base order's first (fewer than it trained on:
  # a cascade's cut), never more.
  np.testing.assert_allclose(np.asarray(_scores(params, _packed(), TINY)[0]),
                             -2.0 * np.log1p(np.arange(5)), rtol=1e-6)
  with pytest.raises(ValueError, match="5 candidates, but the rank prior was trained for k=4"):
    _scores(init_cross_params(_encoder_params(), 4, prior_scale=2.0), _packed(), TINY)


def test_packed_pairs_score_as_each_alone_in_a_row_of_its_own():
  params = init_cross_params(_encoder_params(2), K, prior_scale=1.0)
  params["encoder"]["classifier"]["kernel"] = jnp.asarray(
      np.random.default_rng(0).normal(0, 0.5, (16, 1)), jnp.float32)
  ids, segments = _pairs(4, b=6)
  alone, real_alone = pack(ids, segments, L, slots=1)  # one pair a row: nothing shared
  packed, real = pack(ids, segments, 2 * L)
  assert packed.ids_RxL.shape[0] < alone.ids_RxL.shape[0] and real > real_alone
  present = segments.any(-1)
  # (at full float32: an accelerator's default matmul rounds each layout its own way)
  with jax.default_matmul_precision("highest"):
    a, b = (np.asarray(_scores(params, p, TINY)) for p in (alone, packed))
  np.testing.assert_allclose(b[present], a[present], atol=1e-5)
  # Every token of a pair sits in one row, in order, at its own positions 0..n-1.
  lengths = (segments > 0).sum(-1)
  for (n, k), where in np.ndenumerate(packed.where_BxK):
    if not present[n, k]:
      continue
    row, slot = divmod(int(where), packed.cls_RxC.shape[1])
    start = packed.cls_RxC[row, slot]
    np.testing.assert_array_equal(packed.ids_RxL[row, start:start + lengths[n, k]],
                                  ids[n, k, :lengths[n, k]])
    np.testing.assert_array_equal(packed.positions_RxL[row, start:start + lengths[n, k]],
                                  np.arange(lengths[n, k]))
    assert (packed.slots_RxL[row] == slot + 1).sum() == lengths[n, k]


@pytest.mark.parametrize("backend, most_shapes, least_real", [("cpu", 5, 0.85), ("gpu", 3, 0.7)])
def test_packing_takes_a_few_row_counts_and_most_positions(backend, most_shapes, least_real,
                                                          monkeypatch):
  # (an accelerator takes fewer row counts, each compiled, for more empty rows)
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  rng = np.random.default_rng(0)
  shapes, reals = set(), []
  for _ in range(200):
    lengths = np.clip(rng.normal(62, 22, (4, 20)), 12, 128).astype(int)  # LoCoMo's spread
    segments = (np.arange(128)[None, None, :] < lengths[..., None]).astype(np.int8)
    packed, real = pack(segments.astype(np.int32), segments, 128)
    shapes.add(packed.ids_RxL.shape)
    reals.append(real)
  assert len(shapes) <= most_shapes, shapes
  assert np.mean(reals) >= least_real, np.mean(reals)


def test_listwise_gradient_matches_finite_differences_in_float64():
  # The whole model in float64 (parameters and computation), so central differences with a
  # small step agree with the autodiff gradient to many digits; the loss is written out here.
  # (Flax's layer norm promotes float64 against float32 internally: standard promotion.)
  with jax.enable_x64(True), jax.numpy_dtype_promotion("standard"):
    params = init_cross_params(_encoder_params(1), K, prior_scale=1.0)
    rng = np.random.default_rng(0)
    params["encoder"]["classifier"]["kernel"] = jnp.asarray(rng.normal(0, 0.5, (16, 1)))
    params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), params)
    batch = _batch(2)
    mask = np.asarray(batch.mask_BxK)
    labels = np.asarray(batch.relevant_BxK, np.float64)
    labels /= labels.sum(1, keepdims=True)

    def loss(p):
      scores = cross_scores(p, batch.inputs, TINY, dtype="float64")
      assert scores.dtype == jnp.float64
      logp = jax.nn.log_softmax(jnp.where(mask, scores, -1e30), axis=-1)
      return -jnp.sum(jnp.where(mask, labels * logp, 0.0)) / B

    grads = jax.jit(jax.grad(loss))(params)
    loss = jax.jit(loss)  # one compile for every probe
    probes = [("encoder", "classifier", "kernel", (3, 0)),
              ("encoder", "pooler", "kernel", (2, 5)),
              ("encoder", "layer_0", "query", "kernel", (4, 7)),
              ("encoder", "layer_1", "query", "kernel", (4, 7)),  # the [CLS]-only last layer
              ("encoder", "layer_1", "value", "kernel", (1, 3)),
              ("encoder", "token_type", "embedding", (1, 2)),  # the memory's segment
              ("rank_bias", (2,))]
    eps = 1e-6
    for *path, index in probes:
      def at(p, delta, path=path, index=index):
        p = jax.tree.map(lambda x: x, p)
        node = p
        for name in path[:-1]:
          node = node[name]
        node[path[-1]] = node[path[-1]].at[index].add(delta)
        return float(loss(p))
      numeric = (at(params, eps) - at(params, -eps)) / (2 * eps)
      g = grads
      for name in path:
        g = g[name]
      assert abs(float(g[index])) > 1e-6, path  # a coordinate the loss depends on
      assert float(g[index]) == pytest.approx(numeric, rel=1e-6, abs=1e-10), path


def test_one_compile_serves_every_batch_of_a_packed_shape(caplog):
  spec = _spec()
  state = core.init_state(spec, core.HParams.create(lr=1e-3, tau=1.0),
                          init_cross_params(_encoder_params(), K, 1.0))
  step = jax.jit(core.supervised_step)
  train = jax.jit(core.train_step)
  batches = [_batch(seed) for seed in range(6)]
  shapes = {b.inputs.ids_RxL.shape for b in batches}
  assert 1 <= len(shapes) <= 2  # row counts are rounded to a few
  with jax.log_compiles(True), caplog.at_level(logging.WARNING):
    for seed, batch in enumerate(batches):
      state, _ = step(state, batch)
      state, _ = train(state, batch, jax.random.PRNGKey(seed))
  compiles = [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()
              and ("supervised_step" in r.getMessage() or "train_step" in r.getMessage())]
  assert len(compiles) == 2 * len(shapes), len(compiles)
  # The head learned; its bias, which no ranking sees, stayed where it started.
  assert float(jnp.abs(state.params["encoder"]["classifier"]["kernel"]).max()) > 0
  assert float(jnp.abs(state.params["encoder"]["classifier"]["bias"]).max()) == 0.0


def test_bfloat16_computes_in_bfloat16_and_keeps_float32_state():
  params = init_cross_params(_encoder_params(), K, 1.0)
  params["encoder"]["classifier"]["kernel"] = jnp.full((16, 1), 0.3, jnp.float32)
  batch = _batch()
  full = _batch_scores(params, batch, _spec())
  half = _batch_scores(params, batch, _spec(compute_dtype="bfloat16"))
  assert half.dtype == jnp.float32
  assert not np.array_equal(np.asarray(full), np.asarray(half))  # really computed otherwise
  np.testing.assert_allclose(np.asarray(half), np.asarray(full), atol=0.1)
  state = core.init_state(_spec(compute_dtype="bfloat16"), core.HParams.create(lr=1e-3),
                          params)
  state, metrics = jax.jit(core.supervised_step)(state, batch)
  assert np.isfinite(float(metrics["loss"]))
  dtypes = {x.dtype for x in jax.tree.leaves((state.params, state.opt_state))
            if jnp.issubdtype(x.dtype, jnp.floating)}
  assert dtypes == {jnp.dtype(jnp.float32)}


@pytest.mark.parametrize("dtype,atol", [("float64", 1e-12), ("float32", 2e-6),
                                          ("bfloat16", 2e-2)])
def test_attention_matches_the_naive_formula_in_every_dtype(dtype, atol):
  """The layer's attention (jax.nn.dot_product_attention below float64) against softmax(q k^T /
  sqrt(d) + bias) v computed in NumPy float64, with keys shut out by the bias."""
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(2, 6, 3, 8)) for _ in range(3))
  bias = np.where(rng.random((2, 1, 6, 6)) < 0.7, 0.0, -1e9)
  bias[..., 0] = 0.0  # every query admits at least one key
  logits = np.einsum("btnd,bsnd->bnts", q, k) / np.sqrt(8) + bias
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  expected = np.einsum("bnts,bsnd->btnd", probs / probs.sum(-1, keepdims=True), v)
  with jax.enable_x64(dtype == "float64"):
    cast = lambda x: jnp.asarray(x, dtype)  # noqa: E731
    got = jax.jit(core.bert._attention)(cast(q), cast(k), cast(v), cast(bias))
    assert got.dtype == jnp.dtype(dtype)
    np.testing.assert_allclose(np.asarray(got, np.float64), expected, atol=atol)


def test_a_cross_spec_is_refused_where_it_cannot_score():
  with pytest.raises(ValueError, match="its parameters come from its learner"):
    core.init_state(_spec(), core.HParams.create())


def test_template_has_the_structure_of_the_initial_parameters():
  params = init_cross_params(_encoder_params(), K, 1.0)
  template = cross_params_template(TINY, K)
  assert jax.tree.structure(params) == jax.tree.structure(template)
  assert [x.shape for x in jax.tree.leaves(params)] == [x.shape for x in
                                                         jax.tree.leaves(template)]


def test_auto_computes_in_bfloat16_on_an_accelerator_and_float32_on_a_cpu(monkeypatch):
  cfg = dataclasses.replace(get_config("locomo"), learner="cross")
  assert cfg.cross.compute_dtype == "auto"
  here = "float32" if jax.default_backend() == "cpu" else "bfloat16"
  assert cross_spec(cfg, TINY).model.compute_dtype == here
  # (The backend's name is what `auto` reads.)
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert cross_spec(cfg, TINY).model.compute_dtype == "bfloat16"
  fixed = with_values(cfg, {"compute_dtype": "float32"})
  assert cross_spec(fixed, TINY).model.compute_dtype == "float32"  # a pinned dtype holds
