"""The retriever as a learner from the command line: query-encoder training with every output a
reranker run has, exact resume, evaluation and export; the combined pipeline; and refusals of
models given where another kind is expected. On the tiny BERT (tests/helpers/tiny_bert.py): the
logic is the point; MiniLM's own parity is tests/encode's."""

import json

import numpy as np
import pytest

from cli_args import sets as _sets
from rmmjax.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("tiny_encoder")]

SMALL = ["dim=32", "holdout=1", "steps=20", "checkpoint_every=10", "log_every=5",
         "encoder_tuning.pretrain_epochs=2", "retriever=hybrid", "k=10"]


@pytest.fixture(scope="module")
def encoder_run(three, tmp_path_factory, tiny_encoder):
  wd = tmp_path_factory.mktemp("runs") / "encoder"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", "learner=query_encoder", *SMALL)]) == 0
  return wd


def test_query_encoder_run_writes_what_a_reranker_run_writes(encoder_run):
  for name in ("config.json", "summary.json", "metrics.jsonl", "curves.png", "record.json",
               "pretrain.json", "rmmjax.json"):
    assert (encoder_run / name).exists(), name
  assert sorted(p.name for p in (encoder_run / "checkpoints").iterdir() if p.name.isdigit()) == [
      "10", "20"]
  summary = json.loads((encoder_run / "summary.json").read_text())
  assert summary["heldout_conversations"] == ["syn-3"]
  assert summary["recall_at_m_final"] != summary["recall_at_m_base"]  # the encoder moved
  assert summary["pretrain_loss_last"] < summary["pretrain_loss_first"]
  rows = [json.loads(line) for line in (encoder_run / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [5, 10, 15, 20]


def test_an_extended_query_encoder_run_equals_an_uninterrupted_one(three, encoder_run, tmp_path):
  wd = tmp_path / "extended"
  short = [s if not s.startswith("steps=") else "steps=10" for s in SMALL]
  args = ["train", "--config", "locomo", "--workdir", str(wd), "--quiet"]
  assert main([*args, *_sets(f"data={three}", "learner=query_encoder", *short)]) == 0
  assert main([*args, *_sets(f"data={three}", "learner=query_encoder", *SMALL)]) == 0
  assert (wd / "metrics.jsonl").read_text() == (encoder_run / "metrics.jsonl").read_text()
  assert json.loads((wd / "summary.json").read_text()) == json.loads(
      (encoder_run / "summary.json").read_text())


def test_eval_and_export_reproduce_the_held_out_numbers(three, encoder_run, tmp_path):
  summary = json.loads((encoder_run / "summary.json").read_text())
  out = tmp_path / "eval.json"
  args = ["eval", "--data", str(three), "--retriever", "hybrid", "--k", "5", "--quiet"]
  assert main([*args, "--encoder", str(encoder_run), "--out", str(out)]) == 0
  report = json.loads(out.read_text())
  assert report["config"]["conversations"] == ["syn-3"]
  assert report["config"]["excluded_conversations"] == ["syn-1", "syn-2"]
  np.testing.assert_allclose(report["metrics"]["overall"]["recall_all@5"],
                             summary["recall_at_m_final"], atol=1e-6)
  export = tmp_path / "exported"
  assert main(["export", "--workdir", str(encoder_run), "--out", str(export)]) == 0
  # Its manifest says what it is, what it trained on and the run's config.
  manifest = json.loads((export / "rmmjax.json").read_text())
  assert {k: manifest[k] for k in ("format", "kind", "learner", "stages")} == {
      "format": 2, "kind": "export", "learner": "query_encoder", "stages": ["encoder_tuning"]}
  assert manifest["record"] == json.loads((encoder_run / "record.json").read_text())
  assert manifest["config"] == json.loads((encoder_run / "config.json").read_text())
  assert main([*args, "--encoder", str(export), "--out", str(out)]) == 0
  np.testing.assert_allclose(json.loads(out.read_text())["metrics"]["overall"]["recall_all@5"],
                             summary["recall_at_m_final"], atol=1e-6)
  # sentence-transformers loads the export unchanged and embeds like rmmjax's tuned encoder.
  from sentence_transformers import SentenceTransformer

  from rmmjax.encode.encoder import SentenceEncoder
  from rmmjax.learners.query_encoder.files import load_query_encoder
  tuned = load_query_encoder(encoder_run, SentenceEncoder())
  texts = ["When did Caroline go to the LGBTQ support group?", "What did Melanie paint?"]
  ours = tuned.encode(texts)
  theirs = SentenceTransformer(str(export), device="cpu").encode(texts)
  cosine = np.sum(ours * theirs, 1) / np.linalg.norm(theirs, axis=1)
  assert cosine.min() >= 0.9999
  assert not np.allclose(ours, SentenceEncoder().encode(texts), atol=1e-3)  # really tuned


@pytest.mark.parametrize("learner", ["query_encoder", "linear"])
def test_pretraining_alone_is_a_run_whose_model_is_its_step_0(three, tmp_path, learner,
                                                              request):
  # steps=0: the pretrained model is the run's one checkpoint, which eval reads and measures
  # as the run's own held-out summary did.
  wd = tmp_path / learner
  small = [s if not s.startswith("steps=") else "steps=0" for s in SMALL]
  small = [s.replace("encoder_tuning.", "reranker." if learner == "linear" else
                     "encoder_tuning.") for s in small]
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", f"learner={learner}", *small)]) == 0
  assert sorted(p.name for p in (wd / "checkpoints").iterdir() if p.name.isdigit()) == ["0"]
  summary = json.loads((wd / "summary.json").read_text())
  assert "reward_first" not in summary and summary["steps"] == 0
  assert summary["recall_at_m_final"] != summary["recall_at_m_first"]  # pretraining moved it
  out = tmp_path / "eval.json"
  model = ["--encoder", str(wd)] if learner == "query_encoder" else ["--reranker", str(wd)]
  assert main(["eval", "--data", str(three), "--retriever", "hybrid", "--k", "5", "--quiet",
               *model, "--out", str(out)]) == 0
  np.testing.assert_allclose(json.loads(out.read_text())["metrics"]["overall"]["recall_all@5"],
                             summary["recall_at_m_final"], atol=1e-6)
  if learner == "query_encoder":  # extended to online steps, it is the uninterrupted run
    encoder_run = request.getfixturevalue("encoder_run")
    assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
                 *_sets(f"data={three}", f"learner={learner}", *SMALL)]) == 0
    assert (wd / "metrics.jsonl").read_text() == (encoder_run / "metrics.jsonl").read_text()
    assert json.loads((wd / "summary.json").read_text()) == json.loads(
        (encoder_run / "summary.json").read_text())


def test_models_given_where_another_kind_is_expected_are_refused(three, encoder_run, tmp_path,
                                                                 capsys):
  args = ["eval", "--data", str(three), "--retriever", "hybrid", "--quiet"]
  assert main([*args, "--reranker", str(encoder_run)]) == 2
  assert ("is a tuned query encoder's training workdir (learner=query_encoder); it is used "
          "through --encoder") in capsys.readouterr().err
  broken = tmp_path / "broken"
  assert main(["export", "--workdir", str(encoder_run), "--out", str(broken)]) == 0
  (broken / "tokenizer.json").unlink()
  assert main([*args, "--encoder", str(broken)]) == 2
  assert "tokenizer.json" in capsys.readouterr().err
  assert main([*args, "--retriever", "bm25", "--encoder", str(encoder_run)]) == 2
  assert "which --retriever bm25 does not use" in capsys.readouterr().err


def test_k_larger_than_a_conversation_is_refused_before_any_work(three, tmp_path, capsys):
  wd = tmp_path / "run"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", "dim=32", "units=session", "k=40")]) == 2
  err = capsys.readouterr().err
  assert "k=40 candidates, but conversation" in err and "session units" in err
  assert not wd.exists()


BOTH = ("learner=query_encoder,linear", "pretrain_epochs=1", *SMALL, "encoder_tuning.steps=10")


def test_both_trains_the_encoder_then_a_reranker_on_its_candidates(three, tmp_path, capsys):
  wd = tmp_path / "both"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", *BOTH)]) == 0
  record = json.loads((wd / "record.json").read_text())
  stage = json.loads((wd / "query_encoder" / "record.json").read_text())
  assert record["query_encoder"].startswith(stage["encoder"] + "+tuned:")
  summary = json.loads((wd / "summary.json").read_text())
  encoder_summary = json.loads((wd / "query_encoder" / "summary.json").read_text())
  # The reranker's base order is the tuned encoder's: its base recall is the stage's final.
  np.testing.assert_allclose(summary["recall_at_m_base"], encoder_summary["recall_at_m_final"],
                             atol=1e-6)
  out = tmp_path / "eval.json"
  assert main(["eval", "--data", str(three), "--retriever", "hybrid", "--k", "5", "--quiet",
               "--reranker", str(wd), "--out", str(out)]) == 0
  np.testing.assert_allclose(json.loads(out.read_text())["metrics"]["overall"]["recall_all@5"],
                             summary["recall_at_m_final"], atol=1e-6)
  # More steps of the finished first stage would change the candidates the reranker trained
  # on: refused before anything trains, the workdir (the stage's checkpoints too) left whole.
  before = {p: p.read_bytes() for p in wd.rglob("*") if p.is_file() and p.name != ".lock"}
  capsys.readouterr()
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", *BOTH, "encoder_tuning.steps=20")]) == 2
  err = capsys.readouterr().err
  assert "encoder_tuning.steps: 10 there, 20 now" in err and "only reranker.steps extends" in err
  assert {p: p.read_bytes() for p in wd.rglob("*") if p.is_file() and p.name != ".lock"} == before
  again = tmp_path / "again.json"
  assert main(["eval", "--data", str(three), "--retriever", "hybrid", "--k", "5", "--quiet",
               "--reranker", str(wd), "--out", str(again)]) == 0
  assert json.loads(again.read_text())["metrics"] == json.loads(out.read_text())["metrics"]
  # Nor is the first stage trained further on its own.
  assert main(["train", "--config", "locomo", "--workdir", str(wd / "query_encoder"), "--quiet",
               *_sets(f"data={three}", "learner=query_encoder", *SMALL,
                      "encoder_tuning.steps=20")]) == 2
  assert "is the first stage of the learner=query_encoder,linear run in" in capsys.readouterr().err
  assert {p: p.read_bytes() for p in wd.rglob("*") if p.is_file() and p.name != ".lock"} == before


def test_training_steps_never_free_the_encoders_own_weights():
  """A training step donates its state; the state must hold a copy of the encoder's weights, or
  the encoder could not embed anything after the first step (mode=rl starts from them)."""
  import jax

  from rmmjax import core
  from rmmjax.encode.encoder import SentenceEncoder
  from rmmjax.encode.tuned import encoder_state
  encoder = SentenceEncoder()
  state = encoder_state(encoder, core.CoreSpec(dim=encoder.dim), core.HParams.create())
  jax.jit(lambda s: jax.tree.map(lambda x: x * 1, s), donate_argnums=0)(state)
  assert encoder.encode(["still here"], params=encoder.params).shape == (1, encoder.dim)


def test_a_model_built_on_a_tuned_encoder_carries_what_the_encoder_trained_on(
    three, encoder_run, tmp_path, capsys):
  """encoder_run trained on syn-1 and syn-2; syn-3 was held out."""
  wd = tmp_path / "reranker"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", "learner=linear", f"query_encoder={encoder_run}",
                      "dim=32", "holdout=1", "steps=10", "log_every=5", "checkpoint_every=10",
                      "pretrain_epochs=1", "retriever=hybrid", "k=10")]) == 0
  record = json.loads((wd / "record.json").read_text())
  assert [a["source"] for a in record["ancestors"]] == [str(encoder_run.resolve())]
  assert {e["id"] for e in record["trained_conversations"]} == {"syn-1", "syn-2"}
  # Holding out a conversation the encoder trained on would report in-sample numbers.
  for learner, units in (("linear", "turn"), ("iris", "lace")):
    bad = tmp_path / f"bad-{learner}"
    assert main(["train", "--config", "locomo", "--workdir", str(bad), "--quiet",
                 *_sets(f"data={three}", f"learner={learner}", f"units={units}", "dim=32",
                        f"query_encoder={encoder_run}", "holdout=2")]) == 2
    assert "trained on syn-2, which this run would hold out" in capsys.readouterr().err
    assert not bad.exists()
  # eval --encoder says what it left out, on the console as in the JSON.
  assert main(["eval", "--data", str(three), "--retriever", "hybrid", "--quiet", "--encoder",
               str(encoder_run)]) == 0
  assert "left out 2 conversations trained on: syn-1, syn-2" in capsys.readouterr().out
