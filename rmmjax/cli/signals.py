"""Ctrl-C that always stops a command. KeyboardInterrupt is lost where an exception can only be
reported (a garbage-collector callback such as jaxlib's, a `__del__`: sys.unraisablehook), and
breaks an extension module interrupted mid-import ("ImportError: initialization failed"); in
both the interrupt is sent again a moment later, until it lands where it can be raised."""

from __future__ import annotations

import os
import signal
import sys
import threading
import warnings

RETRY_S = 0.05


def _in_an_import(frame) -> bool:
  while frame is not None:
    if frame.f_code.co_filename.startswith("<frozen importlib"):
      return True
    frame = frame.f_back
  return False


def _send_again(signum: int) -> None:
  threading.Timer(RETRY_S, os.kill, (os.getpid(), signum)).start()


def _on_unraisable(unraisable) -> None:
  # The command stops now: what the objects torn down on the way out complain of (an
  # interrupted asynchronous checkpoint's event loop, a coroutine never awaited) is not the
  # user's to read; the stop's own one line is. The stop itself, lost here, is sent again.
  if isinstance(unraisable.exc_value, KeyboardInterrupt):
    _send_again(received)


received = signal.SIGINT  # the signal that stopped the command: its exit status is 128 + it


def _on_interrupt(signum, frame) -> None:
  global received
  if _in_an_import(frame):
    _send_again(signum)
    return
  received = signum
  sys.unraisablehook = _on_unraisable
  warnings.simplefilter("ignore", RuntimeWarning)
  raise KeyboardInterrupt


def install() -> None:
  """Replaces Python's own SIGINT handler (a process started with SIGINT ignored keeps it
  ignored), and SIGTERM's default (a scheduler's or `kill`'s stop, which ended the process
  without a word) with the same: the command says it stopped and how to resume."""
  if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _on_interrupt)
  # (set again once the runtime has started: JAX's distributed runtime puts its own SIGTERM
  # handler in below Python's, which stops nothing)
  if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, _on_interrupt):
    signal.signal(signal.SIGTERM, _on_interrupt)


def status() -> tuple[str, int]:
  """What stopped the command and the exit status that says so (128 + the signal)."""
  return ("interrupted" if received == signal.SIGINT else "terminated"), 128 + received
