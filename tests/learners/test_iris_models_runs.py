"""learner=iris from the command line: the anchor, refinement and judge models fitted on three
LoCoMo conversations with the tiny BERT (tests/helpers/tiny_bert.py), every output a run has, an extended run equal to an
uninterrupted one, evaluation and export, and refusals of models given where another kind is
expected."""

import json

import numpy as np
import pytest
from safetensors import safe_open

import synthetic_locomo
from cli_args import sets as _sets
from rmmjax.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("tiny_encoder")]

SMALL = ["dim=32", "learner=iris", "units=lace", "holdout=1", "steps=10", "checkpoint_every=5",
         "log_every=5", "encoder_tuning.pretrain_epochs=1", "encoder_tuning.pretrain_batch=4",
         "retriever=hybrid", "iris_models.k=32"]


@pytest.fixture(scope="module")
def three(tmp_path_factory):
  """Three conversations of five sessions: enough multi-hop questions that the refinement
  encoder has examples left once the anchor finds most evidence in one pass."""
  return synthetic_locomo.write(tmp_path_factory.mktemp("data") / "three.json", 3, sessions=5,
                                turns=14)


@pytest.fixture(scope="module")
def iris_run(three, tmp_path_factory, tiny_encoder):
  wd = tmp_path_factory.mktemp("runs") / "iris"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", *SMALL)]) == 0
  return wd


def test_an_iris_run_writes_its_models_and_every_output_of_a_run(iris_run):
  for name in ("config.json", "summary.json", "metrics.jsonl", "curves.png", "record.json",
               "pretrain.json", "rmmjax.json", "judge.safetensors", "anchor_encoder/config.json"):
    assert (iris_run / name).exists(), name
  assert sorted(int(p.name) for p in (iris_run / "checkpoints").iterdir()
                if p.name.isdigit()) == [5, 10]
  assert set(json.loads((iris_run / "fit_losses.json").read_text())) == {"anchor", "refine",
                                                                          "judge"}
  summary = json.loads((iris_run / "summary.json").read_text())
  assert summary["heldout_conversations"] == ["syn-3"]
  assert len(summary["trained_conversations"]) == 2
  for key in ("iris_recall_at_10", "iris_recall_at_10_single_pass_base",
              "iris_recall_at_10_single_pass_tuned"):
    assert 0.0 <= summary[key] <= 1.0
  # Before the models exist the first evaluation is the base single pass; after, IRIS's own.
  assert summary["recall_at_m_first"] == summary["recall_at_m_base"]
  assert summary["recall_at_m_final"] != summary["recall_at_m_base"]
  judge_loss = json.loads((iris_run / "fit_losses.json").read_text())["judge"]
  assert np.mean(judge_loss[-10:]) < np.mean(judge_loss[:10])  # 20 epochs of the judge
  with safe_open(str(iris_run / "judge.safetensors"), "numpy") as f:
    header = f.metadata()
  assert "judge_logit" in header["how_to_score"]


def test_an_extended_iris_run_equals_an_uninterrupted_one(three, iris_run, tmp_path):
  wd = tmp_path / "extended"
  short = [s if not s.startswith("steps=") else "steps=5" for s in SMALL]
  args = ["train", "--config", "locomo", "--workdir", str(wd), "--quiet"]
  assert main([*args, *_sets(f"data={three}", *short)]) == 0
  assert main([*args, *_sets(f"data={three}", *SMALL)]) == 0
  assert (wd / "metrics.jsonl").read_text() == (iris_run / "metrics.jsonl").read_text()
  assert json.loads((wd / "summary.json").read_text()) == json.loads(
      (iris_run / "summary.json").read_text())


def _eval(three, out, *flags):
  assert main(["eval", "--data", str(three), "--units", "lace", "--quiet", "--out", str(out),
               *flags]) == 0
  return json.loads(out.read_text())


def test_eval_with_the_learned_models_and_with_their_export(three, iris_run, tmp_path):
  learned = _eval(three, tmp_path / "a.json", "--iris", "learned", "--iris-model", str(iris_run))
  assert learned["config"]["conversations"] == ["syn-3"]  # trained conversations left out
  assert main(["export", "--workdir", str(iris_run), "--out", str(tmp_path / "x")]) == 0
  for name in ("anchor_encoder/model.safetensors", "refine_encoder/model.safetensors",
               "judge.safetensors"):
    assert (tmp_path / "x" / name).exists(), name
  exported = _eval(three, tmp_path / "b.json", "--iris", "learned", "--iris-model",
                   str(tmp_path / "x"))
  for key in ("recall_all@5", "recall_all@10"):
    assert exported["metrics"]["overall"][key] == pytest.approx(
        learned["metrics"]["overall"][key], abs=1e-9)
  single = _eval(three, tmp_path / "c.json", "--encoder", str(iris_run))
  assert single["config"]["conversations"] == ["syn-3"]
  assert single["metrics"]["overall"]["iterations_mean"] == 1.0


def test_models_of_another_kind_are_refused(three, iris_run, tmp_path, capsys):
  assert main(["eval", "--data", str(three), "--units", "lace", "--iris", "--reranker",
               str(iris_run)]) == 2
  assert "holds learned IRIS models (learner=iris)" in capsys.readouterr().err
  latent = tmp_path / "latent"
  assert main(["train", "--config", "latent", "--workdir", str(latent), "--quiet", "--set",
               "steps=10", "--set", "log_every=5", "--set", "checkpoint_every=10"]) == 0
  capsys.readouterr()
  assert main(["eval", "--data", str(three), "--units", "lace", "--iris", "--iris-model",
               str(latent)]) == 2
  assert "is a reranker's training workdir; it is used through --reranker" in (
      capsys.readouterr().err)
  # The agent's --reranker names what an IRIS workdir or export is, and which flag takes it.
  from rmmjax.memory import MemoryBank
  db = tmp_path / "bank.sqlite"
  with MemoryBank(db) as bank:
    bank.add_user("u")
  assert main(["export", "--workdir", str(iris_run), "--out", str(tmp_path / "exported")]) == 0
  capsys.readouterr()
  for model in (iris_run, tmp_path / "exported"):
    assert main(["recall", "--db", str(db), "--user", "u", "--reranker", str(model), "q"]) == 2
    err = capsys.readouterr().err
    assert "learner=iris" in err and "--iris-model, with --iris" in err, err
    assert main(["recall", "--db", str(db), "--user", "u", "--encoder", str(model), "q"]) == 2
    assert "--iris-model, with --iris" in capsys.readouterr().err
  assert main(["train", "--config", "locomo", "--workdir", str(tmp_path / "t"), "--set",
               f"data={three}", "--set", "learner=iris"]) == 2
  assert "learner=iris learns IRIS's gap diagnosis over LaceMem's facts: set units=lace" in (
      capsys.readouterr().err)
  assert not (tmp_path / "t").exists()


def test_an_export_is_refused_over_the_workdir_or_as_one_file(iris_run, tmp_path, capsys):
  before = sorted(p.name for p in iris_run.iterdir())
  assert main(["export", "--workdir", str(iris_run), "--out", str(iris_run)]) == 2
  assert "is a training workdir" in capsys.readouterr().err
  assert main(["export", "--workdir", str(iris_run), "--out", str(tmp_path / "m.safetensors")]) == 2
  assert "export as a directory" in capsys.readouterr().err
  assert sorted(p.name for p in iris_run.iterdir()) == before
  assert not (tmp_path / "m.safetensors").exists()


def test_a_model_of_another_encoder_is_refused(iris_run):
  from hash_encoder import HashEncoder

  from rmmjax.learners.iris.files import load_iris_model
  with pytest.raises(ValueError, match="trained on facts embedded by"):
    load_iris_model(iris_run, HashEncoder())


def test_eval_through_the_learned_models_says_what_it_left_out_and_can_be_in_sample(
    three, iris_run, capsys):
  capsys.readouterr()
  args = ["eval", "--data", str(three), "--units", "lace", "--quiet", "--iris", "learned",
          "--iris-model", str(iris_run)]
  assert main(args) == 0
  out = capsys.readouterr().out
  assert "left out 2 conversations trained on: syn-1, syn-2" in out
  assert main([*args, "--in-sample"]) == 0
  assert "IN-SAMPLE: 2 of them were trained on (syn-1, syn-2)" in capsys.readouterr().out
  assert main(["eval", "--data", str(three), "--units", "lace", "--quiet", "--encoder",
               str(iris_run)]) == 0
  assert "left out 2 conversations trained on" in capsys.readouterr().out


def test_a_run_on_every_conversation_checks_its_fit_on_a_validation_split(three, tmp_path,
                                                                          capsys):
  wd = tmp_path / "all"
  small = [s for s in SMALL if not s.startswith("holdout=")]
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", "holdout=0", *small)]) == 0
  out = capsys.readouterr().out
  summary = json.loads((wd / "summary.json").read_text())
  assert summary["validation_conversations"] == ["syn-3"]
  assert summary["heldout_conversations"] == [] and len(summary["trained_conversations"]) == 2
  assert "Recall@10 (validation), single pass, tuned anchor" in out
  assert summary["iris_validation"] and ("iris_warning" in summary) == (
      summary["iris_recall_at_10_single_pass_tuned"]
      < summary["iris_recall_at_10_single_pass_base"])
  # The printed hint is a command eval takes (it used to suggest --reranker for this workdir).
  hint = next(line.strip() for line in out.splitlines() if line.strip().startswith("rmmjax eval"))
  argv = [str(three) if a == "FILE" else a for a in hint.split()[1:]]
  assert main([*argv, "--quiet"]) == 0
  assert "left out 2 conversations trained on" in capsys.readouterr().out
