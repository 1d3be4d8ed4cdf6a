"""The embedding rerankers (linear, MLP; their pure model: model.py):
how they read candidates where they serve (reader.py), their export as one safetensors file
(export.py, format.py) and a NumPy scorer of that file (serving.py, which imports no JAX: so
this face imports nothing)."""
