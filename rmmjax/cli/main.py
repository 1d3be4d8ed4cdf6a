"""The `rmmjax` command line: flags -> config -> library call, one file per command group.
JAX's multi-process runtime starts before any of them is imported: their imports touch JAX
(bm25s runs a JAX op when imported)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from rmmjax.cli import signals
from rmmjax.cli.process import start_runtime

NOTHING = "nothing was written"
# What an interrupted command leaves (chat says it itself: what it kept depends on the session).
INTERRUPTED = {"train": "rerun the same command to resume",
               "sweep": "rerun the same command (a sweep over conversations keeps the folds "
                        "and runs it finished; the latent simulator's starts over)",
               "ingest": "the sessions reflected before are kept; rerun the same command to "
                         "resume",
               "memory": "a write is one transaction: the bank is as it was, or holds all of it"}


def build_parser() -> argparse.ArgumentParser:
  """Every command's flags (importing the command groups)."""
  from rmmjax.cli import agent, bank, evaluation, tools, training  # noqa: PLC0415 (see above)
  parser = argparse.ArgumentParser(prog="rmmjax", description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  training.add_parsers(sub)
  evaluation.add_parser(sub)
  tools.add_parsers(sub)
  bank.add_parsers(sub)
  agent.add_parsers(sub)
  return parser


def main(argv: list[str] | None = None) -> int:
  signals.install()  # first: the imports below take seconds, and Ctrl-C may come in them
  argv = sys.argv[1:] if argv is None else list(argv)
  command = next((a for a in argv if not a.startswith("-")), "rmmjax")
  try:
    return _main(argv)
  except KeyboardInterrupt:
    stopped, code = signals.status()
    # (not imported here: only a sweep that is running has it loaded)
    latent = sys.modules.get("rmmjax.train.sweep.latent")
    if latent is not None and latent.nothing_kept_in_flight:
      print(f"\nrmmjax {command}: {stopped}; {NOTHING} (the latent simulator's sweep writes at "
            "its end: a rerun starts over)", file=sys.stderr)
      # Its compiled chunk in flight would hold the exit until it ends (minutes), for a result
      # nothing keeps: leave without waiting for it.
      _leave_now(code)
    left = NOTHING if "--dry-run" in argv else INTERRUPTED.get(command, NOTHING)
    print(f"\nrmmjax {command}: {stopped}; {left}", file=sys.stderr)
    return code


def command() -> None:
  """The `rmmjax` program: main(), then the process's end. After a Ctrl-C or SIGTERM (every file
  closed and checkpoint written by then) it leaves at once: the interpreter's teardown could meet
  a computation XLA still had in flight and end in a segmentation fault (a quarter of a training
  run's stops, measured), which a scheduler would read as a crash."""
  code = main()
  if code >= 128:  # a signal stopped it (128 + the signal; _main returns 0, 1 or 2)
    _leave_now(code)
  sys.exit(code)


def _leave_now(code: int) -> None:
  """Ends the process at once, its output flushed, without the interpreter's teardown."""
  with contextlib.suppress(OSError):
    sys.stdout.flush()
    sys.stderr.flush()
  os._exit(code)


def _main(argv: list[str]) -> int:
  try:
    start_runtime(argv)
  except ValueError as err:
    print(f"rmmjax: error: {err}", file=sys.stderr)
    return 2
  signals.install()  # again: a distributed runtime took SIGTERM over
  from rmmjax.llm.base import LLMError  # noqa: PLC0415  (after the runtime started)
  args = build_parser().parse_args(argv)
  args.argv = argv  # (what a sweep records of how it was made)
  try:
    args.func(args)
  except (ValueError, FileNotFoundError, PermissionError, IsADirectoryError,
          FloatingPointError) as err:
    print(f"rmmjax {args.command}: error: {err}", file=sys.stderr)
    return 2
  except LLMError as err:  # the server failed, after its retries: not a bad argument
    print(f"rmmjax {args.command}: the LLM failed: {err}", file=sys.stderr)
    return 1
  except BrokenPipeError:  # the reader of stdout left (`| head`): nothing more to say
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1
  return 0
