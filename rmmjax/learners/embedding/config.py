"""The embedding rerankers' section of the config (variant linear or mlp, and any family a test
registers without a section of its own)."""

from __future__ import annotations

import dataclasses

from rmmjax.learners.section import Learning, key


@dataclasses.dataclass(frozen=True)
class Reranker(Learning):
  """The paper's rerankers over embeddings (variant linear or mlp): `formulation` of the linear
  map's gradient, the MLP's `hidden` width, and a learnt bias per base position (`rank_prior`)."""

  NAME = "reranker"
  formulation: str = key("fast", choices=("fast", "naive"))
  hidden: int = key(256, low=1)
  rank_prior: bool = False

  def unread(self, name: str, cfg) -> str:
    if name == "hidden" and cfg.variant != "mlp":
      return f"variant={cfg.variant} has no hidden layer"
    return ""
