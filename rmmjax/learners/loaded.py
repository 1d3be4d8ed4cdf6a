"""A trained reranker as the shell holds it: its parameters, core spec, hyperparameters and
the record of what it was trained on, whichever learner it is."""

from __future__ import annotations

import dataclasses

from rmmjax import core


@dataclasses.dataclass(frozen=True)
class LoadedReranker:
  source: str  # the workdir or file it came from
  params: dict
  spec: core.CoreSpec
  hparams: core.HParams
  record: dict
  step: int | None = None  # the training step of these weights
  planned_steps: int | None = None  # the steps its workdir's run was set to reach
