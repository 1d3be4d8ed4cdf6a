"""The flags of a run over several processes (train, sweep), and starting JAX's runtime from
them before anything else asks JAX for a device (as bm25s does when imported)."""

from __future__ import annotations

import argparse


def add_flags(p: argparse.ArgumentParser) -> None:
  p.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                 help="several processes (hosts): process 0's address; with --num-processes "
                      "and --process-id (none of them: this machine, or what SLURM, Open MPI "
                      "or a Cloud TPU slice says)")
  p.add_argument("--num-processes", type=int, default=None)
  p.add_argument("--process-id", type=int, default=None)
  p.add_argument("--distributed-timeout", type=int, default=60, metavar="S",
                 help="seconds to wait for every process to join (default 60)")


def start_runtime(argv: list[str]) -> None:
  """Starts jax.distributed for train and sweep, from their flags in argv."""
  pre = argparse.ArgumentParser(add_help=False)
  pre.add_argument("command", nargs="?")
  add_flags(pre)
  known, _ = pre.parse_known_args(argv)
  if known.command in ("train", "sweep"):
    from rmmjax import distributed
    distributed.initialize(known.coordinator, known.num_processes, known.process_id,
                           known.distributed_timeout)
