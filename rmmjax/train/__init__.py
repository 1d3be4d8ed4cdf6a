"""Training runs: what they learn from (tasks), the resumable loop, and sweeps."""
