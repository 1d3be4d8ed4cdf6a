"""IRIS's sections of the config: a reranker over its evidence (units=lace) and its own models
(learner=iris)."""

from __future__ import annotations

import dataclasses

from rmmjax.learners.section import Section, key
from rmmjax.retrieve.iris import IRIS_PRESETS


@dataclasses.dataclass(frozen=True)
class IrisEvidence(Section):
  """A reranker over the evidence IRIS gathers with `preset` (units=lace): it learns from
  simulated citations plus the heuristic judge's verdict on its facts (which needs no labels)."""

  NAME = "iris_evidence"
  preset: str = key("default", choices=tuple(IRIS_PRESETS))
  citation_reward: float = key(1.0, low=0.0)
  verdict_reward: float = key(0.0, low=0.0)

  def check(self, cfg) -> None:
    if not (self.citation_reward or self.verdict_reward):
      raise ValueError(f"iris_evidence.citation_reward={self.citation_reward}, "
                       f"verdict_reward={self.verdict_reward}: expected weights >= 0, not both 0")

  def check_replay(self, cfg) -> None:
    if cfg.query_encoder and cfg.section_names()[0] == self.NAME:  # (no stage tunes one first)
      raise ValueError(f"units=lace with learner={cfg.learner} ranks IRIS's evidence by the base "
                       "encoder: leave query_encoder unset (learner=iris takes one as anchor)")


@dataclasses.dataclass(frozen=True)
class IrisModels(Section):
  """IRIS's own models (learner=iris; its keys: docs/command-line.md). `k` 64 and `hard_share`
  0.5 were chosen on one split of the dev file (held-out Recall@10 of the anchor 0.704, against
  0.666 with hard negatives only and 0.595 for the base encoder)."""

  NAME = "iris_models"
  k: int = 64
  hard_share: float = key(0.5, low=0.0, high=1.0)
  validation: int = key(1, low=0)  # (0: no check)

  def check(self, cfg) -> None:
    if self.k < max(4, cfg.m):
      raise ValueError(f"iris_models.k={self.k}: expected at least 4 candidate facts per "
                       f"example (a quarter of them evidence) and at least m={cfg.m}")
    if cfg.holdout and self.validation != IrisModels.validation:
      raise ValueError(f"iris_models.validation={self.validation} applies with holdout=0; with "
                       f"holdout={cfg.holdout} the held-out conversations check the fit")
    # IRIS's fits are not online steps: a run of its pretraining alone has nothing to stand on.
    if cfg.steps == 0:
      raise ValueError(f"{cfg.learning.NAME}.steps=0: expected a positive integer (0, "
                       "pretraining alone, is for a reranker family or the query encoder)")

  def check_replay(self, cfg) -> None:
    if cfg.units != "lace":
      raise ValueError(f"learner={cfg.learner} learns IRIS's gap diagnosis over LaceMem's facts: "
                       f"set units=lace (not {cfg.units!r})")

