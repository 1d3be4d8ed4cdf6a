"""Exact Gumbel top-M versus the paper's literal recipe, Plackett-Luce versus the surrogate.

The paper ranks s + g and divides by tau only afterwards, so its samples ignore tau; the
log-probability it differentiates is a sum of log-softmax terms rather than the probability of
the ordered selection. This runs each combination over a range of temperatures on the latent
simulator (3 seeds each, one vmapped sweep per combination) and writes a markdown table.

    python experiments/sampling_and_log_prob.py [--steps N] [--seeds N]
                                                [--out experiments/results/...]

Writes the table (experiments/results/sampling_and_log_prob.md by default), and the record of
every run's configuration beside it (NAME.config.json, see published.py; `configs`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from published import write_record
from replay_common import write_markdown
from rmmjax.train.sweep import grid, latent
from rmmjax.config import get_config, with_values

TAUS = (0.1, 0.5, 1.0, 2.0)
COMBINATIONS = [("gumbel", "plackett_luce"), ("gumbel", "surrogate"),
                ("paper", "plackett_luce"), ("paper", "surrogate")]


def combination_config(steps: int, sampling: str, log_prob: str):
  """The base of one combination's sweep over TAUS: the latent config's, with `steps` steps of
  its reranker, pinned to one device at full float32 (as the table was made), whatever the
  machine's defaults."""
  base = dataclasses.replace(get_config("latent"), precision="highest", devices=1,
                             sampling=sampling, log_prob=log_prob)
  return with_values(base, {"steps": steps})  # (the reranker section's steps)


def configs(argv: list[str]) -> dict:
  """Every run `main` trains with this command line, {combination, tau, seed S: its Config} (see
  published.py): each combination's sweep's runs, as the sweep resolves them."""
  args = parse(argv)
  return {f"{sampling}, {log_prob}, tau={c.reranker.tau}, seed {c.seed}": c
          for sampling, log_prob in COMBINATIONS
          for c in grid.sweep_configs(combination_config(args.steps, sampling, log_prob),
                                        {"tau": list(TAUS)}, args.seeds)}


def parse(argv: list[str]) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=10_000)
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--out", default="experiments/results/sampling_and_log_prob.md")
  return parser.parse_args(argv)


def main() -> None:
  args = parse(sys.argv[1:])
  rows = []
  t0 = time.time()
  for sampling, log_prob in COMBINATIONS:
    cfg = combination_config(args.steps, sampling, log_prob)
    with tempfile.TemporaryDirectory() as workdir:
      result = latent.sweep(cfg, {"tau": list(TAUS)}, args.seeds, Path(workdir), progress=False)
    for tau in TAUS:
      runs = [r for r in result["runs"] if r["tau"] == tau]
      final = np.array([r["recall_at_m_final"] for r in runs])
      rows.append((sampling, log_prob, tau, runs[0]["recall_at_m_base"], final.mean(),
                   final.std(), np.mean([r["reward_last"] for r in runs])))
  lines = [
      "# Sampling recipe and log-probability",
      "",
      f"Latent simulator, {args.steps} steps, batch 4, b = 0.5 (constant), lr 1e-3; mean and",
      f"standard deviation of held-out recall@M over {args.seeds} seeds. Made by",
      f"`python experiments/sampling_and_log_prob.py --steps {args.steps} --seeds {args.seeds}`"
      f" ({time.time() - t0:.0f} s on a 2-core CPU).",
      "",
      "| sampling | log-probability | tau | recall@M base | recall@M final | sd | reward last |",
      "|---|---|---|---|---|---|---|",
  ]
  for sampling, log_prob, tau, base_recall, mean, sd, reward in rows:
    lines.append(f"| {sampling} | {log_prob} | {tau} | {base_recall:.3f} | {mean:.3f} | "
                 f"{sd:.3f} | {reward:.3f} |")
  out = Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  write_markdown(out, lines)
  # (--out says where the table goes, not what it holds.)
  argv = ((["--steps", str(args.steps)] if args.steps != 10_000 else [])
          + (["--seeds", str(args.seeds)] if args.seeds != 3 else []))
  write_record(out, "sampling_and_log_prob", argv, configs(argv))
  print("\n".join(lines))


if __name__ == "__main__":
  main()
