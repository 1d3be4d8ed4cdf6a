"""A cross reranker's run costed before it starts: the count of each kind of step, against a
count made by hand, and the timing of the steps on pairs of the file's texts."""

from __future__ import annotations

import math

import jax
import pytest

from cli_args import sets as _sets
from rmmjax.cli import main
from rmmjax.config import apply_overrides, get_config
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.learners.cross.cost import StepTimes, run_seconds, time_steps

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


@pytest.mark.usefixtures("tiny_encoder")
def test_the_steps_are_timed_on_the_files_pairs(three):
  conversations, _ = load_locomo(three)
  cfg = _cfg(f"data={three}", "dim=32", "cross.max_length=48", "k=5", "m=2",
             "cross.pretrain_candidates=4")
  times = time_steps(cfg, SentenceEncoder(), conversations)
  assert all(math.isfinite(t) and t >= 0 for t in (times.train_s, times.score_s,
                                                    times.compile_s))
  assert times.train_s > 0 and times.score_s > 0


@pytest.mark.usefixtures("tiny_encoder")
def test_a_sweep_of_cross_runs_states_its_time_before_it_starts(three, tmp_path, capsys):
  wd = tmp_path / "sweep"
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--dry-run", "--folds", "3",
               "--grid", "cross.pretrain_lr=1e-5,2e-5", *_sets(
                   f"data={three}", "variant=cross", "learner=reranker", "dim=32", "k=5",
                   "m=2", "batch=2", "max_length=48", "pretrain_candidates=4",
                   "pretrain_epochs=1", "steps=0")]) == 0
  out = capsys.readouterr().out
  assert "6 runs, each a training of its own" in out
  assert "estimated time: " in out and "in the cross reranker's steps" in out
  assert "best/ included" in out  # (trained unless --no-best)
  assert not wd.exists()  # (a dry run writes nothing)


def test_a_sweep_without_an_estimate_says_why(three, tmp_path, monkeypatch):
  from rmmjax.train.sequential_sweep import announce  # noqa: PLC0415
  conversations, _ = load_locomo(three)
  lines = []
  encoder = apply_overrides(get_config("locomo"), [f"data={three}", "learner=query_encoder",
                                                   "retriever=hybrid"])
  announce([encoder], conversations, [[0], [1], [2]], [(0, 0)], tmp_path, False, lines.append)
  assert "made for the cross reranker's runs alone" in lines[1]
  monkeypatch.setattr(jax, "devices", lambda *_: ["one", "two"])
  lines.clear()
  announce([_cfg(f"data={three}")], conversations, [[0], [1], [2]], [(0, 0)], tmp_path, False,
           lines.append)
  assert "these runs spread over 2" in lines[1]
