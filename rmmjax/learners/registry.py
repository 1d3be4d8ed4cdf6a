"""Name -> learner: the one place a reranker family's name is looked up. The agent, `eval`
and the command line ask a learner here how a trained reranker reads its candidates (its
reader) and whether it learns online where it serves; none of them names a family."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from rmmjax.learners.embedding import export as embedding_export
from rmmjax.learners.cross import export as cross_export
from rmmjax.learners.cross import spec as cross_spec
from rmmjax.learners.cross.reader import CrossReader
from rmmjax.learners.embedding.reader import EmbeddingReader


@dataclasses.dataclass(frozen=True)
class Learner:
  name: str
  # (a loaded reranker, the encoder beside it) -> how it reads candidates where it serves:
  # compiler_options(), candidate_arrays(question, texts_K) (the arrays of a learner's own
  # inputs, which an agent keeps with a pending answer), inputs(arrays stacked over queries)
  # (a batch's `inputs`), pack(batch) (one served query's), pack_many(batch) (several
  # questions'), batchwise (held out, scored batch by batch rather than replayed),
  # replay_inputs(replays, spec, online), pack_streams(streams).
  reader: Callable
  # (a run's config, its workdir) -> (its core spec, parameters in the structure its
  # checkpoints hold, or None where the identity initialisation has it).
  restore: Callable = lambda cfg, workdir: (cfg.core_spec(), None)  # noqa: E731
  # (a training workdir, out) -> a sentence saying what was written: the export a serving
  # system reads, named export_name inside a learner=both export.
  export: Callable = embedding_export.export_run
  export_name: str = embedding_export.EXPORT_NAME
  # Why `chat` serves it without learning from the LLM's citations unless told to (None: it
  # learns by default).
  served_frozen: str | None = None


CROSS_SERVED_FROZEN = (
    "the cross reranker is served without learning from the LLM's citations: in replay "
    "(experiments/cross_reranker.py) 60 online REINFORCE steps at its run's rates lowered its "
    "held-out Recall@5 from 0.575 to 0.555, and no rate has been measured that helps; pass "
    "--learn-cross to learn anyway (at its run's lr and tau unless --lr and --tau say otherwise)")

LEARNERS = {
    "linear": Learner("linear", EmbeddingReader.for_reranker),
    "mlp": Learner("mlp", EmbeddingReader.for_reranker),
    "cross": Learner("cross", CrossReader.for_reranker, cross_spec.restore, cross_export.export_run,
                     cross_export.EXPORT_NAME, CROSS_SERVED_FROZEN),
}


def learner(name: str) -> Learner:
  """The learner of a reranker family (a run's `variant`)."""
  if name not in LEARNERS:
    raise ValueError(f"variant={name!r} is not one of {', '.join(LEARNERS)}")
  return LEARNERS[name]


def reader(reranker, encoder):
  """How a loaded reranker (learners.loaded.LoadedReranker) reads candidates beside
  `encoder`, refused when the encoder is not the one it needs."""
  return learner(reranker.spec.variant).reader(reranker, encoder)
