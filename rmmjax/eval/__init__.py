"""Metrics, defined once, and the evaluation of retrieval on labelled conversations."""
