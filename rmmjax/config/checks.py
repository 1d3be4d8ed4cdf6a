"""The checks of a replay config's shared keys (rmmjax.config.Config.validate; each learner's
section checks its own): each raises ValueError naming the value and what was expected."""

from __future__ import annotations

from pathlib import Path

from rmmjax.learners import sections


def check_replay(cfg) -> None:
  """The shared keys of a replayed dataset (configs other than latent) that depend on each
  other or on the files they name (each key's own limits are declared with it)."""
  if not cfg.data:
    raise ValueError(f"config {cfg.config} replays a dataset file: pass --set data=PATH "
                     "(for example the LoCoMo dev file locomo_dev8.json)")
  if Path(cfg.data).is_dir():
    raise ValueError(f"data={cfg.data!r} is a directory; expected a LoCoMo JSON file (a list "
                     "of conversations, such as locomo_dev8.json)")
  if not Path(cfg.data).is_file():
    raise ValueError(f"data={cfg.data!r}: no such file")
  if cfg.folds or cfg.fold:
    check_folds(cfg)
  # Which learners go with which units, retriever and given encoder: each learner's section
  # says (rmmjax.learners.<name>.config).
  sections.check_replay(cfg)
  if cfg.query_encoder and cfg.retriever == "bm25":
    raise ValueError(f"query_encoder={cfg.query_encoder!r} embeds the questions of dense "
                     "search, which retriever=bm25 does not use: set retriever=dense or hybrid")
  if cfg.query_encoder and not Path(cfg.query_encoder).is_dir():
    raise ValueError(f"query_encoder={cfg.query_encoder!r}: expected a query_encoder "
                     "training workdir")
  if cfg.steps == 0 and (cfg.mode == "rl" or cfg.learning.pretrain_epochs == 0):
    name = cfg.learning.NAME  # (under learner=query_encoder,cross, the stage's own section)
    why = "mode=rl" if cfg.mode == "rl" else f"{name}.pretrain_epochs=0"
    raise ValueError(f"{name}.steps=0 with {why}: nothing would learn (no pretraining and no "
                     f"online step); give {name}.steps > 0 or {name}.pretrain_epochs > 0 with "
                     "mode=pretrain+rl")


def check_folds(cfg) -> None:
  if cfg.folds == 1 or cfg.folds < 0:
    raise ValueError(f"folds={cfg.folds}: expected 0 (hold out the last `holdout` "
                     "conversations) or at least 2")
  if not 0 <= cfg.fold < max(cfg.folds, 1):
    raise ValueError(f"fold={cfg.fold}: expected 0 to {cfg.folds - 1}" if cfg.folds else
                     f"fold={cfg.fold} names a fold, but folds=0: set folds=N too")
  if cfg.holdout != type(cfg).holdout:
    raise ValueError(f"holdout={cfg.holdout} with folds={cfg.folds}: the held-out conversations "
                     "are fold `fold`'s; give one or the other")
  if cfg.units == "lace":  # (learner=iris is refused over other units)
    raise ValueError(f"folds={cfg.folds}: IRIS's runs (units=lace) hold out the last `holdout` "
                     "conversations; leave folds unset")
