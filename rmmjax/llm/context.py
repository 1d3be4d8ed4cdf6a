"""Fitting the variable parts of a prompt (memories, turns, evidence) into a character budget.

The longest texts are cut first, to one common length, so that short items stay whole and no
item is dropped: a memory cut to its first thousand characters is still a memory the model can
cite by its number. A cut text ends with CUT_MARK, so the model (and whoever reads the prompt)
can see that something is missing.
"""

from __future__ import annotations

from collections.abc import Sequence

CUT_MARK = " [...]"
MIN_ITEM_CHARS = 40  # what every item keeps, even when the budget is smaller than that


def fit_texts(texts: Sequence[str], budget: int | None) -> tuple[list[str], int]:
  """(texts with the longest cut to one length so that all fit in `budget` characters, how
  many were cut); everything stays whole when budget is None or they already fit."""
  texts = list(texts)
  if budget is None or sum(map(len, texts)) <= budget or not texts:
    return texts, 0
  cap = max(_common_cap(sorted(map(len, texts)), max(budget, 0)), MIN_ITEM_CHARS)
  out = [t if len(t) <= cap else t[:max(cap - len(CUT_MARK), 1)].rstrip() + CUT_MARK
         for t in texts]
  return out, sum(len(t) > cap for t in texts)


def _common_cap(lengths: list[int], budget: int) -> int:
  """The largest c with sum(min(length, c)) <= budget, for lengths in ascending order."""
  used = 0
  for i, length in enumerate(lengths):
    rest = len(lengths) - i
    if used + length * rest > budget:
      return (budget - used) // rest
    used += length
  return lengths[-1]
