"""Sweeps: a grid of configurations x seeds (grid.py) run as one compiled vmapped program where
they share one (latent.py, replay.py), else run by run (runs.py); recorded by table.py."""
