"""The query encoder's section of the config (learner=query_encoder, the first stage of
learner=query_encoder,FAMILY, IRIS's anchor under learner=iris)."""

from __future__ import annotations

import dataclasses

from rmmjax.learners.section import Learning, key

TUNES = ("query", "both")  # which side of retrieval a tuned encoder embeds


@dataclasses.dataclass(frozen=True)
class EncoderTuning(Learning):
  """The retriever's query encoder (its keys, `tune` among them: docs/command-line.md), at the
  rates of the cross-validated ablation's exploratory runs (experiments/replay_ablation.py)."""

  NAME = "encoder_tuning"
  tau: float = 0.05
  lr: float = 1e-5
  steps: int = 600
  pretrain_epochs: int = 2
  pretrain_lr: float = 2e-5
  pretrain_tau: float = 0.05
  pretrain_batch: int = key(16, low=1)
  tune: str = key("query", choices=TUNES)

  def check_replay(self, cfg) -> None:
    if cfg.retriever == "bm25":
      raise ValueError(f"learner={cfg.learner} tunes the dense retriever's query encoder, but "
                       "retriever=bm25 does not use it: set retriever=dense or hybrid")
    stages = cfg.section_names()
    if stages[0] != self.NAME:  # (IRIS's anchor: learner=iris takes a given encoder as one)
      return
    if cfg.query_encoder and len(stages) > 1:
      raise ValueError(f"query_encoder={cfg.query_encoder!r} gives a reranker the candidates of "
                       f"an encoder trained before, and learner={cfg.learner} tunes its own "
                       "first: name the reranker family alone (learner=FAMILY) to use it")
    if cfg.query_encoder:
      raise ValueError(f"query_encoder={cfg.query_encoder!r} gives a reranker its candidates; "
                       f"learner={cfg.learner} trains one from the loaded encoder")
    if cfg.units == "lace":
      raise ValueError(f"units=lace trains a model of IRIS: set learner to a reranker family "
                       "(learner=linear or cross: it ranks IRIS's evidence) or learner=iris "
                       f"(IRIS's own models), not learner={cfg.learner!r}")

