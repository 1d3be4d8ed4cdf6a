"""The embedding rerankers where they serve: they read the embeddings a batch already holds,
so their reader adds nothing and checks only that the encoder's dimension is theirs."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class EmbeddingReader:
  dim: int
  source: str
  batchwise = False  # held out, replayed as the one-program sweep does (its numbers exactly)

  @classmethod
  def for_reranker(cls, reranker, encoder) -> "EmbeddingReader":
    del encoder  # (the agent checks its encoder's dimension against the reranker's record)
    return cls(reranker.spec.dim, reranker.source)

  def compiler_options(self):
    return None

  def candidate_arrays(self, question: str, texts_K):
    return None

  def inputs(self, arrays):
    return None

  def pack(self, batch):
    return batch

  def pack_many(self, batch):
    return batch

  def replay_inputs(self, replays, spec, online: bool):
    for conv in replays:
      if conv.q_NxD.shape[1] != self.dim:
        raise ValueError(f"the reranker works in {self.dim} dimensions, the encoder gives "
                         f"{conv.q_NxD.shape[1]}")
    return None

  def pack_streams(self, streams):
    return streams
