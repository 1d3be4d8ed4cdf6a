"""Which sections of the config a run trains, in order, by its `learner`: a learner of the
registry, or the query encoder then a reranker family (`query_encoder,cross`: the reranker
learns over the candidates of the encoder tuned first). rmmjax.config reads this table."""

from __future__ import annotations

from rmmjax.learners.cross.config import Cross
from rmmjax.learners.embedding.config import Reranker
from rmmjax.learners.iris.config import IrisEvidence, IrisModels
from rmmjax.learners.query_encoder.config import EncoderTuning

SECTIONS = {s.NAME: s for s in (Reranker, Cross, EncoderTuning, IrisEvidence, IrisModels)}

# A reranker family with a section of its own; any other (linear, mlp, a family registered
# without one) trains with the embedding rerankers' keys.
FAMILY_SECTIONS = {"cross": Cross}
# The learners that rank nothing, and the sections each trains, in order; the last is the one
# whose online steps the training loop runs.
NOT_RERANKERS = {"query_encoder": (EncoderTuning,), "iris": (IrisModels, EncoderTuning)}
# The stage a list may start with: it trains in a workdir of its name inside the run's.
FIRST_STAGE = "query_encoder"
# The sections units trains before the reranker (IRIS gathers its evidence from LaceMem's facts).
BEFORE_RERANKER = {"lace": (IrisEvidence,)}


def stages(learner: str) -> list[str]:
  """The learners a run trains, in order."""
  return learner.split(",")


def check_learner(learner: str) -> None:
  """Refuses a list of stages other than the query encoder then a reranker family."""
  *first, last = stages(learner)
  if first and (first != [FIRST_STAGE] or last in NOT_RERANKERS):
    raise ValueError(f"learner={learner!r}: expected one learner, or {FIRST_STAGE},FAMILY (a "
                     "query encoder tuned first, then a reranker family over its candidates, "
                     f"as {FIRST_STAGE},cross)")


def section_names(learner: str, units: str, latent: bool) -> tuple[str, ...]:
  """The sections of a run that trains `learner`, in order (config latent: its family's alone)."""
  names = []
  for stage in stages(learner):
    if stage in NOT_RERANKERS:
      names += NOT_RERANKERS[stage]
    else:
      names += (() if latent else BEFORE_RERANKER.get(units, ())) + (
          FAMILY_SECTIONS.get(stage, Reranker),)
  return tuple(s.NAME for s in names)


def reranker_family(learner: str) -> str | None:
  """The reranker family a run of `learner` ends with, or None where it ranks nothing."""
  last = stages(learner)[-1]
  return None if last in NOT_RERANKERS else last


def check_replay(cfg) -> None:
  """Each section's checks of the shared keys of a replay (the run's own learner first)."""
  for name in reversed(cfg.section_names()):
    getattr(cfg, name).check_replay(cfg)
