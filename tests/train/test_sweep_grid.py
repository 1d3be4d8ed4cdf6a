"""A sweep's configurations: the base values checked as each grid point sets its keys, k against
the units before any run, and one query encoder stage per fold shared by its runs."""

import json

import pytest

from cli_args import sets
from rmmjax.cli import main
from rmmjax.config import apply_overrides, get_config
from rmmjax.train.sweep.grid import sweep_configs


def _locomo(data, *sets):
  return apply_overrides(get_config("locomo"), [f"data={data}", "learner=query_encoder,cross", *sets])


def test_a_grid_may_lift_the_base_values_refusal(three):
  base = _locomo(three, "k=6")  # the base's 8 pretraining candidates are more than k
  with pytest.raises(ValueError, match="cross.pretrain_candidates=8: expected 2 to"):
    base.validate()
  configs = sweep_configs(base, {"cross.pretrain_candidates": [2, 4]}, seeds=2)
  assert [(c.cross.pretrain_candidates, c.seed) for c in configs] == [(2, 0), (2, 1), (4, 0),
                                                                       (4, 1)]


def test_a_refused_point_is_named_and_a_refusal_of_the_base_alone_is_not(three):
  with pytest.raises(ValueError, match=r"^--grid point cross.pretrain_candidates=12: "
                                       r"cross.pretrain_candidates=12: expected 2 to"):
    sweep_configs(_locomo(three, "k=10"), {"cross.pretrain_candidates": [4, 12]}, seeds=1)
  with pytest.raises(ValueError, match=r"^cross.pretrain_candidates=8: expected 2 to"):
    sweep_configs(_locomo(three, "k=6"), {"cross.lr": [1e-5, 2e-5]}, seeds=1)
  # A refusal naming no grid key is the base's, though the base alone is refused first by
  # another (which the grid lifts); a key of another section is not the grid's
  with pytest.raises(ValueError, match=r"^m=9 > k=6"):
    sweep_configs(_locomo(three, "k=6", "m=9"), {"cross.pretrain_candidates": [2, 4]}, seeds=1)
  both = apply_overrides(get_config("locomo"), [f"data={three}", "learner=query_encoder,linear",
                                                "reranker.lr=-1"])
  with pytest.raises(ValueError, match=r"^reranker.lr=-1"):
    sweep_configs(both, {"encoder_tuning.lr": [1e-5, 2e-5]}, seeds=1)
  # (the k of checkpoint_every is not the grid's k)
  with pytest.raises(ValueError, match=r"^checkpoint_every=15 is not a multiple"):
    sweep_configs(_locomo(three, "checkpoint_every=15", "log_every=10"), {"k": [10, 20]},
                  seeds=1)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_encoder")
def test_the_command_line_checks_the_base_only_through_the_grid(three, tmp_path, capsys):
  wd = tmp_path / "w"
  args = ["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--folds", "3",
          "--dry-run", *sets(f"data={three}", "learner=cross", "dim=32",
                             "retriever=bm25", "k=6", "cross.max_length=32")]
  assert main(args + ["--grid", "cross.pretrain_candidates=2,4"]) == 0
  assert "2 configurations x 3 folds = 6 runs" in capsys.readouterr().out
  assert main(args + ["--grid", "cross.pretrain_candidates=4,8"]) == 2
  assert "--grid point cross.pretrain_candidates=8: " in capsys.readouterr().err
  assert not wd.exists()


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_encoder")
def test_more_candidates_than_topics_is_refused_before_a_sweep_of_runs_writes(three, tmp_path,
                                                                              capsys):
  wd = tmp_path / "w"
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--folds", "3",
               "--grid", "k=6,8", *sets(f"data={three}", "learner=cross", "dim=32", "retriever=bm25", "units=topic",
                                         "cross.pretrain_candidates=4")]) == 2
  assert "k=6 candidates, but conversation syn-1 has only 2 topic units" in capsys.readouterr().err
  assert not wd.exists()


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_encoder")
def test_a_grid_over_cross_keys_trains_one_query_encoder_stage_per_fold(three, tmp_path):
  wd = tmp_path / "w"
  assert main(["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--folds", "2",
               "--no-best", "--grid", "cross.pretrain_lr=1e-5,2e-5",
               *sets(f"data={three}", "learner=query_encoder,cross", "dim=32", "k=5", "m=2",
                     "batch=2", "log_every=2", "cross.max_length=48",
                     "cross.pretrain_candidates=4", "cross.pretrain_epochs=1", "cross.steps=0",
                     "encoder_tuning.pretrain_batch=4", "encoder_tuning.steps=4")]) == 0
  for fold in (0, 1):
    first, second = (wd / "runs" / run / f"fold_{fold}" / "query_encoder" for run in ("000", "001"))
    # The second configuration's stage is the first's, copied (its files keep their times),
    # not trained again; and it is a finished run of its own
    assert (second / "summary.json").read_text() == (first / "summary.json").read_text()
    for path in (first / "checkpoints").rglob("*"):
      copied = second / path.relative_to(first)
      assert copied.stat().st_mtime == path.stat().st_mtime, copied
    assert not list(second.parent.glob(".query_encoder.*"))  # (no copy left half made)
  held = [json.loads((wd / "runs" / run / "fold_0" / "heldout.json").read_text())
          for run in ("000", "001")]
  assert held[0]["settings"] != held[1]["settings"]
