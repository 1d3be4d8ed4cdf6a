"""The learned parts of IRIS behind its interfaces: a sufficiency judge over embeddings
(`rmmjax.core.judge`) and a refiner whose query is the question joined with the best facts
gathered so far, embedded by a second, fine-tuned query encoder (multi-hop dense retrieval).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, final

import jax
import numpy as np

from rmmjax.core.judge import judge_logit
from rmmjax.encode.protocol import Encoder
from rmmjax.retrieve.evidence import Fact, RawTurn
from rmmjax.retrieve.judges import Label, SufficiencyJudge, Verdict
from rmmjax.retrieve.refine import RefineRequest, VectorRefiner

REFINE_FACTS = 3  # gathered facts joined to the question in a refinement query
REFINE_MIX = 0.5  # weight of the refinement embedding beside the question's own
JUDGE_PAD = 32  # the judged facts are padded to a multiple of this (few compiled shapes)
EXACT_AT = 0.8  # a probability of sufficiency at least this reads as EXACT, at least 0.5 INFERRABLE


class VectorStore(Protocol):
  def query_vector(self, query: str) -> np.ndarray: ...

  def fact_vectors(self, fact_ids: list[int]) -> np.ndarray: ...


def refinement_text(question: str, evidence: Sequence[str]) -> str:
  """The refinement query: the question, then the best gathered facts' clauses."""
  return " ".join([question.strip(), *(e.strip() for e in evidence[:REFINE_FACTS])])


@final
class EmbeddingRefiner(VectorRefiner):
  """Refinement by vector: question vector + REFINE_MIX x the refinement encoder's embedding of
  `refinement_text` (the store fuses that ranking with BM25 over the question)."""

  def __init__(self, encoder: Encoder):
    self.encoder = encoder

  def refine(self, request: RefineRequest) -> str:
    return refinement_text(request.question, request.evidence)

  def query_vector(self, text: str, question_vector: np.ndarray) -> np.ndarray:
    vector = np.asarray(self.encoder.encode([text]), np.float32)[0]
    return np.asarray(question_vector, np.float32) + REFINE_MIX * vector


def verdict_of(probability: float) -> Verdict:
  """A probability that the evidence suffices as a verdict IRIS's thresholds act on."""
  p = float(probability)
  p = 0.0 if p != p else min(max(p, 0.0), 1.0)  # NaN: nothing known, so not sufficient
  label: Label = "EXACT" if p >= EXACT_AT else "INFERRABLE" if p >= 0.5 else "PARTIAL"
  return Verdict(label, p, "" if label != "PARTIAL" else "evidence judged incomplete")


_judge_logit = jax.jit(judge_logit)


@final
class LearnedJudge(SufficiencyJudge):
  """The learned judge over a store's embeddings: the question as the store embeds it, the
  facts as they are stored."""

  def __init__(self, params: dict, store: VectorStore):
    self.params, self.store = params, store
    self.dim = int(params["fact"]["w"].shape[0] - 1) // 2

  def probability(self, question: str, facts: Sequence[Fact]) -> float:
    q_D = np.asarray(self.store.query_vector(question), np.float32)
    n = max(JUDGE_PAD, -(-len(facts) // JUDGE_PAD) * JUDGE_PAD)
    facts_NxD = np.zeros((n, self.dim), np.float32)
    if facts:
      facts_NxD[:len(facts)] = self.store.fact_vectors([f.fact_id for f in facts])
    mask_N = np.arange(n) < len(facts)
    return float(jax.nn.sigmoid(_judge_logit(self.params, q_D, facts_NxD, mask_N)))

  def judge(self, question: str, facts: Sequence[Fact], raws: Mapping[str, RawTurn], *,
            category: str | None = None) -> Verdict:
    return verdict_of(self.probability(question, facts))
