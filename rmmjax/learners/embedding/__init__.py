"""The embedding rerankers (linear, MLP). This face imports nothing, so that serving.py
scores an export without JAX."""
