"""`rmmjax sweep --config locomo`: a grid of an embedding reranker's rates x seeds, cross-validated
over folds of the conversations. On the synthetic conversations and the tiny BERT (dim 32): a
row's held-out numbers are those of `train --set folds=N --set fold=I` and `eval` of the same
configuration, the table's metrics are `eval`'s, a killed sweep reruns only unfinished folds,
and bad input is refused before anything is written."""

import collections
import json
import re
import shutil

import numpy as np
import pytest

from cli_args import sets as _sets
from rmmjax.cli import main
from rmmjax.config import apply_overrides, get_config, with_values
from rmmjax.io.workdir import check_sweepable, sweep_record, write_run_record
from rmmjax.train.sweep.replay import fold_file
from rmmjax.train.sweep.table import by_part

pytestmark = pytest.mark.usefixtures("tiny_encoder")

SMALL = ("dim=32", "learner=linear", "retriever=bm25", "k=10", "steps=12",
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


def test_every_configuration_fold_and_seed_is_a_row_of_sweep_json(swept, three):
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
  # A row per grid point in the table, in each metric's table by category (R@5, R@10, NDCG@10,
  # MRR) and in the learning-online table along the conversations.
  assert len(result["rows"]) == 2 and (swept / "sweep.md").read_text().count("| lr=") == 6 * 2
  # By category: each row's figures, weighted by the questions of each category, are its
  # overall one; the base order and the candidates' ceiling beside them.
  from rmmjax.data.locomo import load_locomo
  questions = collections.Counter(q.category for c in load_locomo(three)[0] for q in c.questions)
  for row in [*result["rows"], {"by_category": result["base_by_category"],
                                "recall": result["recall_at_m_base"]},
              {"by_category": result["ceiling_by_category"], "recall": result["recall_at_k"]}]:
    assert sum(row["by_category"][c] * n for c, n in questions.items()) / sum(
        questions.values()) == pytest.approx(row["recall"], abs=1e-9)
  table = (swept / "sweep.md").read_text()
  assert "| base order |" in table and f"| all K={result['base_config']['k']} candidates |" in table
  # Every metric, overall and by category, of the base order and of the K candidates' best
  # order: no reranker of the same K beats the best order, which finds no more than all K hold.
  base, best = (result["beside"][n] for n in ("base order", "best order of the K candidates"))
  assert base["recall_all@5"]["overall"] == pytest.approx(result["recall_at_m_base"], abs=1e-9)
  assert base["recall_all@5"] != best["recall_all@5"]
  for c in ["overall", *questions]:
    assert best["recall_all@5"][c] <= best["recall_all@10"][c] + 1e-9
    assert best["recall_all@10"][c] <= ({"overall": result["recall_at_k"]}
                                        | result["ceiling_by_category"])[c] + 1e-9
    for row in result["rows"]:
      for metric, values in row["metrics_by_category"].items():
        assert values[c] <= best[metric][c] + 1e-9, (metric, c)
  for metric in ("MRR", "NDCG@10", "R@10 all"):
    assert f"\n{metric} by category, beside the base order and the best order of the K" in table
  for name in ("curves.png", "online.png", "tb", "best/summary.json", "folds/fold_2.npz"):
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
  # Beside it, the order it reranks and the ceiling of its candidates, as the sweep has them.
  printed = capsys.readouterr().out
  assert "the bm25 order the reranker reranks, over the same candidates:" in printed
  assert (f"among the K = {result['base_config']['k']} candidates (R all): overall "
          f"{run['recall_at_k']:.3f};"
          in printed), printed


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


@pytest.mark.slow
def test_the_same_sweep_with_its_values_listed_in_another_order_resumes(three, swept, tmp_path,
                                                                       capsys):
  wd = tmp_path / "again"
  shutil.copytree(swept, wd)
  (wd / "folds" / "fold_1.npz").unlink()
  capsys.readouterr()
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--grid",
               "lr=1e-3,1e-4", "--folds", "3", "--seeds", "2",
               *_sets(f"data={three}", *SMALL)]) == 0
  assert "1 folds to run (2 done)" in capsys.readouterr().out
  assert json.loads((wd / "sweep.json").read_text())["rows"] == json.loads(
      (swept / "sweep.json").read_text())["rows"]


@pytest.mark.slow
def test_a_sweep_over_two_keys_resumes_with_either_order_of_its_keys(three, tmp_path, capsys):
  """(the manifest keeps the grid with its keys sorted: a sweep whose keys were given in another
  order was refused its own rerun.)"""
  wd = tmp_path / "two"
  for grid in (("tau=0.5,1.0", "lr=1e-4,1e-3"), ("tau=0.5,1.0", "lr=1e-4,1e-3"),
               ("lr=1e-3,1e-4", "tau=1.0,0.5")):
    assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--folds", "2",
                 "--seeds", "1", "--no-best", *(a for g in grid for a in ("--grid", g)),
                 *_sets(f"data={three}", *SMALL)]) == 0
  out = capsys.readouterr().out
  assert out.count("0 folds to run (2 done)") == 2


@pytest.mark.parametrize("extra, sets, message", [
    (["--folds", "4"], (), "--folds 4: expected 2 to the 3 conversations"),
    ([], ("units=lace",), "hold out the last `holdout` ones"),
    ([], ("folds=3",), "a sweep's folds are --folds N"),
    (["--grid", "retriever=bm25,dense"], (), "retriever is the same for every run of a sweep"),
    (["--grid", "lr=1e-4,fast"], (), "lr='fast': expected a finite number"),
    (["--seeds", "0"], (), "--seeds 0: expected 1 to 1,000"),
    (["--grid", "lr=1e-4,1e-3", "--grid", "reranker.lr=1e-2"], (),
     "--grid reranker.lr and --grid lr name the same key (reranker.lr): give it once"),
    (["--grid", "lr=1e-4", "--grid", "lr=1e-3"], (),
     "--grid lr is given twice: give each key once, with all its values (--grid lr=V1,V2,...)"),
    (["--grid", "noise=0.1,0.2"], (), "noise is the same for every run of a sweep"),
    ([], ("holdout=0",), "holdout=0: a sweep holds out each of its --folds in turn"),
    (["--grid", "lr=1e-4,1e-4"], (), "given more than once"),
    # A key no run reads: every row would be the same run.
    (["--grid", "pretrain_tau=0.05,1.0"], ("mode=rl",),
     "--grid pretrain_tau: no run of this sweep reads it (mode=rl does not pretrain)"),
    (["--grid", "reranker.hidden=16,32"], (), "(learner=linear has no hidden layer)"),
    (["--grid", "lr=1e-5,3e-5"], ("learner=cross", "steps=0"), "(cross.steps=0: no online step)"),
    (["--grid", "encoder_tuning.pretrain_lr=1e-5,2e-5"],
     ("learner=query_encoder", "retriever=hybrid", "encoder_tuning.pretrain_epochs=0"),
     "(encoder_tuning.pretrain_epochs=0)"),
    # A query encoder's pretraining batch its training questions cannot fill (it would be
    # padded until memory ran out).
    (["--grid", "encoder_tuning.pretrain_batch=8,5000"],
     ("learner=query_encoder", "retriever=hybrid"), "encoder_tuning.pretrain_batch=5000: the "),
    (["--grid", "reranker.steps=4,8", "--steps", "12"], (),
     "--steps 12 and --grid over the same steps: give one"),
    # More candidates than a conversation has units, in a sweep of runs: before any run.
    (["--grid", "k=10,400"], (), "k=400 candidates, but conversation syn-"),
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


@pytest.mark.parametrize("learner", ["query_encoder", "query_encoder,linear"])
def test_a_batch_the_training_questions_cannot_fill_is_refused_before_writing(
    three, tmp_path, capsys, learner):
  wd = tmp_path / "w"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", *SMALL, f"learner={learner}", "retriever=hybrid",
                      "holdout=1", "encoder_tuning.pretrain_batch=5000")]) == 2
  assert "encoder_tuning.pretrain_batch=5000: the " in capsys.readouterr().err
  assert not wd.exists()


def test_a_dry_run_states_the_cost_and_writes_nothing(three, tmp_path, capsys):
  wd = tmp_path / "dry"
  assert _sweep(three, wd, "--dry-run") == 0
  out = capsys.readouterr().out
  assert "4 configurations x 3 folds = 12 runs" in out
  assert re.search(r"fold 0's program compiled in \d+ s; its first chunk of \d+ ran in", out)
  assert not wd.exists()


def test_a_second_sweep_on_the_same_workdir_is_refused(three, swept, capsys):
  """A finished sweep's workdir with another grid: refused, naming what differs."""
  assert main(["sweep", "--config", "locomo", "--workdir", str(swept), "--quiet", "--grid",
               "lr=1e-4,3e-4", "--folds", "3", "--seeds", "2",
               *_sets(f"data={three}", *SMALL)]) == 2
  assert "another grid" in capsys.readouterr().err


def test_the_curve_along_conversations_cuts_each_category_into_equal_parts():
  # Conversation a: 4 questions of one category; b: 2 of category x then 4 of category y.
  diff = np.array([0.0, 0.0, 1.0, 1.0, 0.2, 0.6, 0.2, 0.2, 0.6, 0.6])
  clusters, groups = list("aaaabbbbbb"), list("ccccxxyyyy")
  first, second = by_part(diff, clusters, groups, [0] * 10, parts=2)
  # Part 1: a's first 2, b's first x and first 2 y; part 2: the rest.
  assert first.mean == pytest.approx((0.0 + 0.0 + 0.2 + 0.2 + 0.2) / 5)
  assert second.mean == pytest.approx((1.0 + 1.0 + 0.6 + 0.6 + 0.6) / 5)
  assert first.low == pytest.approx(0.0) and first.high == pytest.approx(0.2)  # a's or b's alone
  # A part no group reaches is left out; a group of one question falls in part 1.
  assert len(by_part(diff, clusters, groups, [0] * 10, parts=5)) == 4  # no group has 5
  assert len(by_part(np.arange(3.0), list("abc"), list("xyz"), [0, 1, 2], parts=5)) == 1


@pytest.mark.parametrize("sets, message", [
    (("folds=1",), "folds=1: expected 0"),
    (("folds=3", "fold=3"), "fold=3: expected 0 to 2"),
    (("fold=1",), "folds=0: set folds=N too"),
    (("folds=3", "holdout=1"), "give one or the other"),
    (("folds=9",), "folds=9: expected between 2 and the 3 conversations"),
])
def test_a_fold_that_cannot_be_held_out_is_refused(three, tmp_path, capsys, sets, message):
  wd = tmp_path / "w"
  assert main(["train", "--config", "locomo", "--workdir", str(wd), "--quiet",
               *_sets(f"data={three}", *SMALL, *sets)]) == 2
  assert message in capsys.readouterr().err
  assert not wd.exists()


def test_folds_hold_out_each_conversation_once_in_the_files_order():

  from rmmjax.replay.inputs import heldout_split  # noqa: PLC0415
  items = list("abcdefg")
  base = get_config("locomo")
  held = []
  for f in range(3):
    train, test = heldout_split(items, with_values(base, {"folds": 3, "fold": f}))
    assert sorted(train + test) == items and not set(train) & set(test)
    held += test
  assert held == items  # contiguous folds, in order
  assert heldout_split(items, base) == (items[:-2], items[-2:])  # holdout=2: the last two


@pytest.mark.slow
def test_a_grid_over_another_shape_trains_each_run_alone_with_the_same_numbers(three, swept,
                                                                               tmp_path, capsys):
  """pretrain_epochs changes the program's shape: each configuration x fold is a `train` run of
  its own, measured by `eval`; its numbers are the one-program sweep's."""
  wd = tmp_path / "seq"
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", *GRID,
               "--grid", "pretrain_epochs=2", "--folds", "3", "--seeds", "1",
               *_sets(f"data={three}", *SMALL)]) == 0
  assert "each a training of its own (its own compiles); 6 to run (0 done)" in (
      capsys.readouterr().out)
  result = json.loads((wd / "sweep.json").read_text())
  vmapped = {(r["settings"]["lr"], r["fold"]): r for r in json.loads(
      (swept / "sweep.json").read_text())["runs"] if r["seed"] == 0}
  assert len(result["runs"]) == 6
  for run in result["runs"]:
    other = vmapped[(run["settings"]["lr"], run["fold"])]
    for name in ("recall_all@5", "recall_any@5", "ndcg@10", "mrr", "recall_at_m_base"):
      assert run[name] == pytest.approx(other[name], abs=1e-6), name
  assert (wd / "best" / "summary.json").is_file()
  # A run is scored once, by eval: its own summary holds no held-out score.
  run_summary = json.loads((wd / "runs" / "000" / "fold_0" / "summary.json").read_text())
  assert "recall_at_m_final" not in run_summary and run_summary["heldout_conversations"]
  # Run again after a kill that lost one run's measurement: only that run is measured again.
  (wd / "runs" / "001" / "fold_2" / "heldout.json").unlink()
  (wd / "sweep.json").unlink()
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", *GRID,
               "--grid", "pretrain_epochs=2", "--folds", "3", "--seeds", "1",
               *_sets(f"data={three}", *SMALL)]) == 0
  assert "1 to run" in capsys.readouterr().out
  assert json.loads((wd / "sweep.json").read_text())["rows"] == result["rows"]


@pytest.mark.slow
def test_finished_runs_of_another_encoder_or_unreadable_are_refused_before_any_run(
    three, tmp_path, monkeypatch, capsys):
  """A sweep of runs resumed with another encoder would mix two encoders' rows in one table; a
  damaged measurement is named with what to do. Both before anything runs, dry run too."""
  wd = tmp_path / "seq"
  args = ["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--no-best", *GRID,
          "--grid", "pretrain_epochs=2", "--folds", "2", "--seeds", "1",
          *_sets(f"data={three}", *SMALL)]
  assert main(args) == 0
  table = (wd / "sweep.md").read_text()
  capsys.readouterr()
  import tiny_bert  # noqa: PLC0415
  monkeypatch.setenv("RMMJAX_ENCODER", str(tiny_bert.write_tiny_encoder(tmp_path / "other",
                                                                        seed=1)))
  for extra in ([], ["--dry-run"]):
    assert main([*args, *extra]) != 0
    assert "was trained with the encoder" in capsys.readouterr().err
  monkeypatch.undo()
  assert main(args) == 0  # the encoder it was trained with: nothing to run, the same table
  assert (wd / "sweep.md").read_text() == table
  damaged = wd / "runs" / "001" / "fold_1" / "heldout.json"
  damaged.write_text("{")
  capsys.readouterr()
  assert main([*args, "--dry-run"]) != 0
  assert f"delete {damaged} to measure that run again" in capsys.readouterr().err


@pytest.mark.slow
def test_the_query_encoder_sweeps_through_its_own_section(three, tmp_path, capsys):
  wd = tmp_path / "enc"
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--grid",
               "encoder_tuning.lr=1e-5,1e-4", "--folds", "2", "--seeds", "1",
               *_sets(f"data={three}", "dim=32", "learner=query_encoder", "retriever=hybrid",
                      "k=10", "log_every=4", "encoder_tuning.steps=8", "encoder_tuning.pretrain_epochs=1",
                      "encoder_tuning.pretrain_batch=8")]) == 0
  result = json.loads((wd / "sweep.json").read_text())
  assert [r["settings"] for r in result["rows"]] in (
      [{"encoder_tuning.lr": 1e-5}, {"encoder_tuning.lr": 1e-4}],
      [{"encoder_tuning.lr": 1e-4}, {"encoder_tuning.lr": 1e-5}])
  assert len(result["runs"]) == 4 and (wd / "best" / "summary.json").is_file()
  table = (wd / "sweep.md").read_text()
  assert "| encoder_tuning.lr=" in table
  assert "learner=query_encoder, 8 online steps" in table  # (no reranker's variant named)
  out = capsys.readouterr().out
  assert re.search(r"run 1/4 \(configuration 0, fold 0\) done after \d+ s; about \d+ s left", out)
  assert "run 4/4 (configuration 1, fold 1) done after " in out and "about 0 s left" in out
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--grid",
               "encoder_tuning.lr=1e-5,1e-4", "--folds", "2", "--seeds", "1", "--dry-run",
               *_sets(f"data={three}", "dim=32", "learner=query_encoder", "retriever=hybrid",
                      "k=10", "log_every=4", "encoder_tuning.steps=8",
                      "encoder_tuning.pretrain_epochs=1", "encoder_tuning.pretrain_batch=8")]) == 0
  assert "4 runs, each a training of its own (its own compiles); 0 to run (4 done)" in (
      capsys.readouterr().out)


def test_the_same_data_moved_resumes_and_other_data_is_refused(three, swept, tmp_path, capsys):
  wd = tmp_path / "moved"
  shutil.copytree(swept, wd)
  moved = tmp_path / "elsewhere.json"
  shutil.copy(three, moved)
  capsys.readouterr()
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", *GRID,
               "--folds", "3", "--seeds", "2", *_sets(f"data={moved}", *SMALL)]) == 0
  assert "0 folds to run (3 done)" in capsys.readouterr().out  # best/ resumed too
  data = json.loads(moved.read_text())
  moved.write_text(json.dumps(data[::-1]))  # the same conversations in another order
  before = (wd / "sweep.json").read_text()
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", *GRID,
               "--folds", "3", "--seeds", "2", *_sets(f"data={moved}", *SMALL)]) == 2
  assert "holds a sweep over other data" in capsys.readouterr().err
  assert (wd / "sweep.json").read_text() == before


def test_a_workdir_with_a_file_where_a_folder_goes_is_refused_first(three, tmp_path, capsys):
  wd = tmp_path / "w"
  wd.mkdir()
  (wd / "folds").write_text("")
  assert _sweep(three, wd) == 2
  assert "folds is a file" in capsys.readouterr().err
  assert sorted(p.name for p in wd.iterdir()) == ["folds"]


@pytest.mark.slow
def test_a_training_run_resumes_from_its_data_file_moved(three, tmp_path, capsys):
  wd, moved = tmp_path / "run", tmp_path / "moved.json"
  args = ["train", "--config", "locomo", "--workdir", str(wd), "--quiet"]
  assert main([*args, *_sets(f"data={three}", *SMALL)]) == 0
  shutil.copy(three, moved)
  longer = [s for s in SMALL if not s.startswith("steps=")] + ["steps=16"]
  assert main([*args, *_sets(f"data={moved}", *longer)]) == 0  # extended from the moved file
  assert json.loads((wd / "summary.json").read_text())["steps"] == 16
  moved.write_text(moved.read_text().replace("syn-", "other-"))
  assert main([*args, *_sets(f"data={moved}", *longer)]) == 2
  assert "was trained on other data than" in capsys.readouterr().err


def test_a_grid_that_turns_pretraining_off_is_read(three, tmp_path, capsys):
  # (pretrain_epochs=0 is a pretraining key whose own value is what the run reads)
  assert main(["sweep", "--config", "locomo", "--workdir", str(tmp_path / "w"), "--quiet",
               "--grid", "encoder_tuning.pretrain_epochs=0", "--folds", "3", "--dry-run",
               *_sets(f"data={three}", *SMALL, "learner=query_encoder",
                      "retriever=hybrid")]) == 0
  assert "1 configurations x 3 folds = 3 runs" in capsys.readouterr().out


def test_a_recorded_grid_key_this_run_cannot_name_is_another_sweep(three, tmp_path):
  wd = tmp_path / "w"
  wd.mkdir()
  write_run_record(wd, sweep_record({"cross.negatives_from_rank": [5]}, 1, 3, "0" * 64))
  cfg = apply_overrides(get_config("locomo"), [f"data={three}", *SMALL]).validate()
  with pytest.raises(ValueError, match="holds a sweep of another grid"):
    check_sweepable(wd, cfg, {"lr": [1e-4, 1e-3]}, 1, 3, "0" * 64)


def test_a_grid_key_spelled_with_its_section_is_the_same_sweep(three, swept, tmp_path, capsys):
  wd = tmp_path / "spelled"
  shutil.copytree(swept, wd)
  capsys.readouterr()
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--grid",
               "reranker.lr=1e-4,1e-3", "--folds", "3", "--seeds", "2", "--dry-run",
               *_sets(f"data={three}", *SMALL)]) == 0
  assert "0 folds to run (3 done)" in capsys.readouterr().out


@pytest.mark.slow
def test_four_devices_sweep_as_one_does(three, swept, tmp_path, on_four_devices):
  out = on_four_devices(f"""
      import json
      from rmmjax.cli import main
      args = ["sweep", "--config", "locomo", "--workdir", "{tmp_path / 'four'}", "--quiet",
              "--grid", "lr=1e-4,1e-3", "--folds", "3", "--seeds", "2"]
      for item in {[f"data={three}", *SMALL, "devices=4"]!r}:
        args += ["--set", item]
      assert main(args) == 0
      print(json.dumps(json.load(open("{tmp_path / 'four' / 'sweep.json'}"))["runs"]))
      """)
  four = json.loads(out.strip().splitlines()[-1])
  one = json.loads((swept / "sweep.json").read_text())["runs"]
  assert len(four) == len(one) == 12
  for a, b in zip(four, one):
    assert (a["settings"], a["fold"], a["seed"]) == (b["settings"], b["fold"], b["seed"])
    for name in ("recall_all@5", "ndcg@10", "mrr", "recall_at_m_prequential"):
      assert a[name] == pytest.approx(b[name], abs=2e-3), name


def test_a_grid_keys_base_value_does_not_matter_but_another_key_does(three, swept, tmp_path,
                                                                     capsys):
  """Every configuration sets the grid's keys, so the base value of one (a default changed
  since, or a --set of it) resumes the same sweep; any other key is another sweep."""
  wd = tmp_path / "base"
  shutil.copytree(swept, wd)
  capsys.readouterr()
  assert _sweep(three, wd, sets=("reranker.lr=0.5",)) == 0
  assert "0 folds to run (3 done)" in capsys.readouterr().out
  assert _sweep(three, wd, sets=("tau=0.3",)) == 2
  assert "reranker.tau: 1.0 there, 0.3 now" in capsys.readouterr().err


def test_an_unreadable_fold_file_is_named_with_what_to_do(three, swept, tmp_path, capsys):
  wd = tmp_path / "broken"
  shutil.copytree(swept, wd)
  (wd / "folds" / "fold_1.npz").write_bytes(b"not a zip")
  capsys.readouterr()
  assert _sweep(three, wd) == 2
  assert "fold_1.npz cannot be read as a fold's file" in capsys.readouterr().err
  np.savez(wd / "folds" / "fold_1.npz", recall=np.zeros(3))  # an array file, not a fold's
  assert _sweep(three, wd) == 2
  assert "fold_1.npz is not a fold of a sweep" in capsys.readouterr().err


@pytest.mark.slow
def test_no_best_leaves_best_out_of_the_plan_and_the_workdir(three, tmp_path, capsys):
  wd = tmp_path / "nobest"
  assert _sweep(three, wd, "--no-best") == 0
  out = capsys.readouterr().out
  assert "then best/" not in out and "(not trained: --no-best)" in out
  assert (wd / "sweep.json").is_file() and not (wd / "best").exists()
  assert main(["sweep", "--config", "latent", "--workdir", str(tmp_path / "l"), "--no-best",
               "--quiet"]) == 2
  assert "--no-best are for a sweep over replayed conversations (--config locomo)" in (
      capsys.readouterr().err)


def test_sweep_json_says_how_the_sweep_was_made(swept, three):
  made = json.loads((swept / "sweep.json").read_text())
  assert made["made_by"]["started_by"]["command"].startswith("rmmjax sweep --config locomo")
  assert made["made_by"]["written_by"]["cwd"] and made["made_by"]["written_by"]["commit"]
  assert made["data"] == str(three.resolve()) and len(made["data_sha256"]) == 64
  assert made["base_config"]["retriever"] == "bm25" and made["base_config"]["k"] == 10
  assert json.loads((swept / "config.json").read_text())["data"] == str(three.resolve())


def test_eval_reads_fewer_candidates_only_where_a_reranker_scores_pairs_alone(swept, three,
                                                                              capsys):
  """An embedding reranker's rank prior scores its K positions together: --candidates below K
  is refused before anything is read (a cross reranker reads fewer: tests/learners)."""
  assert main(["eval", "--data", str(three), "--reranker", str(swept / "best"), "--candidates",
               "5", "--in-sample"]) == 2
  assert "scores the K = 10 positions it trained on together; only a cross reranker reads fewer" \
      in capsys.readouterr().err
