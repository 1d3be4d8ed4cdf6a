"""The checks of a replay config's values (rmmjax.config.Config.validate): each raises
ValueError naming the value and what was expected."""

from __future__ import annotations

from pathlib import Path

from rmmjax.config.choices import COMPUTE_DTYPES, CROSS_KEYS, LEARNERS, MODES, TRAIN_UNITS, TUNES
from rmmjax.retrieve.iris import IRIS_PRESETS
from rmmjax.retrieve.rankers import RETRIEVERS


# Far outside these no run learns anything (a learning rate of 10 sends the listwise loss from
# 1.8 to 768; a head at 1e9 times the encoder's rate, to 37,125): refused rather than run.
WORKING_RANGES = {"pretrain_lr": (0.0, 0.1), "encoder_pretrain_lr": (0.0, 0.1),
                  "encoder_lr": (0.0, 0.1), "pretrain_tau": (0.0, 100.0),
                  "encoder_pretrain_tau": (0.0, 100.0), "head_lr_scale": (0.0, 1e4)}


def check_replay(cfg, default) -> None:
  """The keys of a replayed dataset (configs other than latent); `default` is the latent
  config, whose values mean "not set"."""
  choices = {"dataset": ("locomo",), "units": TRAIN_UNITS, "iris": tuple(IRIS_PRESETS),
             "retriever": RETRIEVERS,
             "mode": tuple(m for m in MODES if m != "pretrain")}  # training runs learn online
  for name, options in choices.items():
    if getattr(cfg, name) not in options:
      raise ValueError(f"{name}={getattr(cfg, name)!r} is not one of {', '.join(options)}")
  if not cfg.data:
    raise ValueError(f"config {cfg.config} replays a dataset file: pass --set data=PATH "
                     "(for example the LoCoMo dev file locomo_dev8.json)")
  if not Path(cfg.data).is_file():
    raise ValueError(f"data={cfg.data!r}: no such file")
  if cfg.holdout < 0 or cfg.pretrain_epochs < 0:
    raise ValueError(f"holdout={cfg.holdout}, pretrain_epochs={cfg.pretrain_epochs}: "
                     "expected holdout >= 0 (0 trains on every conversation) and "
                     "pretrain_epochs >= 0")
  if cfg.learner not in LEARNERS:
    raise ValueError(f"learner={cfg.learner!r} is not one of {', '.join(LEARNERS)}")
  if cfg.tune not in TUNES:
    raise ValueError(f"tune={cfg.tune!r} is not one of {', '.join(TUNES)}")
  if cfg.learner != "reranker" and cfg.retriever == "bm25":
    raise ValueError(f"learner={cfg.learner} tunes the dense retriever's query encoder, but "
                     "retriever=bm25 does not use it: set retriever=dense or hybrid")
  if cfg.learner == "both" and cfg.query_encoder:
    raise ValueError(f"query_encoder={cfg.query_encoder!r} gives a reranker the candidates of "
                     "an encoder trained before, and learner=both tunes its own first: set "
                     "learner=reranker to use it")
  if cfg.learner == "query_encoder" and cfg.query_encoder:
    raise ValueError(f"query_encoder={cfg.query_encoder!r} gives a reranker its candidates; "
                     "learner=query_encoder trains one from the loaded encoder")
  if cfg.query_encoder and cfg.retriever == "bm25":
    raise ValueError(f"query_encoder={cfg.query_encoder!r} embeds the questions of dense "
                     "search, which retriever=bm25 does not use: set retriever=dense or hybrid")
  if cfg.query_encoder and not Path(cfg.query_encoder).is_dir():
    raise ValueError(f"query_encoder={cfg.query_encoder!r}: expected a query_encoder "
                     "training workdir")
  if cfg.learner == "iris" and cfg.units != "lace":
    raise ValueError(f"learner=iris learns IRIS's gap diagnosis over LaceMem's facts: set "
                     f"units=lace (not {cfg.units!r})")
  if cfg.units == "lace" and cfg.learner not in ("reranker", "iris"):
    raise ValueError(f"units=lace trains a model of IRIS: set learner=reranker (it ranks "
                     f"IRIS's evidence) or learner=iris (IRIS's own models), not "
                     f"learner={cfg.learner!r}")
  if cfg.units == "lace" and cfg.learner == "reranker" and cfg.query_encoder:
    raise ValueError("units=lace with learner=reranker ranks IRIS's evidence by the base "
                     "encoder: leave query_encoder unset (learner=iris takes one as anchor)")
  if cfg.citation_reward < 0 or cfg.verdict_reward < 0 or not (
      cfg.citation_reward or cfg.verdict_reward):
    raise ValueError(f"citation_reward={cfg.citation_reward}, verdict_reward="
                     f"{cfg.verdict_reward}: expected weights >= 0, not both 0")
  if cfg.units != "lace" and cfg.iris != "default":
    raise ValueError(f"iris={cfg.iris!r} sets how IRIS gathers a reranker's candidates; "
                     f"units={cfg.units!r} takes them from the base retriever: set "
                     "units=lace, or leave iris at default")
  if cfg.units != "lace" and (cfg.verdict_reward or cfg.citation_reward != 1.0):
    raise ValueError(f"citation_reward and verdict_reward weigh the rewards of units=lace "
                     f"(IRIS's judge); units={cfg.units!r} learns from citations alone")
  check_iris(cfg, default)
  check_cross(cfg, default)
  if cfg.steps == 0 and (cfg.mode == "rl" or cfg.pretrain_epochs == 0):
    raise ValueError(f"steps=0 with {'mode=rl' if cfg.mode == 'rl' else 'pretrain_epochs=0'}: "
                     "nothing would learn (no pretraining and no online step); give steps > 0 "
                     "or pretrain_epochs > 0 with mode=pretrain+rl")
  if cfg.encoder_pretrain_epochs < 0 or cfg.encoder_pretrain_batch < 1:
    raise ValueError(f"encoder_pretrain_epochs={cfg.encoder_pretrain_epochs}, "
                     f"encoder_pretrain_batch={cfg.encoder_pretrain_batch}: expected epochs "
                     ">= 0 and a batch >= 1")
  for name, (low, high) in WORKING_RANGES.items():
    if not low < getattr(cfg, name) <= high:
      raise ValueError(f"{name}={getattr(cfg, name):g}: expected a value in ({low:g}, {high:g}]")

def check_iris(cfg, default) -> None:
  """The keys of learner=iris."""
  if cfg.learner != "iris":
    changed = [f"{name}={getattr(cfg, name)!r}" for name in ("iris_k", "iris_hard_share",
                                                               "validation")
               if getattr(cfg, name) != getattr(default, name)]
    if changed:
      raise ValueError(f"{', '.join(changed)}: these keys configure learner=iris, not "
                       f"learner={cfg.learner}")
    return
  if cfg.iris_k < max(4, cfg.m):
    raise ValueError(f"iris_k={cfg.iris_k}: expected at least 4 candidate facts per example "
                     f"(a quarter of them evidence) and at least m={cfg.m}")
  if not 0.0 <= cfg.iris_hard_share <= 1.0:
    raise ValueError(f"iris_hard_share={cfg.iris_hard_share}: expected a share in [0, 1]")
  if cfg.validation < 0:
    raise ValueError(f"validation={cfg.validation}: expected 0 (no check) or a number of "
                     "conversations")
  if cfg.holdout and cfg.validation != default.validation:
    raise ValueError(f"validation={cfg.validation} applies with holdout=0; with "
                     f"holdout={cfg.holdout} the held-out conversations check the fit")


def check_cross(cfg, default) -> None:
  """The keys of variant=cross."""
  if cfg.variant != "cross":
    changed = [f"{name}={getattr(cfg, name)!r}" for name in CROSS_KEYS
               if getattr(cfg, name) != getattr(default, name)]
    if changed:
      raise ValueError(f"{', '.join(changed)}: these keys configure variant=cross, not "
                       f"variant={cfg.variant}")
    return
  if cfg.learner not in ("reranker", "both"):
    raise ValueError(f"variant=cross is a reranker: set learner=reranker (or both, to rerank a "
                     f"query encoder it tunes first), not learner={cfg.learner}")
  if not 0 <= cfg.prior_scale <= 100:
    raise ValueError(f"prior_scale={cfg.prior_scale:g}: expected a value in [0, 100] (the "
                     "spread of the base positions' starting prior, in temperature units)")
  if not 16 <= cfg.cross_max_length <= 512:
    raise ValueError(f"cross_max_length={cfg.cross_max_length}: expected 16 to 512 tokens (the "
                     "encoder's window)")
  if not 2 <= cfg.cross_pretrain_candidates <= cfg.k:
    raise ValueError(f"cross_pretrain_candidates={cfg.cross_pretrain_candidates}: expected 2 to "
                     f"k={cfg.k}")
  if cfg.compute_dtype not in ("auto", *COMPUTE_DTYPES):
    raise ValueError(f"compute_dtype={cfg.compute_dtype!r} is not one of auto, "
                     f"{', '.join(COMPUTE_DTYPES)}")
