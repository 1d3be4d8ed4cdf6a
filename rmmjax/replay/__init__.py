"""Replay of labelled conversations: candidate tensors, training protocols, query-encoder tuning."""
