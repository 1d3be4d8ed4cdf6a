"""`rmmjax sweep --config locomo`: a grid of an embedding reranker's rates x seeds, cross-validated
over folds of the conversations. On the synthetic conversations and the tiny BERT (dim 32): a
row's held-out numbers are those of `train --set folds=N --set fold=I` and `eval` of the same
configuration, the table's metrics are `eval`'s, a killed sweep reruns only unfinished folds,
and bad input is refused before anything is written."""

import json
import shutil

import numpy as np
import pytest

from cli_args import sets as _sets
from rmmjax.cli import main
from rmmjax.train.sweep_table import fold_file, paired_interval

pytestmark = pytest.mark.usefixtures("tiny_encoder")

SMALL = ("dim=32", "learner=reranker", "retriever=bm25", "k=10", "steps=12",
         "pretrain_epochs=2", "log_every=4")
GRID = ["--grid", "lr=1e-4,1e-3"]


def _sweep(three, wd, *extra, sets=()):
  return main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", *GRID,
               "--folds", "3", "--seeds", "2", *extra, *_sets(f"data={three}", *SMALL, *sets)])


@pytest.fixture(scope="module")
def swept(three, tmp_path_factory, tiny_encoder):
  wd = tmp_path_factory.mktemp("sweep") / "s"
  assert _sweep(three, wd) == 0
  return wd


def test_every_configuration_fold_and_seed_is_a_row_of_sweep_json(swept):
  result = json.loads((swept / "sweep.json").read_text())
  assert len(result["runs"]) == 2 * 3 * 2
  assert sorted({(r["settings"]["lr"], r["fold"], r["seed"]) for r in result["runs"]}) == sorted(
      (lr, f, s) for lr in (1e-4, 1e-3) for f in range(3) for s in range(2))
  # Every conversation is held out by exactly one fold.
  held = [c for fold in result["fold_conversations"] for c in fold]
  assert sorted(held) == ["syn-1", "syn-2", "syn-3"]
  for run in result["runs"]:
    assert run["heldout_conversations"] == result["fold_conversations"][run["fold"]]
    assert 0.0 <= run["recall_all@5"] <= run["recall_at_k"] + 1e-9
  assert len(result["rows"]) == 2 and (swept / "sweep.md").read_text().count("| lr=") == 2
  for name in ("curves.png", "tb", "best/summary.json", "folds/fold_2.npz"):
    assert (swept / name).exists(), name


def test_the_table_recall_is_the_programs_own_recall(swept):
  """The table's recall is computed from the saved scores by eval's metrics (the units' turns);
  the compiled program counted evidence from its labels: two computations, one number."""
  result = json.loads((swept / "sweep.json").read_text())
  configs = [r for r in result["runs"] if r["fold"] == 0]
  recall = fold_file(swept, 0)["recall"]
  assert np.allclose([r["recall_all@5"] for r in configs], recall.mean(1), atol=1e-6)


def test_a_row_is_what_train_and_eval_of_its_fold_give(three, swept, tmp_path, capsys):
  result = json.loads((swept / "sweep.json").read_text())
  run = next(r for r in result["runs"]
             if r["fold"] == 1 and r["seed"] == 1 and r["settings"]["lr"] == 1e-3)
  wd = tmp_path / "one"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", *SMALL, "lr=1e-3", "seed=1", "folds=3",
                      "fold=1")]) == 0
  summary = json.loads((wd / "summary.json").read_text())
  assert summary["recall_at_m_final"] == pytest.approx(run["recall_all@5"], abs=1e-5)
  assert summary["recall_at_m_prequential"] == pytest.approx(run["recall_at_m_prequential"],
                                                             abs=1e-5)
  capsys.readouterr()
  assert main(["eval", "--data", str(three), "--units", "turn", "--retriever", "bm25", "--k",
               "5,10", "--reranker", str(wd), "--out", str(tmp_path / "eval.json"),
               "--quiet"]) == 0
  got = json.loads((tmp_path / "eval.json").read_text())["metrics"]["overall"]
  for name in ("recall_all@5", "recall_any@5", "ndcg@10", "mrr"):
    assert got[name] == pytest.approx(run[name], abs=1e-6), name


def test_a_killed_sweep_reruns_only_its_unfinished_folds(three, swept, tmp_path, capsys):
  wd = tmp_path / "again"
  shutil.copytree(swept, wd)
  (wd / "folds" / "fold_1.npz").unlink()  # as a kill during fold 1 leaves it
  (wd / "sweep.json").unlink()
  before = fold_file(swept, 0)
  capsys.readouterr()
  assert _sweep(three, wd) == 0
  out = capsys.readouterr().out
  assert "1 folds to run (2 done)" in out
  assert json.loads((wd / "sweep.json").read_text())["rows"] == json.loads(
      (swept / "sweep.json").read_text())["rows"]
  assert np.array_equal(fold_file(wd, 0)["scores"], before["scores"])


@pytest.mark.parametrize("extra, sets, message", [
    (["--folds", "4"], (), "--folds 4: expected 2 to the 3 conversations"),
    ([], ("variant=cross",), "runs the embedding rerankers"),
    ([], ("folds=3",), "a sweep's folds are --folds N"),
    (["--grid", "k=5,10"], (), "--grid k: k changes the compiled program"),
    (["--grid", "lr=1e-4,1e-4"], (), "given more than once"),
])
def test_bad_sweeps_are_refused_before_anything_is_written(three, tmp_path, capsys, extra, sets,
                                                           message):
  wd = tmp_path / "bad"
  args = ["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--seeds", "1",
          "--folds", "3", *extra, *_sets(f"data={three}", *SMALL, *sets)]
  if "--grid" not in extra:
    args += GRID
  assert main(args) == 2
  assert message in capsys.readouterr().err
  assert not wd.exists()


def test_a_dry_run_states_the_cost_and_writes_nothing(three, tmp_path, capsys):
  wd = tmp_path / "dry"
  assert _sweep(three, wd, "--dry-run") == 0
  out = capsys.readouterr().out
  assert "4 configurations x 3 folds = 12 runs" in out
  assert "estimated time" in out
  assert not wd.exists()


def test_a_second_sweep_on_the_same_workdir_is_refused(three, swept, capsys):
  """A finished sweep's workdir with another grid: refused, naming what differs."""
  assert main(["sweep", "--config", "locomo", "--workdir", str(swept), "--quiet", "--grid",
               "lr=1e-4,3e-4", "--folds", "3", "--seeds", "2",
               *_sets(f"data={three}", *SMALL)]) == 2
  assert "another grid" in capsys.readouterr().err


def test_the_interval_resamples_conversations():
  diff = np.array([0.1, 0.1, 0.3, 0.3])
  mean, low, high = paired_interval(diff, ["a", "a", "b", "b"])
  assert mean == pytest.approx(0.2)
  assert low == pytest.approx(0.1) and high == pytest.approx(0.3)  # a draw is a, a or b, b
  assert paired_interval(np.full(4, 0.5), ["a", "b", "c", "d"]) == pytest.approx((0.5,) * 3)


@pytest.mark.parametrize("sets, message", [
    (("folds=1",), "folds=1: expected 0"),
    (("folds=3", "fold=3"), "fold=3: expected 0 to 2"),
    (("fold=1",), "folds=0: set folds=N too"),
    (("folds=3", "holdout=1"), "give one or the other"),
    (("folds=9",), "folds=9: "),
])
def test_a_fold_that_cannot_be_held_out_is_refused(three, tmp_path, capsys, sets, message):
  wd = tmp_path / "w"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", *SMALL, *sets)]) == 2
  assert message in capsys.readouterr().err
  assert not wd.exists()


def test_folds_hold_out_each_conversation_once_in_the_files_order():
  from rmmjax.config import get_config, with_values  # noqa: PLC0415
  from rmmjax.train.inputs import heldout_split  # noqa: PLC0415
  items = list("abcdefg")
  base = get_config("locomo")
  held = []
  for f in range(3):
    train, test = heldout_split(items, with_values(base, {"folds": 3, "fold": f}))
    assert sorted(train + test) == items and not set(train) & set(test)
    held += test
  assert held == items  # contiguous folds, in order
  assert heldout_split(items, base) == (items[:-2], items[-2:])  # holdout=2: the last two
