"""The choices and key groups of the experiment configuration (rmmjax.config)."""

from __future__ import annotations

from rmmjax.retrieve.units import GRANULARITIES

# Training protocols on replayed conversations: online REINFORCE only, supervised pretraining on
# labelled evidence only, or pretraining then online REINFORCE (see rmmjax.replay.protocols).
MODES = ("rl", "pretrain", "pretrain+rl")

PRECISIONS = ("highest", "high", "default")
# Datasets whose questions carry evidence labels, so retrieval can be evaluated on them (MSC has
# no questions).
EVALUABLE_DATASETS = ("locomo", "longmemeval")
# Memory units: per-session granularities, and topics (the memories of Prospective Reflection,
# rmmjax.memory.units).
UNITS = GRANULARITIES + ("topic",)
# A reranker also trains on LaceMem's atomic facts, ranking the evidence IRIS gathers.
TRAIN_UNITS = UNITS + ("lace",)

# Values a sweep may vary without recompiling (leaves of core.HParams; tau and lr are the
# learner's section's).
SWEEPABLE = ("tau", "baseline", "baseline_kind", "lr", "seed", "p_rel", "p_irr")
# Shared keys of the replay of a labelled dataset, which the latent config has no use for.
REPLAY_KEYS = ("data", "dataset", "units", "retriever", "holdout", "folds", "fold", "mode",
               "query_encoder")

# Citation model calibrated to the paper's citation-versus-judge agreement: the generator cites
# 91.1% of the memories a judge finds useful and leaves uncited 84.6% of the others.
P_REL_DEFAULT = 0.911
P_IRR_DEFAULT = 1.0 - 0.846
