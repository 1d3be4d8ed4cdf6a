"""Name -> learner: the one place a learner's name is looked up (docs/layout.md); no caller
outside learners/ names a family."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rmmjax.learners.cross import export as cross_export
from rmmjax.learners.cross import spec as cross_spec
from rmmjax.learners.cross.reader import CrossReader
from rmmjax.learners.cross.task import CrossRerankerTask
from rmmjax.learners.embedding import export as embedding_export
from rmmjax.learners.embedding.latent import LatentTask
from rmmjax.learners.embedding.reader import EmbeddingReader
from rmmjax.learners.embedding.task import ReplayTask
from rmmjax.learners.iris import files as iris_files
from rmmjax.learners.iris.reranker_task import IrisTask
from rmmjax.learners.iris.task import IrisLearnedTask
from rmmjax.learners.query_encoder import files as encoder_files
from rmmjax.learners.query_encoder.task import QueryEncoderTask
from rmmjax.learners.task import Task


@dataclasses.dataclass(frozen=True)
class Learner:
  name: str
  # How it trains on replayed conversations: built from (config, encoder, progress, workdir).
  task: type[Task]
  # (a loaded reranker, the encoder beside it) -> how it reads candidates where it serves
  # (EmbeddingReader and CrossReader show what a reader holds); None: it ranks nothing.
  reader: Callable | None
  # (a run's config, its workdir) -> (its core spec, parameters in the structure its
  # checkpoints hold); None: those of its task's model (ReplayTask.model and init_params).
  restore: Callable | None = None
  # (a training workdir, out) -> a sentence saying what was written; a reranker's export is
  # named export_name inside the export of two stages.
  export: Callable = embedding_export.export_run
  export_name: str = embedding_export.EXPORT_NAME
  # Why `chat` serves it without learning from the LLM's citations unless told to (None: it
  # learns by default).
  served_frozen: str | None = None
  eval_flag: str = "--reranker"  # the flag of `rmmjax eval` that takes a trained one
  # How it trains as the reranker inside IRIS, on LaceMem's facts (units=lace; None: it cannot).
  iris_task: type[Task] | None = IrisTask

  def restored(self, cfg, workdir) -> tuple:
    """(core spec, parameters template) of a run of this learner in `workdir`."""
    if self.restore is not None:
      return self.restore(cfg, workdir)
    spec = dataclasses.replace(cfg.core_spec(), model=self.task.model)
    return spec, self.task.init_params(spec)


CROSS_SERVED_FROZEN = (
    "the cross reranker is served without learning from the LLM's citations: in replay "
    "(experiments/cross_reranker.py) 60 online REINFORCE steps at its run's rates lowered its "
    "held-out Recall@5 from 0.575 to 0.555, and no rate has been measured that helps; pass "
    "--learn-cross to learn anyway (at its run's lr and tau unless --lr and --tau say otherwise)")

LEARNERS = {
    "linear": Learner("linear", ReplayTask, EmbeddingReader.for_reranker),
    "mlp": Learner("mlp", ReplayTask, EmbeddingReader.for_reranker),
    "cross": Learner("cross", CrossRerankerTask, CrossReader.for_reranker, cross_spec.restore,
                     cross_export.export_run, cross_export.EXPORT_NAME, CROSS_SERVED_FROZEN),
    "query_encoder": Learner("query_encoder", QueryEncoderTask, None,
                             export=encoder_files.export_run, eval_flag="--encoder",
                             iris_task=None),
    "iris": Learner("iris", IrisLearnedTask, None, export=iris_files.export_run,
                    eval_flag="--iris learned --iris-model", iris_task=None),
}


def learner(name: str) -> Learner:
  """The learner of a name (a stage of a run's `learner`, or a reranker's family)."""
  if name not in LEARNERS:
    raise ValueError(f"learner={name!r}: expected one of {', '.join(LEARNERS)}, or "
                     "query_encoder,FAMILY")
  return LEARNERS[name]


def with_model(spec):
  """`spec` with the scoring model of the family its variant names (a fresh reranker's)."""
  model = learner(spec.variant).task.model
  if model is None:
    raise ValueError(f"learner={spec.variant!r}: its model is not fixed by the config alone")
  return dataclasses.replace(spec, model=model)


def reader(reranker, encoder):
  """How a LoadedReranker reads candidates beside `encoder` (refused if not the one it needs)."""
  return learner(reranker.spec.variant).reader(reranker, encoder)


def training_task(cfg) -> type[Task]:
  """The task that trains `cfg`'s last stage."""
  found = learner(cfg.family)  # (refuses a name the registry does not hold)
  if cfg.config == "latent":
    return LatentTask
  return found.iris_task if cfg.units == "lace" and found.iris_task else found.task

