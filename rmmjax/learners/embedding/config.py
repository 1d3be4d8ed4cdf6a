"""The embedding rerankers' section of the config (variant linear or mlp, and any family a test
registers without a section of its own)."""

from __future__ import annotations

import dataclasses

from rmmjax.learners.section import Learning, key


@dataclasses.dataclass(frozen=True)
class Reranker(Learning):
  """The paper's rerankers over embeddings (variant linear or mlp): `formulation` of the linear
  map's gradient, the MLP's `hidden` width, and a learnt bias per base position (`rank_prior`)
  starting at -prior_scale * log(1 + position): flat at 0, the candidates' order where the
  scale outweighs the embeddings' own score differences."""

  NAME = "reranker"
  formulation: str = key("fast", choices=("fast", "naive"))
  hidden: int = key(256, low=1)
  rank_prior: bool = False
  prior_scale: float = key(0.0, low=0.0, high=100.0)

  def check(self, cfg) -> None:
    if self.prior_scale and not self.rank_prior:
      raise ValueError(f"reranker.prior_scale={self.prior_scale}: where the rank prior starts; "
                       "expected reranker.rank_prior=true")

  def unread(self, name: str, cfg) -> str:
    if name == "hidden" and cfg.variant != "mlp":
      return f"learner={cfg.learner} has no hidden layer"
    return ""
