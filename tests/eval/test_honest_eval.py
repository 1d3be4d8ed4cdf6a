"""Evaluation never sees what a reranker trained on, and measures what it says it measures.

A reranker trained on a LoCoMo file is evaluated on copies of that file in other places and
formats; every copy must leave the trained conversations out. Recall counts evidence turns in
every path (core, replay summaries, `rmmjax eval`); the prequential evaluation of a training
summary and of `eval --online` is one function; cross-validation never trains on a held-out
conversation; a reranker is refused on data it does not fit.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import synthetic_locomo
from hash_encoder import HashEncoder
from rmmjax import core
from rmmjax.learners.embedding.model import EMBEDDING
from rmmjax.config import apply_overrides, get_config
from rmmjax.core.step import recall_per_query
from rmmjax.data.locomo import load_locomo
from rmmjax.retrieve.metrics import question_metrics
from rmmjax.eval.retrieval import evaluate_retrieval
from rmmjax.learners.embedding.export import export_reranker
from rmmjax.learners.embedding.format import HEADER_KEY, read_reranker
from rmmjax.replay import protocols
from rmmjax.replay.candidates import (base_recall, build_replay, ceiling_recall, evidence_recall,
                                     to_streams)
from rmmjax.replay.protocols import Protocol, cross_validate, heldout_replay
from rmmjax.retrieve.units import build_units
from rmmjax.train.loop import train


def _write_subset(source, path, n, rename=None):
  records = json.loads(source.read_text())[:n]
  if rename:
    for r in records:
      r["sample_id"] = rename + r["sample_id"]
  path.write_text(json.dumps(records))
  return path


@pytest.fixture(scope="module")
def trained(three, tmp_path_factory):
  """A reranker trained on the suite's three conversations, the last held out; it
  learns online fast enough (lr 1e-2, sampling at tau 0.05) that prequential replay changes
  rankings."""
  root = tmp_path_factory.mktemp("trained")
  data = _write_subset(three, root / "three.json", 3)
  cfg = apply_overrides(get_config("locomo"), [
      f"data={data}", "learner=linear", "retriever=bm25", "dim=32", "steps=40",
      "checkpoint_every=20", "holdout=1",
      "pretrain_epochs=2", "lr=0.01", "tau=0.05"]).validate()
  summary = train(cfg, root / "run", progress=False, encoder=HashEncoder())
  return {"root": root, "data": data, "workdir": root / "run", "summary": summary}


def _eval(data, reranker, **kwargs):
  return evaluate_retrieval("locomo", data, "turn", "bm25", (5,), encoder=HashEncoder(),
                            reranker=reranker, **kwargs)


def test_workdir_records_what_it_trained_on(trained):
  record = json.loads((trained["workdir"] / "record.json").read_text())
  assert [c["id"] for c in record["trained_conversations"]] == ["syn-1", "syn-2"]
  assert [c["id"] for c in record["heldout_conversations"]] == ["syn-3"]
  assert record["units"] == "turn" and record["retriever"] == "bm25" and record["k"] == 20
  assert len(record["data_sha256"]) == 64 and os.path.isabs(record["data"])


@pytest.mark.parametrize("variant", ["byte copy elsewhere", "json lines", "superset",
                                     "renamed ids", "relative path"])
def test_every_copy_of_the_training_data_leaves_the_trained_conversations_out(
    trained, tmp_path, monkeypatch, variant):
  if variant == "byte copy elsewhere":
    data = tmp_path / "copy.json"
    shutil.copy(trained["data"], data)
  elif variant == "json lines":
    data = tmp_path / "three.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in json.loads(
        trained["data"].read_text())))
  elif variant == "superset":
    data = synthetic_locomo.write(tmp_path / "four.json", 4)  # the same three and one more
  elif variant == "renamed ids":  # the same turns under other ids are the same conversations
    data = _write_subset(trained["data"], tmp_path / "renamed.json", 3, rename="copy-of-")
  else:
    monkeypatch.chdir(trained["root"])
    data = trained["data"].name
  report = _eval(data, trained["workdir"])
  kept = report["config"]["conversations"]
  assert not {"syn-1", "syn-2", "copy-of-syn-1", "copy-of-syn-2"} & set(kept)
  assert len(report["config"]["excluded_conversations"]) == 2
  if variant != "superset":
    np.testing.assert_allclose(report["metrics"]["overall"]["recall_all@5"],
                               trained["summary"]["recall_at_m_final"], atol=1e-6)


def test_an_export_leaves_them_out_too_and_in_sample_must_be_asked_for(trained, tmp_path):
  out = tmp_path / "reranker.safetensors"
  export_reranker(trained["workdir"], out)
  out.with_suffix(".json").unlink()  # the header alone is enough
  report = _eval(trained["data"], out)
  assert report["config"]["conversations"] == ["syn-3"]
  np.testing.assert_allclose(report["metrics"]["overall"]["recall_all@5"],
                             trained["summary"]["recall_at_m_final"], atol=1e-6)
  in_sample = _eval(trained["data"], out, in_sample=True)
  assert in_sample["config"]["in_sample"] and len(in_sample["config"]["conversations"]) == 3
  only_trained = tmp_path / "two.json"
  only_trained.write_text(json.dumps(json.loads(trained["data"].read_text())[:2]))
  with pytest.raises(ValueError, match="every conversation of this file .2. was trained on"):
    _eval(only_trained, out)


def test_one_prequential_evaluation_that_does_learn(trained, tmp_path):
  summary = trained["summary"]
  online = _eval(trained["data"], trained["workdir"], online=True)
  np.testing.assert_allclose(online["metrics"]["overall"]["recall_all@5"],
                             summary["recall_at_m_prequential"], atol=1e-6)
  out = tmp_path / "reranker.safetensors"
  export_reranker(trained["workdir"], out)
  np.testing.assert_allclose(_eval(trained["data"], out, online=True)["metrics"]["overall"][
      "recall_all@5"], summary["recall_at_m_prequential"], atol=1e-6)
  # Online learning changes what is ranked: with it switched off the two would be equal.
  assert abs(summary["recall_at_m_prequential"] - summary["recall_at_m_final"]) > 1e-3


def test_resume_reads_the_same_file_or_is_refused(trained, tmp_path, monkeypatch):
  cfg = json.loads((trained["workdir"] / "config.json").read_text())
  assert os.path.isabs(cfg["data"])  # resolved when the run was created
  moved = tmp_path / "moved"
  shutil.copytree(trained["workdir"], moved)
  data = trained["data"]
  original = data.read_text()
  records = json.loads(original)
  records[0]["qa"] = records[0]["qa"][:-1]
  data.write_text(json.dumps(records))
  try:
    again = apply_overrides(get_config("locomo"), [f"data={data}", "learner=linear",
        "retriever=bm25", "dim=32", "steps=60",
        "checkpoint_every=20", "holdout=1", "pretrain_epochs=2", "lr=0.01",
        "tau=0.05"]).validate()
    with pytest.raises(ValueError, match="data_sha256"):
      train(again, moved, progress=False, encoder=HashEncoder())
  finally:
    data.write_text(original)


def test_a_reranker_is_refused_on_data_it_does_not_fit(trained):
  with pytest.raises(ValueError, match="retriever: trained with 'bm25', evaluated with 'dense'"):
    evaluate_retrieval("locomo", trained["data"], "turn", "dense", (5,), encoder=HashEncoder(),
                       reranker=trained["workdir"])
  with pytest.raises(ValueError, match="units: trained with 'turn', evaluated with 'session'"):
    evaluate_retrieval("locomo", trained["data"], "session", "bm25", (5,),
                       encoder=HashEncoder(), reranker=trained["workdir"])
  report = evaluate_retrieval("locomo", trained["data"], "turn", "dense", (5,),
                              encoder=HashEncoder(), reranker=trained["workdir"],
                              allow_mismatch=True)
  assert report["config"]["mismatches"] == [
      "retriever: trained with 'bm25', evaluated with 'dense'"]


def test_a_latent_simulator_reranker_is_refused_on_real_conversations(trained, tmp_path):
  from rmmjax.cli import main
  wd = tmp_path / "latent"
  assert main(["train", "--workdir", str(wd), "--quiet", "--set", "dim=32", "--set",
               "steps=20", "--set", "checkpoint_every=10", "--set", "num_users=8",
               "--set", "eval_sessions=4"]) == 0
  with pytest.raises(ValueError, match="encoder: trained with 'latent simulator'"):
    _eval(trained["data"], wd)


@pytest.mark.parametrize("units", ["session", "mixed"])
def test_recall_counts_evidence_turns_in_every_path(long_conversation, units):
  """For units spanning several turns the core's recall (in jit), the replay's host recall and
  `rmmjax eval`'s question metrics agree: evidence turns found / evidence turns."""
  conv = load_locomo(long_conversation)[0][0]
  replay = build_replay([conv], units, "bm25", HashEncoder(), k=10)[0]
  pool = build_units(conv, units)
  for m in (1, 3, 10):
    want = [question_metrics([(pool[i].turn_ids, pool[i].words) for i in order[:m]],
                             set(q.evidence), 1, (m,))[f"recall_all@{m}"]
            for q, order in zip(conv.questions, replay.order_NxR)]
    np.testing.assert_allclose(base_recall(replay, m), want, atol=1e-6)
  # The core's recall of arbitrary selections (some positions empty) against the host's.
  rng = np.random.default_rng(0)
  cols = np.stack([rng.permutation(10)[:3] for _ in conv.questions])
  cols[::5, 2] = -1
  streams = to_streams([replay], 4)
  batch = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[3:])[:len(conv.questions)], streams)
  got = recall_per_query(jnp.asarray(cols, jnp.int32), batch)
  np.testing.assert_allclose(got, evidence_recall(replay, cols), atol=1e-6)
  # Partial recalls occur, so the comparison can tell the definitions apart.
  assert len(set(np.round(np.asarray(got), 3).tolist())) > 2


def test_candidates_reach_past_the_default_depth(tmp_path):
  conversations, _ = load_locomo(synthetic_locomo.write(tmp_path / "long.json", 1, sessions=12,
                                                        turns=16))
  conv = conversations[0]
  replay = build_replay([conv], "turn", "bm25", HashEncoder(), k=150)[0]
  assert replay.mask_NxK.all()  # no candidate masked although K > 100
  pool = build_units(conv, "turn")
  want = [question_metrics([(pool[i].turn_ids, 1) for i in order[:150]], set(q.evidence), 1,
                           (150,))["recall_all@150"]
          for q, order in zip(conv.questions, replay.order_NxR)]
  np.testing.assert_allclose(ceiling_recall(replay), want, atol=1e-6)


def test_cross_validation_never_trains_on_a_held_out_conversation(tmp_path, monkeypatch):
  conversations, _ = load_locomo(synthetic_locomo.write(tmp_path / "four.json", 4))
  replays = build_replay(conversations[:4], "turn", "bm25", HashEncoder(), k=10)
  seen = []
  real = protocols.to_sequence, protocols.to_questions
  monkeypatch.setattr(protocols, "to_sequence",
                      lambda convs, b: seen.append({c.conversation_id for c in convs}) or
                      real[0](convs, b))
  monkeypatch.setattr(protocols, "to_questions",
                      lambda convs: seen.append({c.conversation_id for c in convs}) or
                      real[1](convs))
  spec = core.CoreSpec(model=EMBEDDING, dim=32, k=10, m=3, batch=4, rank_prior=True)
  hp = core.stack_hparams([core.HParams.create(lr=1e-3)])
  result = cross_validate(replays, 2, spec, hp, Protocol(pretrain_epochs=1, online_epochs=1))
  ids = [r.conversation_id for r in replays]
  for fold in result["folds"]:
    assert not set(fold["train"]) & set(fold["test"])
    assert sorted(fold["train"] + fold["test"]) == sorted(ids)
  assert len(seen) == 2 * len(result["folds"])  # each fold: its stream, its question pool
  for i, fold in enumerate(result["folds"]):
    assert seen[2 * i] == seen[2 * i + 1] == set(fold["train"])
  # Pooled over questions: one value per held-out question, each fold's in turn.
  assert result["heldout"].shape == (1, sum(len(r.questions) for r in replays))
  pooled = np.concatenate([f["heldout"][0] for f in result["folds"]]).mean()
  np.testing.assert_allclose(result["heldout"].mean(), pooled)


def test_split_fold_refuses_a_split_that_trains_on_everything():
  with pytest.raises(ValueError, match="at least one conversation to train on"):
    protocols.split_fold(["a", "b"], [0, 1])
  with pytest.raises(ValueError, match="do not name distinct conversations"):
    protocols.split_fold(["a", "b"], [0, 0])


def test_held_out_conversations_draw_their_own_randomness(three):
  conversations, _ = load_locomo(three)
  replay = build_replay(conversations[:1], "turn", "bm25", HashEncoder(), k=10)[0]
  spec = core.CoreSpec(model=EMBEDDING, dim=32, k=10, m=3, batch=4, rank_prior=True)
  state = core.init_state(spec, core.HParams.create(lr=1e-2))
  twins = to_streams([replay, replay], 4)
  same = heldout_replay(state, twins, np.array([7, 7], np.int32), True)["scores_SxBxK"]
  np.testing.assert_array_equal(same[0], same[1])
  other = heldout_replay(state, twins, np.array([7, 8], np.int32), True)["scores_SxBxK"]
  assert not np.allclose(other[0][-1], other[1][-1])


def test_a_broken_export_is_refused_on_load(trained, tmp_path):
  out = tmp_path / "reranker.safetensors"
  export_reranker(trained["workdir"], out)
  weights, meta = read_reranker(out)
  nan = tmp_path / "nan.safetensors"
  weights["wq"] = weights["wq"].copy()
  weights["wq"][0, 0] = np.nan
  save_file(weights, str(nan), metadata={HEADER_KEY: json.dumps(meta)})
  with pytest.raises(ValueError, match="weight wq holds 1 NaN or infinite values"):
    read_reranker(nan)
  truncated = tmp_path / "truncated.safetensors"
  truncated.write_bytes(out.read_bytes()[:-100])
  with pytest.raises(ValueError, match="not a readable safetensors file"):
    read_reranker(truncated)
  bare = tmp_path / "bare.safetensors"
  save_file(weights, str(bare))
  with pytest.raises(ValueError, match="has no 'rmmjax' entry"):
    read_reranker(bare)
  older = tmp_path / "older.safetensors"
  save_file(read_reranker(out)[0], str(older),
            metadata={HEADER_KEY: json.dumps({**meta, "format_version": 1})})
  with pytest.raises(ValueError, match="older.safetensors was written in rmmjax's reranker "
                     "format 1; this rmmjax reads reranker format 2; export it again"):
    read_reranker(older)


def _entries(*ids):
  return [{"id": i, "fingerprint": f"fp-{i}"} for i in ids]


def test_a_model_built_from_another_carries_what_that_one_trained_on():
  from rmmjax.eval.leakage import unseen
  from rmmjax.io.record import with_ancestors
  anchor = {"trained_conversations": _entries("a", "b"), "heldout_conversations": _entries("c")}
  own = {"trained_conversations": _entries("b", "d"), "heldout_conversations": _entries("e")}
  record = with_ancestors(own, [("W2", anchor)])
  assert [e["id"] for e in record["trained_conversations"]] == ["b", "d", "a"]
  assert record["ancestors"] == [{"source": "W2", "trained_conversations": _entries("a", "b")}]

  from rmmjax.data.schema import Conversation, Session, Turn
  convs = [Conversation(c, (Session("s", "1 May", (Turn("t", "A", f"said {c}"),)),), ())
           for c in "abcde"]
  kept, account = unseen(convs, [("W", record)], in_sample=False)
  assert [c.conversation_id for c in kept] == ["c", "e"]  # "a": the anchor's, left out too
  assert account["excluded_conversations"] == ["a", "b", "d"]


def test_a_run_whose_ancestor_trained_on_its_held_out_conversations_is_refused():
  from rmmjax.io.record import with_ancestors
  anchor = {"trained_conversations": _entries("a", "e")}
  own = {"trained_conversations": _entries("b"), "heldout_conversations": _entries("e")}
  with pytest.raises(ValueError, match="W2 trained on e, which this run would hold out"):
    with_ancestors(own, [("W2", anchor)])
