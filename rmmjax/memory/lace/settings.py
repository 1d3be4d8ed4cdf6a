"""LaceMem's settings and the checks of what it is given."""

from __future__ import annotations

import dataclasses
from typing import final

from rmmjax.memory.lace.links import RULES

RETRIEVALS = ("bm25", "dense", "hybrid")


@final
@dataclasses.dataclass(frozen=True)
class LaceSettings:
  """Every weight, threshold and cap of the layers, and how search ranks facts."""

  same_turn: float = 1.0
  same_session: float = 0.7
  session_window: int = 8  # session links reach this many facts either way
  min_cosine: float = 0.7
  max_semantic: int = 5
  semantic_rule: str = "mutual"  # "mutual": both rank each other; "either": one ranks the other
  chunk: int = 4096  # rows per block of the cosine matrix
  retrieval: str = "hybrid"  # BM25, dense, or their reciprocal-rank fusion
  fusion_c: float = 60.0

  def __post_init__(self):
    for name, (expected, ok) in _RANGES.items():
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    for name, allowed in (("semantic_rule", RULES), ("retrieval", RETRIEVALS)):
      if getattr(self, name) not in allowed:
        raise ValueError(f"{name} {getattr(self, name)!r} is not one of {', '.join(allowed)}")


_RANGES = {"same_turn": ("a weight in (0, 1]", lambda v: 0 < v <= 1),
           "same_session": ("a weight in (0, 1]", lambda v: 0 < v <= 1),
           "min_cosine": ("a cosine in [-1, 1]", lambda v: -1 <= v <= 1),
           "fusion_c": ("a positive number", lambda v: v > 0),
           "session_window": ("an integer >= 0", lambda v: isinstance(v, int) and v >= 0),
           "max_semantic": ("an integer >= 0", lambda v: isinstance(v, int) and v >= 0),
           "chunk": ("an integer >= 1", lambda v: isinstance(v, int) and v >= 1)}


def fact_text(date: str, speaker: str, clause: str) -> str:
  """A fact as indexed: "[date] Speaker: clause" (questions name people and times)."""
  return f"[{date}] {speaker}: {clause}" if date else f"{speaker}: {clause}"
