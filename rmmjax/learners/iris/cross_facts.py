"""The cross reranker inside IRIS (units `lace`): the question beside each fact's text, each
episode's pairs tokenised once; inside IRIS a fact read once per question keeps its pair score."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import final

import jax
import numpy as np
from tqdm import tqdm

from rmmjax import core
from rmmjax.learners.cross import PackedPairs, pair_logits
from rmmjax.encode.encoder import compiler_options
from rmmjax.learners.cross.pairs import PAIR_BUCKETS, CandidateTokens, pack_batch, pair_tokens
from rmmjax.learners.iris.episodes import FactReranker, IrisEpisode, episodes_batch
from rmmjax.retrieve.evidence import Fact


def with_pair_tokens(episodes: Sequence[IrisEpisode], tokenizer, max_length: int
                     ) -> tuple[list[IrisEpisode], dict]:
  """The episodes with their (question, fact) pair tokens, and counts of the pairs."""
  if not episodes:
    return [], {"pairs": 0, "truncated": 0, "length": PAIR_BUCKETS[0]}
  k = episodes[0].mem_KxD.shape[0]
  texts = [[f.text for f in e.facts] + [None] * (k - len(e.facts)) for e in episodes]
  pairs = pair_tokens(tokenizer, [e.question for e in episodes], texts, max_length)
  out = [dataclasses.replace(e, inputs=CandidateTokens(pairs.ids_NxKxL[n],
                                                     pairs.segments_NxKxL[n]))
         for n, e in enumerate(episodes)]
  return out, {"pairs": pairs.pairs, "truncated": pairs.truncated,
               "length": int(pairs.ids_NxKxL.shape[2])}


# Compiled once per process (a task evaluates before and after training).
_scores = jax.jit(core.scores, static_argnums=2, compiler_options=compiler_options())


def episode_scores(params, spec: core.CoreSpec, episodes: Sequence[IrisEpisode],
                   progress: bool = False) -> np.ndarray:
  """scores_NxK of the episodes' candidates, spec.batch episodes at a time (to bound memory)."""
  b = spec.batch
  out = []
  for at in tqdm(range(0, len(episodes), b), desc="held-out (cross, IRIS)", unit="batch",
                 disable=not progress):
    chunk = list(episodes[at:at + b])
    chunk += [chunk[-1]] * (b - len(chunk))  # one shape: the last batch padded by repetition
    out.append(np.asarray(_scores(params, pack_batch(jax.tree.map(np.asarray,
                                                                  episodes_batch(chunk))),
                                  spec)))
  return np.concatenate(out)[:len(episodes)]


@functools.partial(jax.jit, static_argnums=(2, 3), compiler_options=compiler_options())
def _logits(params, pairs: PackedPairs, bert: core.BertConfig, dtype: str):
  return pair_logits(params, pairs, bert, dtype)[0]


@final
class CrossFactReranker(FactReranker):
  """FactReranker's cross reranker: each fact's pair score (read once per question and fact)
  plus the rank prior of its position in the order given. Pairs are padded to the run's
  max_length, so one program serves every call."""

  def __init__(self, params, spec: core.CoreSpec, tokenizer, max_length: int,
               mode: str = "fused"):
    super().__init__(params, spec, None, mode)
    self.tokenizer, self.max_length = tokenizer, max_length
    self._prior = np.asarray(params["rank_bias"], np.float64)
    self._question: str | None = None
    self._read: dict[int, float] = {}  # fact_id -> pair score, for the current question
    self.pairs_read = 0  # pairs the encoder has scored (for benchmarks and tests)

  def _head_scores(self, question: str, head: list[Fact]) -> np.ndarray:
    if question != self._question:
      self._question, self._read = question, {}
    new = [f for f in dict.fromkeys(head) if f.fact_id not in self._read]
    k = self.spec.k
    for at in range(0, len(new), k):
      chunk = new[at:at + k]
      texts = [f.text for f in chunk] + [None] * (k - len(chunk))
      pairs = pair_tokens(self.tokenizer, [question], [texts], self.max_length,
                          length=self.max_length)
      logits = np.asarray(_logits(self.params, pairs.packed(serving=True),
                                  self.spec.model.bert, self.spec.model.compute_dtype))
      self._read |= {f.fact_id: float(v) for f, v in zip(chunk, logits)}
      self.pairs_read += len(chunk)
    return np.array([self._read[f.fact_id] for f in head]) + self._prior[:len(head)]
