"""Replay of LoCoMo: padded streams, prequential evaluation, resumable online training, the
locomo training config end to end, and evaluation through a trained reranker.

Most tests embed with a hashed bag of words (`HashEncoder`) so they run in seconds; the encoder
itself is tested against sentence-transformers in test_encode.py, and one test here drives
REINFORCE through the real MiniLM encoder.
"""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import synthetic_locomo
from hash_encoder import HashEncoder
from rmmjax import core
from rmmjax.learners.embedding.model import EMBEDDING, score
from rmmjax.config import apply_overrides, get_config
from rmmjax.core import replay as core_replay
from rmmjax.data.locomo import load_locomo
from rmmjax.eval.retrieval import evaluate_retrieval
from rmmjax.replay.candidates import (base_recall, build_replay, to_questions, to_sequence,
                                     to_streams)
from rmmjax.retrieve.units import build_units
from rmmjax.train.loop import train


@pytest.fixture
def two_conversations(three):
  conversations, _ = load_locomo(three)
  return conversations[:2]


def _subset_file(source, tmp_path, n):
  data = json.loads(source.read_text())
  path = tmp_path / f"locomo_first{n}.json"
  path.write_text(json.dumps(data[:n]))
  return path


def test_streams_hold_every_question_once_and_pad_with_absent_ones(two_conversations):
  replays = build_replay(two_conversations, "turn", "bm25", HashEncoder(), k=20)
  counts = [len(c.questions) for c in two_conversations]
  assert [len(r.questions) for r in replays] == counts
  streams = to_streams(replays, batch=4)
  steps = max(-(-n // 4) for n in counts)
  assert streams.mask_BxK.shape == (2, steps, 4, 20)
  present = np.asarray(streams.mask_BxK).any(-1).reshape(2, -1)
  assert present.sum(1).tolist() == counts and not present[0, counts[0]:].any()
  assert not (np.asarray(streams.relevant_BxK) & ~np.asarray(streams.mask_BxK)).any()
  found = np.asarray(streams.relevant_BxK).sum(-1)
  assert (found <= np.asarray(streams.num_relevant_B)).all()
  seq = to_sequence(replays, batch=4)
  assert np.asarray(seq.mask_BxK).any(-1).sum() == sum(counts)
  assert to_questions(replays).q_BxD.shape == (sum(counts), 32)


def test_a_candidate_turn_is_read_followed_by_the_turn_before_it_in_its_session(locomo_path):
  """cross.previous_turn's texts, against the real file's sessions: a turn, then the one
  before it; a session's first turn alone (the previous session's last is another day)."""
  conv = load_locomo(locomo_path)[0][0]
  (replay,) = build_replay([conv], "turn", "bm25", HashEncoder(), k=20)
  where = {t.turn_id: (s, i) for s in conv.sessions for i, t in enumerate(s.turns)}
  plain, read = replay.candidate_texts(), replay.candidate_texts(previous_turn=True)
  firsts = 0
  for n, row in enumerate(replay.order_NxR[:, :20]):
    for j, u in enumerate(row):
      session, i = where[replay.unit_turns[u][0]]
      turn = session.turns[i]
      assert plain[n][j].startswith(f"[{session.date}] {turn.speaker}: {turn.text}")
      if i == 0:
        firsts += 1
        assert read[n][j] == plain[n][j]
        continue
      before = session.turns[i - 1]
      caption = f" [shares an image: {before.caption}]" if before.caption else ""
      assert read[n][j] == f"{plain[n][j]} (after {before.speaker}: {before.text}{caption})"
  assert 0 < firsts < replay.order_NxR[:, :20].size


def test_identity_reranker_replays_the_dense_base_order(two_conversations):
  """Without a rank prior the fresh reranker scores by the same dot product as the dense base
  retriever, so its top-M recall equals the base order's, computed independently."""
  replays = build_replay(two_conversations, "turn", "dense", HashEncoder(), k=20)
  spec = core.CoreSpec(model=EMBEDDING, dim=32, k=20, m=5, batch=4)
  state = core.init_state(spec, core.HParams.create())
  out = jax.vmap(core_replay.prequential, in_axes=(None, 0, None))(
      state, to_streams(replays, 4), False)
  for recall_SxB, conv in zip(np.asarray(out["recall_SxB"]), replays):
    np.testing.assert_allclose(recall_SxB.reshape(-1)[:len(conv.questions)],
                               base_recall(conv, 5), atol=1e-6)


def test_online_replay_resumes_exactly_and_prequential_scores_before_learning(
    two_conversations):
  replays = build_replay(two_conversations, "turn", "bm25", HashEncoder(), k=20)
  spec = core.CoreSpec(model=EMBEDDING, dim=32, k=20, m=5, batch=4, rank_prior=True)
  state = core.init_state(spec, core.HParams.create(lr=1e-2))
  seq = to_sequence(replays, 4)
  advance = jax.jit(core_replay.replay_steps, static_argnums=2)
  whole, metrics = advance(state, seq, 8)
  half, first = advance(state, seq, 4)
  split, second = advance(half, seq, 4)
  for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(split.params)):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(metrics["reward"], np.concatenate([first["reward"],
                                                                   second["reward"]]))
  assert np.abs(np.asarray(whole.params["wq"])).max() > 0  # it did learn
  stream = jax.tree.map(lambda x: x[0], to_streams(replays, 4))
  frozen = core_replay.prequential(whole, stream, False)["scores_SxBxK"]
  learning = core_replay.prequential(whole, stream, True)["scores_SxBxK"]
  np.testing.assert_array_equal(frozen[0], learning[0])  # the first batch: nothing learnt yet
  assert not np.allclose(frozen[-1], learning[-1])


def test_pretraining_fits_the_labelled_questions(two_conversations):
  replays = build_replay(two_conversations, "turn", "bm25", HashEncoder(), k=20)
  spec = core.CoreSpec(model=EMBEDDING, dim=32, k=20, m=5, batch=4, rank_prior=True)
  state = core.init_state(spec, core.HParams.create(lr=3e-3, tau=0.1))
  questions = to_questions(replays)
  trained, loss = jax.jit(core_replay.pretrain, static_argnums=2)(state, questions, 5)
  per_epoch = np.asarray(loss).reshape(5, -1).mean(1)
  assert per_epoch[-1] < 0.9 * per_epoch[0], per_epoch
  before, _ = core_replay.rerank_recall(state.params, questions, spec)
  after, _ = core_replay.rerank_recall(trained.params, questions, spec)
  assert float(jnp.mean(after)) > float(jnp.mean(before)) + 0.05


def test_train_locomo_config_then_eval_through_the_trained_reranker(tmp_path):
  # 112 turns a conversation: a word budget reaches past the first 100 units.
  data = synthetic_locomo.write(tmp_path / "three.json", 3, sessions=8)
  cfg = apply_overrides(get_config("locomo"), ["learner=linear", "retriever=bm25",
      f"data={data}", "dim=32", "steps=40", "checkpoint_every=20", "holdout=1",
      "pretrain_epochs=2"]).validate()
  wd = tmp_path / "run"
  summary = train(cfg, wd, progress=False, encoder=HashEncoder())
  for name in ("summary.json", "curves.png", "metrics.jsonl", "pretrain.json", "config.json"):
    assert (wd / name).exists(), name
  assert summary["heldout_conversations"] == ["syn-3"]
  assert 0.0 <= summary["recall_at_m_base"] <= summary["recall_at_k"] <= 1.0
  assert summary["pretrain_loss_last"] < summary["pretrain_loss_first"]
  # The same held-out recall through the evaluation path (ranked lists and question metrics).
  report = evaluate_retrieval("locomo", data, "turn", "bm25", (5,), encoder=HashEncoder(),
                              reranker=wd)
  assert report["config"]["conversations"] == ["syn-3"]
  np.testing.assert_allclose(report["metrics"]["overall"]["recall_all@5"],
                             summary["recall_at_m_final"], atol=1e-6)
  # Beside it, the order it reranks and the ceiling of its K candidates: the training run's, and
  # the base order's every metric as the evaluation without a reranker computes them.
  np.testing.assert_allclose(report["base_order"]["overall"]["recall_all@5"],
                             summary["recall_at_m_base"], atol=1e-6)
  np.testing.assert_allclose(report["ceiling"]["overall"]["ceiling"],
                             summary["recall_at_k"], atol=1e-6)
  # The ceiling's every metric, of the best order of the same K: above the reranker's and the
  # base order's, and finding no more than all K hold.
  best = report["ceiling"]["overall"]
  assert best["recall_all@5"] <= best["ceiling"] + 1e-9
  for name in ("recall_all@5", "recall_any@5", "ndcg@10", "mrr"):
    assert max(report["metrics"]["overall"][name],
               report["base_order"]["overall"][name]) <= best[name] + 1e-9, name
  assert best["mrr"] > report["base_order"]["overall"]["mrr"]
  held = tmp_path / "held.json"
  held.write_text(json.dumps([c for c in json.loads(data.read_text())
                              if c["sample_id"] == "syn-3"]))
  alone = evaluate_retrieval("locomo", held, "turn", "bm25", (5,), encoder=HashEncoder())
  assert report["base_order"] == alone["metrics"]
  online = evaluate_retrieval("locomo", data, "turn", "bm25", (5,), encoder=HashEncoder(),
                              reranker=wd, online=True)
  np.testing.assert_allclose(online["metrics"]["overall"]["recall_all@5"],
                             summary["recall_at_m_prequential"], atol=1e-6)
  # A word budget takes reranked units past the first 100: everything fits in a huge budget.
  budget = evaluate_retrieval("locomo", data, "turn", "bm25", (5,), budget_words=10**6,
                              encoder=HashEncoder(), reranker=wd)["metrics"]["overall"]
  assert budget["recall_all@budget"] == 1.0
  small = evaluate_retrieval("locomo", data, "turn", "bm25", (5,), budget_words=60,
                             encoder=HashEncoder(), reranker=wd)["metrics"]["overall"]
  assert small["words@budget"] <= 60 and 0 < small["recall_all@budget"] < 1
  # The exported weights score like the trained reranker, rank prior included, without JAX.
  from rmmjax.io.trained import load_trained_params
  from rmmjax.learners.embedding.export import export_reranker
  from rmmjax.learners.embedding.serving import NumpyReranker
  meta = export_reranker(wd, tmp_path / "reranker.safetensors")
  assert "rank_bias" in meta["score"] and meta["hparams"]["lr"] == cfg.learning.lr
  scorer = NumpyReranker.load(tmp_path / "reranker.safetensors")
  params, _, _ = load_trained_params(wd, dataclasses.replace(cfg.core_spec(), model=EMBEDDING))
  rng = np.random.default_rng(0)
  q, m = rng.standard_normal(32).astype(np.float32), rng.standard_normal((20, 32)).astype(
      np.float32)
  np.testing.assert_allclose(scorer.score(q, m), score(params, q, m), rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match="21 candidates, but the rank prior was trained for k=20"):
    scorer.score(q, np.concatenate([m, m[:1]]))
  # Fewer candidates score as the first ones of a padded list do in training.
  padded = np.concatenate([m[:7], np.zeros((13, 32), np.float32)])
  np.testing.assert_allclose(scorer.score(q, m[:7]), score(params, q, padded)[:7],
                             rtol=1e-4, atol=1e-4)
  # Resuming with more steps continues from the last checkpoint.
  more = train(apply_overrides(cfg, ["steps=60"]), wd, progress=False, encoder=HashEncoder())
  assert more["steps"] == 60
  assert len((wd / "metrics.jsonl").read_text().splitlines()) == 6


def test_locomo_config_refuses_missing_or_absent_data(tmp_path):
  with pytest.raises(ValueError, match="pass --set data=PATH"):
    get_config("locomo").validate()
  with pytest.raises(ValueError, match="no such file"):
    apply_overrides(get_config("locomo"), [f"data={tmp_path / 'nope.json'}"]).validate()
  with pytest.raises(ValueError, match="is a directory; expected a LoCoMo JSON file"):
    apply_overrides(get_config("locomo"), [f"data={tmp_path}"]).validate()
  with pytest.raises(ValueError, match="retriever='tfidf' is not one of bm25, dense, hybrid"):
    apply_overrides(get_config("locomo"), [f"data={tmp_path}", "retriever=tfidf"]).validate()


def test_query_encoder_pretraining_and_reinforce(three, tmp_path, tiny_encoder):
  """Supervised steps and REINFORCE through a BERT (a tiny one: the logic is the point): the
  query encoder moves, the memories' embeddings do not, and with the untouched encoder the
  retrieval path reproduces the base retriever's recall."""
  from rmmjax.encode.encoder import SentenceEncoder
  from rmmjax.encode.tuned import TunedQueryEncoder
  from rmmjax.learners.query_encoder.fit import (pretrain_query_encoder, retrieval_recall, train_query_encoder)
  encoder = SentenceEncoder()
  conversations, _ = load_locomo(_subset_file(three, tmp_path, 1))
  conv = conversations[0]
  short = conv.__class__(conv.conversation_id, conv.sessions[:3], tuple(
      q for q in conv.questions if all(e.split(":")[0] in ("D1", "D2", "D3") for e in q.evidence)
  )[:8])
  replay = build_replay([short], "turn", "dense", encoder, k=10)[0]
  np.testing.assert_allclose(retrieval_recall(short, "turn", "dense", encoder, None, 3),
                             base_recall(replay, 3), atol=1e-6)
  spec = core.CoreSpec(dim=encoder.dim, k=10, m=3, batch=4)
  pretrained, losses = pretrain_query_encoder(encoder, [replay], spec,
                                              core.HParams.create(lr=1e-4, tau=0.05), epochs=3)
  assert losses.shape == (6,) and losses[-2:].mean() < losses[:2].mean()
  params, metrics = train_query_encoder(encoder, [replay], spec,
                                        core.HParams.create(lr=1e-3, tau=0.5), epochs=1,
                                        params=pretrained)
  assert np.isfinite(metrics["loss"]).all() and len(metrics["loss"]) == 2
  moved = [float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(params),
                                                      jax.tree.leaves(pretrained))]
  assert max(moved) > 0
  q_before = encoder.encode(list(replay.questions))
  q_after = TunedQueryEncoder(encoder, params).encode(list(replay.questions))
  assert not np.allclose(q_before, q_after, atol=1e-4)
  # Retrieval with the tuned queries searches the bank's original embeddings.
  units = build_units(short, "turn")
  top = np.argsort(-(q_after @ encoder.encode([u.text for u in units]).T), 1, kind="stable")[:, :3]
  relevant = np.array([[bool(set(u.turn_ids) & set(q.evidence)) for u in units]
                       for q in short.questions])
  want = np.take_along_axis(relevant, top, 1).sum(1) / replay.num_relevant_N
  np.testing.assert_allclose(retrieval_recall(short, "turn", "dense", encoder,
                                              TunedQueryEncoder(encoder, params), 3), want,
                             atol=1e-6)


def test_sweep_refuses_a_replay_config(tmp_path):
  from rmmjax.train.sweep.latent import sweep
  cfg = apply_overrides(get_config("locomo"), [f"data={tmp_path}"])
  with pytest.raises(ValueError, match="sweep runs the latent simulator, not config locomo"):
    sweep(cfg, {}, 1, tmp_path / "sweep")


def test_train_locomo_on_a_malformed_file_fails_naming_it_and_writes_nothing(tmp_path, capsys):
  from rmmjax.cli import main
  bad = tmp_path / "bad.json"
  bad.write_text('[{"sample_id": "x"}]')
  wd = tmp_path / "run"
  assert main(["train", "--config", "locomo", "--set", f"data={bad}", "--workdir", str(wd),
               "--quiet"]) == 2
  assert f"{bad}: record 0 (x): missing field 'conversation'" in capsys.readouterr().err
  assert not wd.exists()


def test_holdout_zero_trains_on_every_conversation(three, tmp_path):
  data = _subset_file(three, tmp_path, 2)
  cfg = apply_overrides(get_config("locomo"), [
      "learner=linear", "retriever=bm25", f"data={data}", "dim=32", "steps=20",
      "checkpoint_every=10", "holdout=0", "pretrain_epochs=1"]).validate()
  summary = train(cfg, tmp_path / "run", progress=False, encoder=HashEncoder())
  assert summary["trained_conversations"] == ["syn-1", "syn-2"]
  assert summary["heldout_conversations"] == [] and "recall_at_m_final" not in summary
  record = json.loads((tmp_path / "run" / "record.json").read_text())
  assert [c["id"] for c in record["trained_conversations"]] == ["syn-1", "syn-2"]


@pytest.mark.parametrize("batch", [500, 100_000])
def test_a_batch_the_training_questions_cannot_fill_is_refused_before_anything_is_written(
    three, tmp_path, capsys, batch):
  """(100,000 was not refused: its padded streams ran the process out of memory; 2,000 on the
  dev file was refused only after config.json was written, which then refused the valid rerun.)"""
  from rmmjax.cli import main
  wd = tmp_path / "run"
  sets = ["--set", f"data={three}", "--set", "learner=linear", "--set", f"batch={batch}"]
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet", *sets]) == 2
  assert (f"batch={batch}: the 50 training questions cannot fill one batch; expected "
          "batch <= 50") in capsys.readouterr().err
  assert not wd.exists()
