"""`rmmjax train --set learner=cross` as a user runs it, then `eval --reranker` and `export`:
the run's record and report, SIGKILL in pretraining and between checkpoints, a tokenizer that
differs refused naming both, the export scored by sentence-transformers' CrossEncoder as rmmjax
scores it, a step too large for the device refused before the run starts."""

import dataclasses
import json
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from safetensors.numpy import load_file, save_file

from cli_args import sets as _sets
from rmmjax.learners.cross import cross_scores
from rmmjax.cli import main
from rmmjax.config import apply_overrides, encoder_stage, get_config
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.learners.cross.export import export_cross
from rmmjax.learners.loading import load_reranker
from rmmjax.learners.cross.pairs import pair_tokens
from rmmjax.learners.cross import pairs as cross_pairs
from rmmjax.learners.cross import task as cross_task

# Every run here uses the tiny encoder (tests/helpers/tiny_bert.py): the logic is the point.
pytestmark = pytest.mark.usefixtures("tiny_encoder")

SMALL = ("learner=cross", "dim=32", "holdout=1", "k=5", "m=2", "batch=2",
         "steps=4",
         "log_every=2", "checkpoint_every=2", "max_length=48",
         "pretrain_candidates=4", "pretrain_epochs=1")


def _args(three, *extra):
  return _sets(f"data={three}", *SMALL, *extra)


@pytest.fixture(scope="module")
def cross_run(three, tmp_path_factory, tiny_encoder):
  wd = tmp_path_factory.mktemp("cross") / "run"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_args(three)]) == 0
  return wd


def test_a_cross_run_records_its_tokenizer_and_reports_its_pairs(cross_run):
  record = json.loads((cross_run / "record.json").read_text())
  summary = json.loads((cross_run / "summary.json").read_text())
  assert record["variant"] == "cross" and record["retriever"] == "hybrid"
  assert len(record["cross"]["tokenizer"]) == 64 and record["cross"]["max_length"] == 48
  assert summary["cross_pairs"] == record["cross"]["pairs"] > 0
  # Turns with their dates run past 48 tokens beside a question: cut and counted.
  assert 0 < summary["cross_pairs_truncated"] < summary["cross_pairs"]
  assert summary["cross_pair_length"] == 48
  # On a CPU compute_dtype=auto is float32, and the run says so.
  assert summary["cross_compute_dtype"] == record["cross"]["compute_dtype"] == "float32"
  # compute_dtype=auto (the default) ran in float32 on this CPU, and the record says so.
  assert json.loads((cross_run / "config.json").read_text())["cross"]["compute_dtype"] == "auto"
  assert record["cross"]["compute_dtype"] == "float32"
  assert len(json.loads((cross_run / "pretrain.json").read_text())["loss"]) > 0
  assert np.isfinite(summary["recall_at_m_final"])
  # The fresh reranker is the base order (its head starts at zero).
  assert summary["recall_at_m_first"] == pytest.approx(summary["recall_at_m_base"])
  loaded = load_reranker(cross_run)
  assert loaded.step == 4 and loaded.spec.variant == "cross" and loaded.spec.model is not None
  assert float(np.abs(loaded.params["encoder"]["classifier"]["kernel"]).max()) > 0


def test_pretraining_with_lambdaloss_learns_from_another_loss(cross_run, three, tmp_path):
  wd = tmp_path / "lambda"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_args(three, "cross.pretrain_loss=lambda")]) == 0
  softmax = json.loads((cross_run / "pretrain.json").read_text())["loss"]
  pairwise = json.loads((wd / "pretrain.json").read_text())["loss"]
  assert len(pairwise) == len(softmax) and np.all(np.isfinite(pairwise))
  assert pairwise != softmax  # (the same batches, another loss)
  loaded = load_reranker(wd)
  assert float(np.abs(loaded.params["encoder"]["classifier"]["kernel"]).max()) > 0


def test_a_run_reading_the_turn_before_each_candidate_reads_it_in_eval_too(
    cross_run, three, tmp_path, capsys):
  """cross.previous_turn=true: its pairs are longer (more are cut at max_length), the record
  says how it reads, `eval` reads its candidates the same way (reading turns alone, the same
  weights order them otherwise), and serving texts without their neighbours is refused."""
  from rmmjax.learners.cross.reader import CrossReader
  wd = tmp_path / "previous"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_args(three, "previous_turn=true", "steps=0")]) == 0
  record = json.loads((wd / "record.json").read_text())
  assert record["cross"]["previous_turn"] is True
  plain = json.loads((cross_run / "record.json").read_text())["cross"]
  assert record["cross"]["pairs"] == plain["pairs"]
  assert record["cross"]["truncated"] > plain["truncated"]

  def scores(workdir):
    out = tmp_path / "eval.json"
    assert main(["eval", "--data", str(three), "--units", "turn", "--reranker", str(workdir),
                 "--k", "2,5", "--quiet", "--out", str(out)]) == 0
    return json.loads(out.read_text())["metrics"]["overall"]

  alone = tmp_path / "alone"
  shutil.copytree(wd, alone)
  record["cross"]["previous_turn"] = False
  (alone / "record.json").write_text(json.dumps(record))
  assert scores(wd)["mrr"] != scores(alone)["mrr"]
  reader = CrossReader.for_reranker(load_reranker(wd), SentenceEncoder())
  with pytest.raises(ValueError, match="reads each turn beside the one before it"):
    reader.candidate_arrays("Where did she go?", ["[1 May 2023] Mel: to the beach"])


def test_second_readings_join_the_pretraining_and_the_record(cross_run, three, tmp_path):
  """cross.second_reading=true: the rows of each question beside one of its evidence turns
  join the pretraining (more steps an epoch) and the record and summary say so."""
  wd = tmp_path / "second"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_args(three, "second_reading=true", "steps=0")]) == 0
  record = json.loads((wd / "record.json").read_text())
  summary = json.loads((wd / "summary.json").read_text())
  assert record["cross"]["second_reading"] is True
  assert json.loads((cross_run / "record.json").read_text())["cross"]["second_reading"] is False
  assert summary["cross_second_readings"] > 0
  plain = json.loads((cross_run / "pretrain.json").read_text())["loss"]
  assert len(json.loads((wd / "pretrain.json").read_text())["loss"]) > len(plain)


def test_hard_epochs_continue_the_pretraining_over_the_negatives_it_ranks_highest(
    three, tmp_path):
  """pretrain_epochs=1 and hard_epochs=1 against pretrain_epochs=2: the same first epoch,
  then as many steps over other negatives (those the first epoch's reranker ranks highest)."""
  def losses(name, *extra):
    wd = tmp_path / name
    assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
                 *_args(three, "steps=0", *extra)]) == 0
    return np.array(json.loads((wd / "pretrain.json").read_text())["loss"])

  random, hard = losses("random", "pretrain_epochs=2"), losses("hard", "hard_epochs=1")
  assert len(hard) == len(random) and len(random) % 2 == 0
  half = len(random) // 2
  np.testing.assert_array_equal(hard[:half], random[:half])
  # (the listwise loss over the candidates the reranker ranks highest is the larger one)
  assert hard[half:].mean() > random[half:].mean()


def test_eval_scores_batch_by_batch_as_the_replay_of_streams_does(cross_run, three, tmp_path,
                                                                 monkeypatch, capsys):
  """Held out without learning, eval packs each batch to its own rows rather than replaying
  streams evened to the longest conversation and the fullest batch: the same ranking."""
  from rmmjax.learners.cross.reader import CrossReader
  args = ["eval", "--dataset", "locomo", "--data", str(three), "--units", "turn", "--reranker",
          str(cross_run), "--k", "1,2,5", "--quiet", "--out"]
  assert main(args + [str(tmp_path / "batchwise.json")]) == 0
  assert "the cross reranker scored in float32 on cpu" in capsys.readouterr().out
  monkeypatch.setattr(CrossReader, "batchwise", False)
  assert main(args + [str(tmp_path / "streams.json")]) == 0
  a, b = (json.loads((tmp_path / f"{name}.json").read_text())["metrics"]
          for name in ("batchwise", "streams"))
  assert a == b and a["overall"]["recall_all@5"] > 0


def test_eval_reads_the_first_candidates_of_the_base_order_and_ranks_the_rest_after(
    cross_run, three, tmp_path, capsys):
  """--candidates N, a cascade: the reranker orders the base order's first N of its K, the
  others follow in the base order. So N = K is the plain reading, and with N = 3 the top 5 hold
  the base order's first 5 whatever the order within them."""
  def evaluate(*extra):
    out = tmp_path / "eval.json"
    assert main(["eval", "--data", str(three), "--units", "turn", "--reranker", str(cross_run),
                 "--k", "3,5", "--quiet", "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())

  full, same, three_read = evaluate(), evaluate("--candidates", "5"), evaluate("--candidates", "3")
  assert same["metrics"] == full["metrics"] and full["config"]["candidates_read"] == 5
  assert three_read["config"]["candidates_read"] == 3
  got, base = three_read["metrics"]["overall"], three_read["base_order"]["overall"]
  assert got["recall_all@5"] == pytest.approx(base["recall_all@5"])
  assert got["recall_all@3"] == pytest.approx(three_read["ceiling"]["overall"]["ceiling"])
  assert base["recall_all@3"] == pytest.approx(three_read["ceiling"]["overall"]["ceiling"])
  assert three_read["ceiling"]["overall"]["ceiling"] < full["ceiling"]["overall"]["ceiling"]
  for bad, message in (("6", "from 2 (the M it selects) to 5 (the K it trained on)"),
                       ("1", "from 2 (the M it selects) to 5")):
    capsys.readouterr()
    assert main(["eval", "--data", str(three), "--reranker", str(cross_run), "--candidates",
                 bad]) == 2
    assert f"--candidates {bad}: the reranker {cross_run} reads {message}" in (
        capsys.readouterr().err)
  assert main(["eval", "--data", str(three), "--candidates", "3"]) == 2
  assert "--candidates 3 cuts a reranker's K candidates" in capsys.readouterr().err


def test_eval_takes_the_retriever_from_the_run_and_refuses_another_tokenizer(
    cross_run, three, tmp_path, capsys):
  out = tmp_path / "report.json"
  assert main(["eval", "--dataset", "locomo", "--data", str(three), "--units", "turn",
               "--reranker", str(cross_run), "--k", "2,5", "--quiet", "--out", str(out)]) == 0
  report = json.loads(out.read_text())
  assert report["config"]["retriever"] == "hybrid"
  assert report["config"]["conversations"] == ["syn-3"]  # what it did not train on
  other = tmp_path / "other"
  shutil.copytree(cross_run, other)
  record = json.loads((other / "record.json").read_text())
  record["cross"]["tokenizer"] = "0" * 64
  (other / "record.json").write_text(json.dumps(record))
  capsys.readouterr()
  assert main(["eval", "--dataset", "locomo", "--data", str(three), "--units", "turn",
               "--reranker", str(other), "--quiet"]) == 2
  err = capsys.readouterr().err
  trained = json.loads((cross_run / "record.json").read_text())["cross"]["tokenizer"]
  assert "000000000000" in err and trained[:12] in err
  # A damaged record is named, whatever is wrong with it.
  for damage in ('{"units": "turn", "cros', "[1, 2]", json.dumps(record | {"cross": {}})):
    (other / "record.json").write_text(damage)
    assert main(["eval", "--dataset", "locomo", "--data", str(three), "--units", "turn",
                 "--reranker", str(other), "--quiet"]) == 2
    assert "record.json" in capsys.readouterr().err


@pytest.mark.slow
def test_the_export_scores_as_rmmjax_does(cross_run, tmp_path, capsys):
  st = pytest.importorskip("sentence_transformers",
                           reason="the comparison needs sentence-transformers and torch: "
                                  "pip install -e '.[parity]'")
  out = tmp_path / "served"
  assert main(["export", "--workdir", str(cross_run), "--out", str(out)]) == 0
  header = json.loads((out / "rmmjax.json").read_text())
  assert "rank_bias[k]" in header["how_to_score"] and len(header["rank_bias"]) == 5
  assert main(["export", "--workdir", str(cross_run), "--out", str(out)]) == 2  # not over it
  assert "not empty" in capsys.readouterr().err
  assert {oct(p.stat().st_mode & 0o777) for p in out.iterdir()} == {"0o644"}  # servable
  assert oct(out.stat().st_mode & 0o777) == "0o755"
  assert main(["export", "--workdir", str(cross_run), "--out", str(tmp_path / "x.safetensors")]
              ) == 2
  assert "exports as a directory" in capsys.readouterr().err
  # A head far from zero, so that every part of the score counts.
  loaded = load_reranker(cross_run)
  params = jax.tree.map(np.asarray, loaded.params)
  rng = np.random.default_rng(0)
  hidden = loaded.spec.model.bert.hidden_size
  params["encoder"]["classifier"]["kernel"] = rng.normal(0, 0.3, (hidden, 1)).astype(np.float32)
  params["encoder"]["classifier"]["bias"] = np.array([0.7], np.float32)
  encoder = SentenceEncoder()
  served = export_cross(params, loaded.spec.model.bert, encoder.model_dir, tmp_path / "random",
                        {"record": loaded.record}, 48)
  # Typed "[SEP]"s too: Hugging Face keeps each on the side of the pair it was typed in.
  questions = ["When did Caroline go to the LGBTQ support group?", "what does Mel paint?",
               "what does [SEP] mean here?"]
  texts = [["[8 May 2023] Caroline: I went to a support group yesterday", "",
            " ".join(["a very long memory"] * 40), "Mel: sunsets, mostly", "ok [SEP] then"]] * 3
  pairs = pair_tokens(encoder.tokenizer, questions, texts, 48)
  ours = np.asarray(cross_scores(params, pairs.packed(),
                                      loaded.spec.model.bert))
  config = json.loads((served / "config.json").read_text())
  # What sentence-transformers 4 and later read, and what 3.x read (else a sigmoid).
  assert config["sentence_transformers"]["activation_fn"].endswith("Identity")
  assert config["sbert_ce_default_activation_function"].endswith("Identity")
  model = st.CrossEncoder(str(served), device="cpu")
  theirs = np.array([model.predict([(q, t) for t in row]) for q, row in zip(questions, texts)])
  # The served score, as its header says: the CrossEncoder's logit plus the rank prior.
  served_bias = np.asarray(json.loads((served / "rmmjax.json").read_text())["rank_bias"])
  np.testing.assert_allclose(ours, theirs + served_bias[None, :], atol=1e-4)


def test_the_export_serves_as_the_workdir_does(cross_run, three, tmp_path, capsys):
  out = tmp_path / "served"
  assert main(["export", "--workdir", str(cross_run), "--out", str(out)]) == 0
  served, trained = load_reranker(out), load_reranker(cross_run)
  assert served.spec == trained.spec and served.step == trained.step
  assert jax.tree.structure(served.params) == jax.tree.structure(trained.params)
  for a, b in zip(jax.tree.leaves(served.params), jax.tree.leaves(trained.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  reports = []
  for model in (cross_run, out):
    report = tmp_path / f"{model.name}.json"
    assert main(["eval", "--data", str(three), "--reranker", str(model), "--k", "2,5",
                 "--quiet", "--out", str(report)]) == 0
    reports.append(json.loads(report.read_text()))
  assert reports[1]["config"]["conversations"] == ["syn-3"]  # its record came along
  assert reports[1]["metrics"] == reports[0]["metrics"]
  # A damaged export is refused in one line naming what is wrong, before any work.
  header = json.loads((out / "rmmjax.json").read_text())
  bias = list(header["rank_bias"])
  weights = (out / "model.safetensors").read_bytes()
  for damage, message in (
      ({"config": None}, "rmmjax.json is not an rmmjax cross export"),
      ({"rank_bias": [bias[0], float("nan"), *bias[2:]]}, "not a finite number"),
      ({"max_length": 600}, "max_length is 600, but the record says 48"),
      ({"config": header["config"] | {"units": "session"}}, "config.units is 'session'")):
    (out / "rmmjax.json").write_text(json.dumps(header | damage))
    capsys.readouterr()
    assert main(["eval", "--data", str(three), "--reranker", str(out), "--quiet"]) == 2
    assert message in capsys.readouterr().err
  (out / "rmmjax.json").write_text(json.dumps(header))
  (out / "model.safetensors").write_bytes(weights[:1000])
  assert main(["eval", "--data", str(three), "--reranker", str(out), "--quiet"]) == 2
  assert "model.safetensors cannot be read" in capsys.readouterr().err
  (out / "model.safetensors").write_bytes(weights)
  (out / "rmmjax.json").unlink()
  assert main(["eval", "--data", str(three), "--reranker", str(out), "--quiet"]) == 2
  assert "holds no rmmjax.json: written by an earlier rmmjax (format 0" in (
      capsys.readouterr().err)


@pytest.mark.parametrize("extra, message", [
    ((), "a pretraining step of the cross reranker needs"),
    (("mode=rl",), "an online step of the cross reranker needs"),
    # Two stages: refused before its query-encoder stage trains or writes anything.
    (("learner=query_encoder,cross",), "a pretraining step of the cross reranker needs"),
])
def test_a_step_too_large_for_the_device_is_refused_before_the_run(three, tmp_path, extra,
                                                                   message, monkeypatch, capsys):
  monkeypatch.setattr(cross_pairs, "device_memory_bytes", lambda: 2**20)
  wd = tmp_path / "run"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_args(three, *extra)]) == 2
  err = capsys.readouterr().err
  assert message in err and "or cross.max_length (48)" in err
  assert ("k (5)" if extra == ("mode=rl",) else "cross.pretrain_candidates (4)") in err
  assert not wd.exists()


def test_eval_online_is_refused_where_a_learning_step_cannot_fit(cross_run, three,
                                                                 monkeypatch, capsys):
  monkeypatch.setattr(cross_pairs, "device_memory_bytes", lambda: 2**20)
  assert main(["eval", "--data", str(three), "--reranker", str(cross_run), "--online",
               "--quiet"]) == 2
  assert "evaluate without --online" in capsys.readouterr().err


def test_a_learner_both_run_holds_its_encoder_stage_too(three, tmp_path, capsys):
  from rmmjax.io.workdir import held
  wd = tmp_path / "both"
  with held(wd / "query_encoder", "train"):  # another process training into the stage alone
    assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
                 *_args(three, "learner=query_encoder,cross")]) == 2
  assert f"{wd / 'query_encoder'} is in use by rmmjax train (pid" in capsys.readouterr().err


def test_a_run_that_takes_no_online_step_compiles_none(three, tmp_path, monkeypatch):
  measured = []  # the candidates per question of each step measured
  real = cross_task.step_bytes
  monkeypatch.setattr(cross_task, "step_bytes",
                      lambda bert, k, b, n, *a: measured.append(n) or real(bert, k, b, n, *a))
  assert main(["train", "--config", "locomo", "--workdir", str(tmp_path / "run"), "--quiet",
               *_args(three, "steps=0")]) == 0
  assert measured == [4]  # cross.pretrain_candidates: a pretraining step's alone


@pytest.mark.parametrize("overrides, message", [
    (["units=lace", "learner=query_encoder,cross"], "units=lace trains a model of IRIS"),
    (["learner=query_encoder"], "max_length' for this run .* belongs to the cross section"),
    (["pretrain_candidates=9"], "expected 2 to k=5"),
    (["negatives_from_rank=6"], "negatives_from_rank=6: expected 1 to k=5"),
    (["negatives_from_rank=0"], "negatives_from_rank=0: expected 1 to k=5"),
    (["compute_dtype=float16"], "compute_dtype"),
    (["max_length=1024"], "cross.max_length=1,024: expected an integer from 16 to 512"),
    (["steps=0", "mode=rl"], "nothing would learn"),
    (["steps=0", "pretrain_epochs=0"], "nothing would learn"),
    (["head_lr_scale=1e9"], r"head_lr_scale=1000000000: expected a value in \(0, 10000\]"),
    (["pretrain_lr=10"], r"pretrain_lr=10: expected a value in \(0, 0.1\]"),
    (["prior_scale=1e30"], r"prior_scale=1e\+30: expected a value in \[0, 100\]"),
    (["lr=5"], r"lr=5: expected a value in \(0, 0.1\]"),
    (["hard_epochs=1", "pretrain_epochs=0", "steps=4"],
     "cross.hard_epochs=1 changes the pretraining: expected cross.pretrain_epochs >= 1"),
    (["second_reading=true", "mode=rl", "steps=4"], "cross.second_reading=true changes the "
     "pretraining: expected cross.pretrain_epochs >= 1 and a mode that pretrains, not mode=rl"),
    (["second_reading=true", "units=session"], "second_reading=true reads a question beside "
     "an evidence turn it found: expected units=turn, not session"),
    (["hard_epochs=1", "mode=rl"], "not mode=rl"),
    (["observations=true", "units=session"], "cross.observations=true pairs each observation "
     "with the turn it names: expected units=turn, not session"),
    (["previous_turn=true", "units=session"],
     "previous_turn=true reads each turn beside the one before it: expected units=turn, not "
     "session"),
])
def test_cross_settings_that_cannot_run_are_refused(overrides, message, three):
  with pytest.raises(ValueError, match=message):
    apply_overrides(get_config("locomo"), [f"data={three}", *SMALL, *overrides]).validate()


def test_cross_keys_belong_to_the_cross_variant_and_zero_steps_to_replayed_learners(three):
  data = f"data={three}"
  # A key of the cross reranker's section is unknown to a run without one, saying whose it is.
  with pytest.raises(ValueError, match="'negatives_from_rank' for this run .* belongs to the cross"):
    apply_overrides(get_config("locomo"), [data, "negatives_from_rank=2"])
  # One both sections hold is named as both's.
  with pytest.raises(ValueError, match="'prior_scale' .* belongs to the reranker and cross"):
    apply_overrides(get_config("locomo"), [data, "prior_scale=2.0"])
  with pytest.raises(ValueError, match="unknown config key 'cross_max_length'"):
    apply_overrides(get_config("locomo"), [data, "learner=query_encoder,cross",
                                           "cross_max_length=64"])
  with pytest.raises(ValueError, match="has no cross section"):
    apply_overrides(get_config("locomo"), [data, "learner=linear", "cross.lr=1e-5"])
  # steps=0 (pretraining alone) is for the replayed rerankers and query encoder, not IRIS.
  apply_overrides(get_config("locomo"), [data, "steps=0"]).validate()
  with pytest.raises(ValueError, match="0, pretraining alone, is for a reranker family or the"):
    apply_overrides(get_config("locomo"), [data, "learner=iris", "units=lace",
                                           "steps=0"]).validate()
  with pytest.raises(ValueError, match="positive integer .the simulator's runs have no pre"):
    apply_overrides(get_config("latent"), ["steps=0"]).validate()
  apply_overrides(get_config("locomo"), [data, "learner=query_encoder,cross",
                                         "steps=0"]).validate()
  with pytest.raises(ValueError, match="latent"):
    apply_overrides(get_config("latent"), ["learner=cross"]).validate()


def test_a_cross_run_over_a_given_encoder_is_refused_where_it_cannot_use_it(three, tmp_path):
  locomo, data = get_config("locomo"), f"data={three}"
  tuned = tmp_path / "tuned"
  tuned.mkdir()
  apply_overrides(locomo, [data, "learner=cross", f"query_encoder={tuned}"]).validate()
  with pytest.raises(ValueError, match="which retriever=bm25 does not use"):
    apply_overrides(locomo, [data, "learner=cross", f"query_encoder={tuned}",
                             "retriever=bm25"]).validate()
  with pytest.raises(ValueError, match="learner=query_encoder,cross tunes its own first"):
    apply_overrides(locomo, [data, "learner=query_encoder,cross",
                             f"query_encoder={tuned}"]).validate()


def test_the_encoder_stage_of_a_cross_run_trains_as_learner_query_encoder_does(three):
  """The query encoder first, with the named config's own rates, temperature and steps (not
  the cross reranker's), and no cross keys; the run's K (the locomo_cross config's 50) is the
  stage's too."""
  cfg = apply_overrides(get_config("locomo_cross"), [f"data={three}", "max_length=64"]).validate()
  assert (cfg.steps, cfg.learning.tau, cfg.learning.lr) == (0, 1.0, 1e-5)  # the reranker's
  assert cfg.encoder_tuning == get_config("locomo").encoder_tuning
  stage = encoder_stage(cfg).validate()
  alone = apply_overrides(get_config("locomo_cross"), [f"data={three}",
                                                       "learner=query_encoder"]).validate()
  assert stage == alone and stage.k == 50
  linear = apply_overrides(get_config("locomo"), [f"data={three}", "learner=query_encoder,linear",
                                                  "steps=40"]).validate()
  assert encoder_stage(linear) == dataclasses.replace(linear, learner="query_encoder")


@pytest.mark.slow
def test_a_cross_reranker_over_a_query_encoder_the_run_tunes_first(three, tmp_path):
  wd = tmp_path / "both"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_args(three, "learner=query_encoder,cross", "steps=0", "encoder_tuning.steps=10",
                      "encoder_tuning.pretrain_epochs=1")]) == 0
  record = json.loads((wd / "record.json").read_text())
  stage = json.loads((wd / "query_encoder" / "record.json").read_text())
  assert record["query_encoder"].startswith(stage["encoder"] + "+tuned:")
  assert record["variant"] == "cross"
  summary = json.loads((wd / "summary.json").read_text())
  encoder_summary = json.loads((wd / "query_encoder" / "summary.json").read_text())
  # The cross reranker's base order is the tuned encoder's hybrid order.
  np.testing.assert_allclose(summary["recall_at_m_base"], encoder_summary["recall_at_m_final"],
                             atol=1e-6)
  out = tmp_path / "eval.json"
  assert main(["eval", "--data", str(three), "--k", "2", "--quiet", "--reranker", str(wd),
               "--out", str(out)]) == 0
  report = json.loads(out.read_text())
  assert report["config"]["retriever"] == "hybrid"  # from the run's record
  assert report["config"]["query_encoder"] == str(wd / "query_encoder")
  np.testing.assert_allclose(report["metrics"]["overall"]["recall_all@2"],
                             summary["recall_at_m_final"], atol=1e-6)
  # Exported, the two serve as the workdir does.
  served = tmp_path / "served"
  assert main(["export", "--workdir", str(wd), "--out", str(served)]) == 0
  again = tmp_path / "again.json"
  assert main(["eval", "--data", str(three), "--k", "2", "--quiet", "--reranker",
               str(served / "reranker"), "--encoder", str(served / "query_encoder"), "--out",
               str(again)]) == 0
  assert json.loads(again.read_text())["metrics"] == report["metrics"]
  # Moved, the workdir brings its own query encoder, and the export the one beside it.
  moved = tmp_path / "moved"
  wd.rename(moved)
  for model in (moved, served / "reranker"):
    assert main(["eval", "--data", str(three), "--k", "2", "--quiet", "--reranker", str(model),
                 "--out", str(again)]) == 0
    assert json.loads(again.read_text())["metrics"] == report["metrics"]


def test_a_stand_in_encoder_is_refused_before_anything_is_written(three, tmp_path):
  from hash_encoder import HashEncoder
  from rmmjax.train.loop import train
  for learner in ("cross", "query_encoder,cross"):
    cfg = apply_overrides(get_config("locomo"), [f"data={three}", *SMALL,
                                                 f"learner={learner}"])
    with pytest.raises(ValueError, match="has none"):
      train(cfg, tmp_path / "run", progress=False, encoder=HashEncoder())
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_killed_runs_resume_to_the_uninterrupted_summary(cross_run, three, tmp_path):
  killed = tmp_path / "killed"
  cmd = [sys.executable, "-m", "rmmjax.cli", "train", "--config", "locomo", "--workdir",
         str(killed), "--quiet", *_args(three)]

  def run_until(done, what):
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while not done():
      assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
      assert time.time() < deadline, what
      time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()

  # Killed in pretraining (the record is written just before it), then between checkpoints.
  run_until(lambda: (killed / "record.json").exists(), "pretraining")
  assert not (killed / "checkpoints").exists()
  run_until(lambda: (killed / "checkpoints" / "2").exists(), "the checkpoint of step 2")
  assert not (killed / "summary.json").exists()
  resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-2000:]
  assert json.loads((killed / "summary.json").read_text()) == json.loads(
      (cross_run / "summary.json").read_text())
  assert (killed / "metrics.jsonl").read_text() == (cross_run / "metrics.jsonl").read_text()


@pytest.mark.slow
def test_steps_0_pretrains_alone_and_more_steps_continue_from_it(cross_run, three, tmp_path,
                                                                 capsys):
  wd = tmp_path / "run"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_args(three, "steps=0")]) == 0
  assert "pretrained only (steps=0)" in capsys.readouterr().out
  assert sorted(p.name for p in (wd / "checkpoints").iterdir()) == ["0"]
  assert load_reranker(wd).step == 0
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_args(three)]) == 0
  # The same as the run that went through without stopping.
  assert json.loads((wd / "summary.json").read_text()) == json.loads(
      (cross_run / "summary.json").read_text())


@pytest.mark.parametrize("learner", ["cross", "query_encoder,cross"])
def test_a_batch_larger_than_the_training_questions_is_refused_before_anything_is_written(
    three, tmp_path, capsys, learner):
  wd = tmp_path / "run"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_args(three, "batch=500", f"learner={learner}")]) == 2
  # (two stages: its query encoder stage, checked first, says so of its own batches)
  assert "batch=500: the 93 training questions cannot fill one" in capsys.readouterr().err
  assert not wd.exists()


@pytest.mark.slow
def test_four_devices_train_the_cross_reranker_as_one_does(three, tmp_path, on_four_devices):
  cross_run, wd = tmp_path / "one", tmp_path / "four"  # batches of 4 divide over 4 devices
  assert main(["train", "--config", "locomo", "--workdir", str(cross_run), "--quiet",
               *_args(three, "batch=4", "devices=1")]) == 0
  args = ["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
          *_args(three, "batch=4")]
  out = on_four_devices(f"""
      import jax
      from rmmjax.cli import main
      assert len(jax.devices()) == 4
      assert main({args!r}) == 0
      print("ok")
  """)
  assert out.strip().endswith("ok")
  ours, one = (json.loads((d / "summary.json").read_text()) for d in (wd, cross_run))
  assert ours.keys() == one.keys()
  # Each device's rows are packed apart (a multiple of 4 rows): the share of real positions
  # is the layout's, not a result.
  assert 0.5 < ours.pop("cross_real_positions") <= one.pop("cross_real_positions") <= 1
  for key, value in one.items():
    if isinstance(value, float):
      assert ours[key] == pytest.approx(value, abs=1e-4), key
    else:
      assert ours[key] == value, key
  mine, theirs = load_reranker(wd), load_reranker(cross_run)
  diff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
             for a, b in zip(jax.tree.leaves(mine.params), jax.tree.leaves(theirs.params)))
  assert diff < 1e-4, diff
  pairs = pair_tokens(SentenceEncoder().tokenizer, ["when did they go hiking?", "who paints?"],
                      [["[3 May 2023] A: we went hiking", "B: I paint", "", "C: hello", "D"]] * 2,
                      48)
  scores = [np.asarray(cross_scores(r.params, pairs.packed(),
                                         r.spec.model.bert)) for r in (mine, theirs)]
  np.testing.assert_allclose(scores[0], scores[1], atol=2e-3)


def test_misplaced_models_are_named_with_what_to_do(cross_run, three, tmp_path, capsys):
  served = tmp_path / "served"
  assert main(["export", "--workdir", str(cross_run), "--out", str(served)]) == 0
  capsys.readouterr()

  def refused(*args) -> str:
    assert main([*args]) == 2
    return capsys.readouterr().err

  evaluate = ["eval", "--data", str(three), "--quiet", "--reranker"]
  # A two-stage export's root: its reranker/ is meant.
  root = tmp_path / "both_export"
  shutil.copytree(served, root / "reranker")
  (root / "query_encoder").mkdir()
  (root / "rmmjax.json").write_text(json.dumps({"format": 2, "kind": "export",
                                                "learner": "query_encoder,cross"}))
  assert f"--reranker {root}/reranker" in refused(*evaluate, str(root))
  (tmp_path / "empty").mkdir()
  assert "empty directory" in refused(*evaluate, str(tmp_path / "empty"))
  # A reranker's workdir where a query encoder is expected, in a training config.
  err = refused("train", "--config", "locomo", "--workdir", str(tmp_path / "w"), "--quiet",
                *_args(three, f"query_encoder={cross_run}"))
  assert f"query_encoder={cross_run} is a reranker's training workdir; expected a tuned " in err
  assert "--reranker" not in err and "--iris-model" not in err
  # An export given to export; a two-stage run stopped in its encoder stage.
  assert "it is exported already" in refused("export", "--workdir", str(served), "--out",
                                             str(tmp_path / "again"))
  stopped = tmp_path / "stopped"
  shutil.copytree(cross_run, stopped / "query_encoder")  # a workdir with its config.json
  assert "run the same train command again" in refused("export", "--workdir", str(stopped),
                                                       "--out", str(tmp_path / "x"))
  # A file sentence-transformers builds the served model from, changed in any way (another
  # activation, another layer norm, a tokenizer that keeps case): refused, not served.
  for name, change in (("config.json", {"layer_norm_eps": 0.1}),
                       ("config.json", {"sbert_ce_default_activation_function":
                                        "torch.nn.modules.activation.Sigmoid"}),
                       ("tokenizer_config.json", {"do_lower_case": False})):
    copy = tmp_path / f"changed-{name}-{len(change)}-{sorted(change)[0]}"
    shutil.copytree(served, copy)
    data = json.loads((copy / name).read_text())
    (copy / name).write_text(json.dumps(data | change))
    assert f"{name} changed since the export wrote it" in refused(*evaluate, str(copy))
  # Weights the header's encoder cannot read: named, not a traceback; values not finite too.
  weights = load_file(str(served / "model.safetensors"))
  for name, value in (("classifier.bias", None),
                      ("classifier.weight", np.zeros((2, weights["classifier.weight"].shape[1]),
                                                     np.float32)),
                      ("bert.embeddings.word_embeddings.weight",
                       weights["bert.embeddings.word_embeddings.weight"][:1000]),
                      ("classifier.weight", np.full_like(weights["classifier.weight"], np.nan))):
    copy = tmp_path / "damaged"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(served, copy)
    damaged = {k: v for k, v in weights.items() if k != name} | (
        {name: value} if value is not None else {})
    save_file(damaged, str(copy / "model.safetensors"), metadata={"format": "pt"})
    err = refused(*evaluate, str(copy))
    assert name in err and "export the training workdir again" in err and "Traceback" not in err


SWEEP = [s for s in SMALL if not s.startswith("holdout=")]  # (a sweep holds out its folds)


def _cross_sweep(three, wd, *extra):
  return main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--grid",
               "cross.pretrain_lr=2e-5,1e-3", "--folds", "3", "--seeds", "1", *extra,
               *_sets(f"data={three}", *SWEEP)])


@pytest.mark.slow
def test_a_cross_sweep_trains_and_measures_each_run_then_its_best(three, tmp_path, capsys):
  wd = tmp_path / "sweep"
  assert _cross_sweep(three, wd) == 0
  assert "2 configurations x 3 folds = 6 runs" in capsys.readouterr().out
  result = json.loads((wd / "sweep.json").read_text())
  assert sorted((r["settings"]["cross.pretrain_lr"], r["fold"]) for r in result["runs"]) == [
      (lr, f) for lr in (2e-5, 1e-3) for f in range(3)]
  # A run's row is eval's measurement of its workdir on the conversations it held out.
  run = next(r for r in result["runs"] if r["fold"] == 1 and r["settings"]["cross.pretrain_lr"]
             == 1e-3)
  heldout = json.loads((wd / "runs" / "001" / "fold_1" / "heldout.json").read_text())
  assert run["recall_all@2"] == pytest.approx(
      np.mean([q["recall_all@2"] for q in heldout["per_question"]]), abs=1e-9)
  # Both runs reranked the same candidates: beside them, their best order's every metric.
  best = result["beside"]["best order of the K candidates"]
  assert best["mrr"]["overall"] == pytest.approx(np.mean(
      [q["best_order"]["mrr"] for f in range(3) for q in json.loads(
          (wd / "runs" / "000" / f"fold_{f}" / "heldout.json").read_text())["per_question"]]))
  assert all(r["mrr"] <= best["mrr"]["overall"] + 1e-9 for r in result["rows"])
  assert json.loads((wd / "best" / "config.json").read_text())["cross"]["pretrain_lr"] == (
      result["best"]["settings"]["cross.pretrain_lr"])
  capsys.readouterr()
  assert main(["eval", "--dataset", "locomo", "--data", str(three), "--units", "turn",
               "--reranker", str(wd / "best"), "--in-sample"]) == 0


def test_a_cross_sweep_whose_step_cannot_fit_is_refused_before_anything_is_written(
    three, tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(cross_pairs, "device_memory_bytes", lambda: 2**20)
  wd = tmp_path / "sweep"
  assert _cross_sweep(three, wd) == 2
  assert "a pretraining step of the cross reranker needs" in capsys.readouterr().err
  assert not wd.exists()
