"""The cross reranker: a BERT-family encoder reading each (question, memory) pair. `model` is
its pure scoring model, `pairs` how a question and memory texts become its packed input."""

from rmmjax.learners.cross.model import (COMPUTE_DTYPES, CrossModel, PackedPairs,
                                         cross_params_template, cross_scores, init_cross_params,
                                         pair_logits, rank_prior_init)

__all__ = ["COMPUTE_DTYPES", "CrossModel", "PackedPairs", "cross_params_template",
           "cross_scores", "init_cross_params", "pair_logits", "rank_prior_init"]
