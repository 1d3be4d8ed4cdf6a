"""The cross reranker: a BERT-family encoder reading each (question, memory) pair. `model` is
its pure scoring model, `pairs` how a question and memory texts become its packed input,
`reader` how it reads candidates where it serves, `spec` its core spec from a run's config and
record, `export` and `load` its CrossEncoder directory."""

from rmmjax.learners.cross.model import (CrossModel, PackedPairs, cross_params_template,
                                         cross_scores, init_cross_params, pair_logits)

__all__ = ["CrossModel", "PackedPairs", "cross_params_template", "cross_scores",
           "init_cross_params", "pair_logits"]
