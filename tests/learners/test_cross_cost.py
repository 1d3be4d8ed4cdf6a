"""A cross reranker's run costed before it starts: the count of each kind of step, against a
count made by hand, and the timing of the steps on pairs of the file's texts."""

from __future__ import annotations

import dataclasses
import math

import jax
import pytest

from cli_args import sets as _sets
from rmmjax.cli import main
from rmmjax.config import apply_overrides, get_config
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.encoder import SentenceEncoder
import rmmjax.learners.cross.cost as cost
from rmmjax.learners.cross.cost import StepTimes, at_spread, run_seconds, time_steps

TIMES = StepTimes(train_s=1.0, score_s=10.0, compile_s=100.0)


def _cfg(*sets):
  return apply_overrides(get_config("locomo"), ["variant=cross", "learner=reranker", "k=20",
                                                "batch=4", "cross.pretrain_epochs=2",
                                                "cross.pretrain_candidates=8", *sets])


def test_a_run_is_its_steps_times_their_time_with_one_compile():
  # (unvalidated configs: no data file is read)
  # 2 epochs of 10 // 4 = 2 steps; held out 5 and 3 questions: 2 + 1 batches of 4.
  assert run_seconds(_cfg("cross.steps=0"), TIMES, 10, [5, 3]) == 4 * 1.0 + 3 * 10.0 + 100.0
  # Online steps read all 20 candidates: 20 / 8 of a pretraining step each.
  assert run_seconds(_cfg("cross.steps=6"), TIMES, 10, [5, 3]) == pytest.approx(
      4.0 + 6 * 2.5 + 30.0 + 100.0)
  # mode=rl does not pretrain.
  assert run_seconds(_cfg("cross.steps=6", "mode=rl"), TIMES, 10, []) == pytest.approx(
      6 * 2.5 + 100.0)


def test_a_step_timed_at_one_row_count_is_scaled_to_the_runs_rows():
  # Timed at 20 rows; a run's batches take 18, 20, 20 and 26 (mean 21): 21 / 20 of the step,
  # and three row counts, each compiled once.
  assert at_spread(2.0, 10.0, 20, [18, 20, 20, 26]) == (pytest.approx(2.1), 30.0)
  assert at_spread(2.0, 10.0, 20, [20]) == (2.0, 10.0)


@pytest.mark.usefixtures("tiny_encoder")
def test_the_steps_are_timed_on_the_files_pairs(three, monkeypatch):
  conversations, _ = load_locomo(three)
  cfg = _cfg(f"data={three}", "dim=32", "cross.max_length=48", "k=5", "m=2",
             "cross.pretrain_candidates=4")
  # Each kind is scaled by its own batches' rows: record what the scaling is given.
  spreads = []

  def recording(step_s, compile_s, timed_rows, rows):
    spreads.append((timed_rows, rows))
    return at_spread(step_s, compile_s, timed_rows, rows)

  monkeypatch.setattr(cost, "at_spread", recording)
  times = time_steps(cfg, SentenceEncoder(), conversations)
  assert all(math.isfinite(t) and t >= 0 for t in (times.train_s, times.score_s,
                                                    times.compile_s))
  assert times.train_s > 0 and times.score_s > 0
  (train_timed, train_rows), (score_timed, score_rows) = spreads
  assert len(train_rows) == len(score_rows) == cost.SHAPE_BATCHES
  # (packed rows of 48 positions: a pretraining batch's 4 x 4 pairs, a held-out one's 4 x 5)
  assert all(0 < r <= 4 * 4 for r in train_rows) and all(0 < r <= 4 * 5 for r in score_rows)
  assert train_timed in train_rows and score_timed in score_rows
  assert sum(score_rows) > sum(train_rows)  # (more pairs a batch, more rows)


@pytest.mark.usefixtures("tiny_encoder")
@pytest.mark.parametrize("learner, timed, left", [
    ("reranker", "(the cross reranker's pretraining over the questions and the training "
                 "conversations' LoCoMo observations, if any, its online steps and held-out "
                 "scoring over K = 5 candidates, each kind",
     "; not in it: each cross run's candidate retrieval"),
    ("both", "(the query encoder's setup and steps and the cross reranker's pretraining over "
             "the questions and the training conversations' LoCoMo observations, if any, its "
             "online steps and held-out scoring over K = 5 candidates, each kind",
     "; not in it: the tuned query encoder's longer candidate turns (random turns are timed)")])
def test_a_sweep_of_cross_runs_states_its_time_before_it_starts(three, tmp_path, capsys,
                                                                 learner, timed, left):
  wd = tmp_path / "sweep"
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--dry-run", "--folds", "3",
               "--grid", "cross.pretrain_lr=1e-5,2e-5", *_sets(
                   f"data={three}", "variant=cross", f"learner={learner}", "dim=32", "k=5",
                   "m=2", "batch=2", "max_length=48", "pretrain_candidates=4",
                   "pretrain_epochs=1", "steps=0", "retriever=hybrid", "log_every=2",
                   *(("encoder_tuning.pretrain_batch=4", "encoder_tuning.steps=4")
                     if learner == "both" else ()))]) == 0
  out = capsys.readouterr().out
  assert "6 runs, each a training of its own" in out
  assert "estimated time: " in out and timed in out
  assert "best/ included" in out  # (trained unless --no-best)
  assert left in out
  # (a cross run over the base retriever's candidates reads turns as long as those timed)
  assert ("longer candidate turns" in out) == (learner == "both")
  assert not wd.exists()  # (a dry run writes nothing)


@pytest.mark.usefixtures("tiny_encoder")
def test_the_estimate_of_a_grid_over_k_names_each_k_and_no_observations_where_none_are_read(
    three, tmp_path, capsys):
  assert main(["sweep", "--config", "locomo", "--workdir", str(tmp_path / "sweep"), "--dry-run",
               "--folds", "3", "--grid", "k=5,6", *_sets(
                   f"data={three}", "variant=cross", "learner=reranker", "dim=32", "m=2",
                   "batch=2", "max_length=48", "pretrain_candidates=4", "pretrain_epochs=1",
                   "steps=0", "retriever=hybrid", "cross.observations=false")]) == 0
  assert ("(the cross reranker's pretraining over the questions, its online steps and held-out "
          "scoring over K = 5 or 6 candidates, each kind") in capsys.readouterr().out


def test_a_sweep_without_an_estimate_says_why(three, tmp_path, monkeypatch):
  from rmmjax.train.sequential_sweep import announce  # noqa: PLC0415
  conversations, _ = load_locomo(three)
  lines = []
  linear = apply_overrides(get_config("locomo"), [f"data={three}", "learner=reranker"])
  announce([linear], conversations, [[0], [1], [2]], [(0, 0)], tmp_path, False, lines.append)
  assert "made for the query encoder's and the cross reranker's runs" in lines[1]
  monkeypatch.setattr(jax, "devices", lambda *_: ["one", "two"])
  lines.clear()
  announce([_cfg(f"data={three}")], conversations, [[0], [1], [2]], [(0, 0)], tmp_path, False,
           lines.append)
  assert "these runs spread over 2" in lines[1]


@pytest.mark.usefixtures("tiny_encoder")
def test_a_query_encoder_stage_is_timed_and_counted_as_its_run_trains(three):
  from rmmjax.train.encoder_cost import StageTimes, stage_seconds, time_stage  # noqa: PLC0415
  cfg = apply_overrides(get_config("locomo"), [
      f"data={three}", "learner=both", "variant=cross", "dim=32", "k=5", "m=2", "batch=2",
      "encoder_tuning.pretrain_batch=4", "encoder_tuning.pretrain_epochs=3",
      "encoder_tuning.steps=10", "folds=3", "fold=0"])
  times = time_stage(cfg, SentenceEncoder())
  assert all(math.isfinite(t) and t >= 0 for t in dataclasses.astuple(times))
  assert times.setup_s > 0 and times.pretrain_s > 0 and times.online_s > 0
  # 3 epochs over conversations of 5 and 9 questions in batches of 4 (2 + 3 a pass), and 10
  # online steps
  one = StageTimes(setup_s=100.0, pretrain_s=1.0, online_s=10.0, compile_s=1000.0)
  assert stage_seconds(cfg, one, [5, 9]) == 100 + 3 * 5 + 10 * 10 + 1000
  assert stage_seconds(apply_overrides(cfg, ["mode=rl"]), one, [5, 9]) == 100 + 100 + 1000
