"""Sentence encoders (Flax BERT) with length-bucketed batching and an on-disk embedding cache."""
