"""Sweeps: a grid of configurations x seeds (grid.py) run as one compiled vmapped program where
they share one (chunks.py: the latent simulator's, latent.py, and an embedding reranker's rates
over folds of replayed conversations, replay.py), else run by run (runs.py), recorded in one
sweep.json, table and curves (table.py)."""
