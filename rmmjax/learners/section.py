"""What every config section is made of: each key's limits, declared beside its default
(`key`), the one check that reads them, and the rates every learner's section has (`Learning`).
A subclass that only changes a key's default declares it plainly: the limits are those of the
class that declared them. Limits that depend on another key stay in the owner's `check`.

The sections sit in the learners' folders, outside rmmjax/config/, because importing any module
there first runs the config package, which imports them: a circle.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence


def key(default: Any, *, choices: Sequence[str] | Callable[[], Sequence[str]] | None = None,
        low: float | None = None, high: float | None = None, low_open: bool = False) -> Any:
  """A dataclass field with its limits: one of `choices` (or a callable giving them), or a
  number in [low, high] ((low, high] with `low_open`; either end may be None). An int default
  makes the key an integer."""
  return dataclasses.field(default=default, metadata={
      "choices": choices, "low": low, "high": high, "low_open": low_open})


def check(obj, prefix: str = "") -> None:
  """Refuses the first declared value of `obj` (a config dataclass) outside its limits."""
  for f in dataclasses.fields(obj):
    # The limits of the nearest class of the MRO that declared them.
    fields = (getattr(base, "__dataclass_fields__", {}).get(f.name) for base in type(obj).__mro__)
    limits = next((field.metadata for field in fields if field and field.metadata), None)
    if limits is None:
      continue
    value, name = getattr(obj, f.name), prefix + f.name
    choices = limits["choices"]
    if choices is not None:
      choices = choices() if callable(choices) else choices
      if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {', '.join(choices)}")
      continue
    low, high, low_open = limits["low"], limits["high"], limits["low_open"]
    integer = isinstance(f.default, int) and not isinstance(f.default, bool)
    if integer and not isinstance(value, int):
      raise ValueError(f"{name}={value!r}: expected an integer")
    below = low is not None and (value <= low if low_open else value < low)
    if below or (high is not None and value > high):
      raise ValueError(f"{name}={value:{',' if integer else '.12g'}}: expected "
                       + _limits(low, high, low_open, integer))


def _limits(low, high, low_open: bool, integer: bool) -> str:
  if integer:
    return (f"an integer from {low:,} to {high:,}" if high is not None else
            f"an integer >= {low:,}")
  if high is None:
    return f"a value {'>' if low_open else '>='} {low:g}"
  return f"a value in {'(' if low_open else '['}{low:g}, {high:g}]"


# Far outside these no run learns anything (a learning rate of 10 sends the listwise loss from
# 1.8 to 768; every rate measured helping is 1e-3 or below, and 1e-2 already collapsed the
# linear reranker; a temperature of 1e-9 turns the sampling into a sort): refused rather than
# run. The temperatures used run from 0.05 to 2.
RATE = {"low": 0.0, "high": 0.1, "low_open": True}
TAU = {"low": 1e-3, "high": 100.0}
STEPS = {"low": 0, "high": 10**7}
EPOCHS = {"low": 0, "high": 1000}


class Section:
  """A learner's section of the config (a frozen dataclass of its keys, named NAME)."""

  NAME = ""

  def check(self, cfg) -> None:
    """Refuses a value that does not fit the rest of the run `cfg` (after each key's limits)."""

  def check_replay(self, cfg) -> None:
    """Refuses a shared key of a replayed dataset this learner cannot run with."""

  def unread(self, name: str, cfg) -> str:
    """Why this run reads no key `name` of this section (empty when it does)."""
    return ""


@dataclasses.dataclass(frozen=True)
class Learning(Section):
  """Every learner's rates: online REINFORCE after a listwise pretraining on labelled evidence."""

  tau: float = key(0.5, **TAU)
  lr: float = key(1e-3, **RATE)
  steps: int = key(10_000, **STEPS)
  pretrain_epochs: int = key(10, **EPOCHS)
  pretrain_lr: float = key(1e-4, **RATE)
  pretrain_tau: float = key(0.05, **TAU)
