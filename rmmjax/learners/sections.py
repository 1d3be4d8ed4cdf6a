"""Which sections of the config a run trains, in order, by its learner: the one table of them
(rmmjax.config reads it; each section's keys, defaults and checks are in its learner's folder)."""

from __future__ import annotations

from rmmjax.learners.cross.config import Cross
from rmmjax.learners.embedding.config import Reranker
from rmmjax.learners.iris.config import IrisEvidence, IrisModels
from rmmjax.learners.query_encoder.config import EncoderTuning

SECTIONS = {s.NAME: s for s in (Reranker, Cross, EncoderTuning, IrisEvidence, IrisModels)}

# A reranker family with a section of its own; any other (linear, mlp, a family registered
# without one) trains with the embedding rerankers' keys.
FAMILY_SECTIONS = {"cross": Cross}
# What each value of the `learner` key trains, in order; the last is the one whose online steps
# the training loop runs. RERANKER stands for the reranker family's section.
RERANKER = "the reranker"
LEARNER_SECTIONS = {
    "reranker": (RERANKER,),
    "query_encoder": (EncoderTuning,),
    "both": (EncoderTuning, RERANKER),
    "iris": (IrisModels, EncoderTuning),
}
# Where a learner=both run's first stage is trained (as the learner it names, in a workdir of
# that name inside the run's); the variant a learner that trains no reranker takes a named family
# to mean (over a tuned encoder: apply_overrides).
FIRST_STAGES = {"both": "query_encoder"}
WITH_A_RERANKER = {"query_encoder": "both"}
# The sections units trains before the reranker (IRIS gathers its evidence from LaceMem's facts).
BEFORE_RERANKER = {"lace": (IrisEvidence,)}


def section_names(learner: str, variant: str, units: str, latent: bool) -> tuple[str, ...]:
  """The sections of a run that trains `learner` (the reranker's family `variant`), in the order
  it trains them; the last is the one whose online steps the training loop runs (the latent
  simulator trains the family alone)."""
  family = FAMILY_SECTIONS.get(variant, Reranker)
  kinds = (RERANKER,) if latent else LEARNER_SECTIONS.get(learner, (RERANKER,))  # (validated later)
  stages = []
  for kind in kinds:
    if kind is RERANKER:
      stages += () if latent else BEFORE_RERANKER.get(units, ())
      stages.append(family)
    else:
      stages.append(kind)
  return tuple(s.NAME for s in stages)


def trains_a_reranker(learner: str) -> bool:
  """Whether a run of `learner` ends with a reranker (its family is then the run's `variant`)."""
  return RERANKER in LEARNER_SECTIONS.get(learner, (RERANKER,))


def check_replay(cfg) -> None:
  """Each section's checks of the shared keys of a replay (the run's own learner first), then
  a family with keys of its own named where the learner trains no reranker."""
  for name in reversed(cfg.section_names()):
    getattr(cfg, name).check_replay(cfg)
  if cfg.variant in FAMILY_SECTIONS and not trains_a_reranker(cfg.learner):
    raise ValueError(f"variant={cfg.variant} is a reranker: set learner=reranker (or both, to "
                     "rerank a query encoder it tunes first), not "
                     f"learner={cfg.learner}")
