"""The cross reranker (docs/implemented.md), its pure model's names re-exported."""

from rmmjax.learners.cross.model import (CrossModel, PackedPairs, cross_params_template,
                                         cross_scores, init_cross_params, pair_logits)

__all__ = ["CrossModel", "PackedPairs", "cross_params_template", "cross_scores",
           "init_cross_params", "pair_logits"]
