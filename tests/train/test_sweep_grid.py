"""A sweep's configurations: the base values are checked as each grid point sets its keys."""

import pytest

from cli_args import sets
from rmmjax.cli import main
from rmmjax.config import apply_overrides, get_config
from rmmjax.train.sweeps import sweep_configs


def _locomo(data, *sets):
  return apply_overrides(get_config("locomo"), [f"data={data}", "variant=cross", *sets])


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
  # (the k of checkpoint_every is not the grid's k)
  with pytest.raises(ValueError, match=r"^checkpoint_every=15 is not a multiple"):
    sweep_configs(_locomo(three, "checkpoint_every=15", "log_every=10"), {"k": [10, 20]},
                  seeds=1)


@pytest.mark.slow
@pytest.mark.usefixtures("tiny_encoder")
def test_the_command_line_checks_the_base_only_through_the_grid(three, tmp_path, capsys):
  wd = tmp_path / "w"
  args = ["sweep", "--config", "locomo", "--workdir", str(wd), "--quiet", "--folds", "3",
          "--dry-run", *sets(f"data={three}", "variant=cross", "learner=reranker", "dim=32",
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
               "--grid", "k=6,8", *sets(f"data={three}", "variant=cross", "learner=reranker",
                                         "dim=32", "retriever=bm25", "units=topic",
                                         "cross.pretrain_candidates=4")]) == 2
  assert "k=6 candidates, but conversation syn-1 has only 2 topic units" in capsys.readouterr().err
  assert not wd.exists()
