"""The timing of a compiled step for an estimate, on a clock the test drives: the first call's
excess over the median step is the compile."""

from __future__ import annotations

import pytest

from rmmjax import step_timing


def test_the_first_call_beyond_a_step_is_the_compile(monkeypatch):
  now = [0.0]
  monkeypatch.setattr(step_timing.time, "perf_counter", lambda: now[0])
  # The first call (on inputs[0]) takes 12 s; then each input in turn: 1, 3, 2, 9 s.
  durations = iter([12.0, 1.0, 3.0, 2.0, 9.0])
  calls = []

  def run(x):
    calls.append(x)
    now[0] += next(durations)

  compile_s, step_s = step_timing.compile_and_step(run, ["a", "b", "c", "d"])
  assert calls == ["a", "a", "b", "c", "d"]
  assert step_s == pytest.approx(2.5)  # the median of 1, 3, 2, 9
  assert compile_s == pytest.approx(12.0 - 2.5)


def test_a_first_call_no_slower_than_a_step_is_no_compile(monkeypatch):
  now = [0.0]
  monkeypatch.setattr(step_timing.time, "perf_counter", lambda: now[0])
  durations = iter([1.0, 2.0, 2.0])

  def run(_):
    now[0] += next(durations)

  assert step_timing.compile_and_step(run, [0, 1]) == (0.0, 2.0)
