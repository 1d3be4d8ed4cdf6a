"""LaceMem's settings (every weight, threshold and cap of its layers, and how search ranks facts)
and the checks of what it is given."""

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
    for name in ("same_turn", "same_session", "min_cosine", "fusion_c"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    for name in ("same_turn", "same_session"):
      if not 0.0 < getattr(self, name) <= 1.0:
        raise ValueError(f"{name} must be a weight in (0, 1], got {getattr(self, name)!r}")
    if not -1.0 <= self.min_cosine <= 1.0:
      raise ValueError(f"min_cosine must be a cosine in [-1, 1], got {self.min_cosine!r}")
    for name, low in (("session_window", 0), ("max_semantic", 0), ("chunk", 1)):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if self.semantic_rule not in RULES:
      raise ValueError(f"semantic_rule {self.semantic_rule!r} is not one of {', '.join(RULES)}")
    if self.retrieval not in RETRIEVALS:
      raise ValueError(f"retrieval {self.retrieval!r} is not one of {', '.join(RETRIEVALS)}")
    if not self.fusion_c > 0:
      raise ValueError(f"fusion_c must be positive, got {self.fusion_c!r}")


def fact_text(date: str, speaker: str, clause: str) -> str:
  """A fact as indexed: "[date] Speaker: clause" (questions name people and times)."""
  return f"[{date}] {speaker}: {clause}" if date else f"{speaker}: {clause}"


def text_arg(value: object, name: str, *, empty: bool = False) -> str:
  if not isinstance(value, str) or (not empty and not value):
    raise ValueError(f"{name} must be a {'' if empty else 'non-empty '}string, got {value!r}")
  return value


def check_k(k: object) -> None:
  if not isinstance(k, int) or isinstance(k, bool) or k < 1:
    raise ValueError(f"k must be a positive integer, got {k!r}")


