"""The configuration's learner sections: which keys a run has, how `--set` reaches them, and
config.json."""

import importlib
import json
from pathlib import Path

import pytest

from rmmjax.config import apply_overrides, encoder_stage, from_json, get_config, get_value
from rmmjax.io.workdir import read_config
from rmmjax.learners import sections
from rmmjax.learners.cross.config import PRETRAIN_LOSSES, Cross
from rmmjax.learners.embedding.config import Reranker
from rmmjax.learners.query_encoder.config import EncoderTuning
from rmmjax.train.sweep.grid import parse_grid, sweep_configs

DATA = "data=/data/locomo_dev8.json"  # (never read here)


@pytest.mark.parametrize("overrides, names", [
    ([], ("encoder_tuning",)),
    (["learner=linear"], ("reranker",)),
    (["learner=query_encoder,cross"], ("encoder_tuning", "cross")),
    (["learner=cross", "units=lace"], ("iris_evidence", "cross")),
    (["learner=iris", "units=lace"], ("iris_models", "encoder_tuning")),
])
def test_a_run_holds_the_sections_of_the_learners_it_trains(overrides, names):
  cfg = apply_overrides(get_config("locomo"), [DATA, *overrides])
  assert cfg.section_names() == names
  for name in sections.SECTIONS:
    assert (getattr(cfg, name) is not None) == (name in names), name
  assert cfg.learning is getattr(cfg, names[-1])
  assert get_config("latent").section_names() == ("reranker",)


def test_a_key_by_its_name_alone_is_the_run_s_own_learners_first():
  cfg = apply_overrides(get_config("locomo"), [DATA, "learner=query_encoder,cross", "lr=3e-5",
                                               "tau=0.5", "encoder_tuning.lr=2e-6",
                                               "max_length=64"])
  assert (cfg.cross.lr, cfg.cross.tau, cfg.cross.max_length) == (3e-5, 0.5, 64)
  assert (cfg.encoder_tuning.lr, cfg.encoder_tuning.tau) == (2e-6, 0.05)
  assert get_value(cfg, "lr") == 3e-5 and get_value(cfg, "encoder_tuning.lr") == 2e-6
  # The online steps' hyperparameters are the learner's whose steps the run takes.
  assert (float(cfg.hparams().lr), float(cfg.hparams().tau)) == pytest.approx((3e-5, 0.5))


def test_no_learner_rewrites_another_s_defaults():
  locomo = get_config("locomo")
  cross = apply_overrides(locomo, [DATA, "learner=query_encoder,cross"])
  alone = apply_overrides(locomo, [DATA, "learner=query_encoder"])
  assert cross.encoder_tuning == alone.encoder_tuning == EncoderTuning()
  assert cross.cross == Cross() and (cross.steps, cross.learning.tau) == (0, 1.0)
  # The encoder stage of a cross run is the plain query-encoder run.
  assert encoder_stage(cross) == alone
  # The named config's own reranker values stay its own.
  linear = apply_overrides(locomo, [DATA, "learner=linear"])
  assert (linear.reranker.tau, linear.reranker.lr, linear.reranker.rank_prior) == (1.0, 3e-5,
                                                                                   True)
  assert get_config("latent").reranker == Reranker()


@pytest.mark.parametrize("overrides, message", [
    (["max_length=64"], r"'max_length' for this run \(config=locomo, learner=query_encoder\): "
                        "it belongs to the cross section"),
    (["learner=linear", "cross.lr=1e-5"], "has no cross section; its sections: reranker"),
    (["variant=cross"], "'variant': name the reranker family as the learner .learner=cross"),
    (["learner=linear", "tune=both"], "belongs to the encoder_tuning section"),
    (["learner=query_encoder,cross", "cross_max_length=64"],
     r"unknown config key 'cross_max_length' \(did you mean 'cross.max_length'\?\)"),
    (["nosuch.lr=1"], "unknown config section 'nosuch'"),
    (["encoder_tuning.nosuch=1"], "the encoder_tuning section's keys: tau, lr, steps"),
    (["nonsense=1"], "unknown config key 'nonsense'; known keys:"),
    (["encoder_tuning.lr=fast"], r"encoder_tuning.lr='fast': expected a finite number"),
    ([".lr=1"], r"config key '.lr': expected KEY or SECTION.KEY"),
    (["reranker..lr=1"], r"expected KEY or SECTION.KEY"),
    (["learner=linear", "rank_prior=maybe"], "rank_prior='maybe': expected true or false"),
    (["config=latent"], "the named config is chosen by --config"),
])
def test_keys_a_run_does_not_have_are_refused_naming_where_they_are(overrides, message):
  with pytest.raises(ValueError, match=message):
    apply_overrides(get_config("locomo"), overrides)


@pytest.mark.parametrize("overrides, message", [
    (["encoder_tuning.lr=0.5"], r"encoder_tuning.lr=0.5: expected a value in \(0, 0.1\]"),
    (["encoder_tuning.pretrain_batch=0"], "encoder_tuning.pretrain_batch=0: expected an integer >= 1"),
    (["encoder_tuning.tune=all"], "encoder_tuning.tune='all' is not one of query, both"),
    (["learner=iris", "units=lace", "iris_models.hard_share=2"], r"hard_share=2: expected"),
    (["learner=linear", "units=lace", "iris_evidence.preset=narrow"], "preset='narrow'"),
    (["learner=linear", "reranker.rank_prior=false", "reranker.prior_scale=2"],
     "reranker.prior_scale=2.0: where the rank prior starts; expected reranker.rank_prior=true"),
    (["learner=linear", "reranker.rank_prior=true", "reranker.prior_scale=-1"],
     r"reranker.prior_scale=-1: expected a value in \[0, 100\]"),
    (["learner=query_encoder,cross", "cross.pretrain_loss=listnet"],
     "cross.pretrain_loss='listnet' is not one of softmax, lambda, weakest"),
])
def test_a_section_checks_its_own_values(overrides, message, tmp_path):
  data = tmp_path / "d.json"
  data.write_text("[]")
  with pytest.raises(ValueError, match=message):
    apply_overrides(get_config("locomo"), [f"data={data}", *overrides]).validate()


def test_config_json_round_trips_and_refuses_what_does_not_belong():
  cfg = apply_overrides(get_config("locomo_cross"), [DATA, "max_length=64"])
  data = json.loads(cfg.to_json())
  assert set(data) & set(sections.SECTIONS) == {"cross", "encoder_tuning"}
  assert from_json(cfg.to_json()) == cfg
  with pytest.raises(ValueError, match="section 'iris_models' does not belong to this run"):
    from_json(json.dumps(data | {"iris_models": {"k": 32}}))
  with pytest.raises(ValueError, match=r"unknown keys \['width'\] in section 'cross'"):
    from_json(json.dumps(data | {"cross": data["cross"] | {"width": 3}}))


def test_a_config_json_without_a_key_is_refused_naming_it(tmp_path):
  """A config.json written by another version lacks a key (or holds one no longer known): it
  is refused in one line, not read with today's default, which may not be what the run did."""
  cfg = apply_overrides(get_config("locomo"), [DATA, "learner=query_encoder,cross"])
  data = json.loads(cfg.to_json())
  del data["cross"]["observations"], data["sweep_chunk"]
  (tmp_path / "config.json").write_text(json.dumps(data))
  with pytest.raises(ValueError, match=r"config.json is not a readable rmmjax config \(no "
                                       r"value for sweep_chunk, cross.observations: written by "
                                       r"another version of rmmjax"):
    read_config(tmp_path)
  with pytest.raises(ValueError, match="section 'cross': expected an object of its keys"):
    from_json(json.dumps({k: v for k, v in data.items() if k != "cross"}))
  with pytest.raises(ValueError, match=r"cross.observations=True: expected text"):
    from_json(json.dumps(json.loads(cfg.to_json()) | {"cross": data["cross"] | {
        "observations": True}}))


@pytest.mark.parametrize("learner", ["cross", "query_encoder,cross", "mlp", "query_encoder,linear",
                                     "iris"])
def test_naming_the_learner_sets_no_other_key(learner):
  locomo = get_config("locomo")
  cfg = apply_overrides(locomo, [DATA, f"learner={learner}"])
  assert [k for k, v in cfg.values().items() if "." not in k and v != locomo.values()[k]] == [
      "learner", "data"]


def test_the_locomo_cross_config_is_the_locomo_config_with_its_learner_and_k():
  locomo, cross = get_config("locomo"), get_config("locomo_cross")
  assert (cross.learner, cross.k, cross.section_names()) == ("query_encoder,cross", 50,
                                                             ("encoder_tuning", "cross"))
  assert [k for k, v in cross.values().items() if "." not in k and v != locomo.values()[k]] == [
      "config", "learner", "k"]
  # (a reranker family named on it keeps the locomo config's tuned values of its section)
  assert apply_overrides(cross, [DATA, "learner=linear"]).reranker == apply_overrides(
      locomo, [DATA, "learner=linear"]).reranker


def test_a_list_of_stages_other_than_the_encoder_then_a_family_is_refused():
  from rmmjax.learners.registry import training_task  # noqa: PLC0415
  for learner in ("cross,query_encoder", "query_encoder,iris"):
    with pytest.raises(ValueError, match="expected one learner, or query_encoder,FAMILY"):
      apply_overrides(get_config("locomo"), [DATA, f"learner={learner}"]).validate()
  with pytest.raises(ValueError, match="learner='cubic': expected one of linear, mlp, cross"):
    training_task(apply_overrides(get_config("locomo"), [DATA, "learner=query_encoder,cubic"]))


def test_the_locomo_cross_config_is_the_cross_sweep_s_best_arm(monkeypatch):
  """The locomo_cross config's defaults are experiments/sweep_cross.py's arm k50-observations-prior0,
  but for what changes no number: the loop's output cadence, compute_dtype auto (float32 on a
  CPU, as pinned there) and observations auto (read from the dev file as true reads them:
  tests/learners/test_cross_observations.py)."""
  monkeypatch.syspath_prepend(str(Path(__file__).parents[2] / "experiments"))
  sweep_cross = importlib.import_module("sweep_cross")
  arm = sweep_cross.ARMS["k50-observations-prior0"]
  named = {a.split("=")[0] for a in arm}
  pinned = [s for s in sweep_cross.RECIPE if s.split("=")[0] not in named] + list(arm)
  swept = apply_overrides(get_config("locomo"), [DATA, *pinned]).values()
  default = apply_overrides(get_config("locomo_cross"), [DATA]).values()
  assert set(swept) == set(default)
  assert {k: (swept[k], default[k]) for k in swept if swept[k] != default[k]} == {
      "config": ("locomo", "locomo_cross"), "log_every": (5, 10), "checkpoint_every": (20, 100),
      "cross.compute_dtype": ("float32", "auto"), "cross.observations": ("true", "auto")}


@pytest.mark.parametrize("damage, message", [
    (lambda d: d | {"reranker": 3}, "section 'reranker': expected an object of its keys"),
    (lambda d: d | {"reranker": None}, "section 'reranker': expected an object of its keys"),
    (lambda d: d | {"reranker": d["reranker"] | {"tau": "abc"}},
     "reranker.tau='abc': expected a finite number"),
    (lambda d: d | {"k": 2.5}, "k=2.5: expected an integer"),
    (lambda d: [d], "expected a JSON object of config keys, not a list"),
])
def test_a_damaged_config_json_is_refused_naming_the_file(damage, message, tmp_path):
  data = json.loads(get_config("latent").to_json())
  (tmp_path / "config.json").write_text(json.dumps(damage(data)))
  with pytest.raises(ValueError, match=message) as err:
    read_config(tmp_path)
  assert str(tmp_path / "config.json") in str(err.value)
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(ValueError, match="config.json is not a readable rmmjax config"):
    read_config(tmp_path)


def test_a_sweep_grid_names_a_section_key_either_way():
  latent = get_config("latent")
  assert parse_grid(["reranker.tau=0.1,0.5"], latent) == {"reranker.tau": [0.1, 0.5]}
  configs = sweep_configs(latent, {"reranker.tau": [0.1, 0.5], "lr": [0.01]}, 1)
  assert [(c.reranker.tau, c.reranker.lr) for c in configs] == [(0.1, 0.01), (0.5, 0.01)]
  with pytest.raises(ValueError, match="changes the compiled program"):
    parse_grid(["reranker.hidden=64,128"], latent)


def test_the_pretraining_losses_a_config_names_are_the_core_s():
  from rmmjax import core
  assert tuple(core.losses.PRETRAIN_LOSSES) == PRETRAIN_LOSSES
