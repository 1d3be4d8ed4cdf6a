"""Reading JSON out of model replies, and checking each prompt's reply against what it showed.

Every `parse_*` function takes the raw reply text (or JSON already parsed) and never raises on
what the model wrote: bad output comes back marked, with counts of what was dropped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Sequence
from typing import Literal

Reply = str | dict | list | None
SUFFICIENCY_LABELS = ("EXACT", "INFERRABLE", "PARTIAL")
_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n?(.*?)```", re.DOTALL)
_MAX_STARTS = 64  # bounds the scan of long chatty replies
_DECODER = json.JSONDecoder()


class LLMOutputError(ValueError):
  """A reply that holds no JSON object or array; `text` is the reply as received."""

  def __init__(self, message: str, text: str):
    super().__init__(message)
    self.text = text


def _closing(text: str, start: int) -> int:
  """Index of the bracket closing the one at `start` (strings skipped), or -1 if it never closes."""
  depth, in_string, escaped = 0, False, False
  for i in range(start, len(text)):
    ch = text[i]
    if in_string:
      if escaped:
        escaped = False
      elif ch == "\\":
        escaped = True
      elif ch == '"':
        in_string = False
    elif ch == '"':
      in_string = True
    elif ch in "{[":
      depth += 1
    elif ch in "}]":
      depth -= 1
      if depth == 0:
        return i
  return -1


def _scan(text: str) -> dict | list | None:
  """The first JSON object or array that stands on its own in `text`, or None."""
  pos = 0
  for _ in range(_MAX_STARTS):
    starts = [i for i in (text.find("{", pos), text.find("[", pos)) if i >= 0]
    if not starts:
      return None
    start = min(starts)
    try:
      return _DECODER.raw_decode(text, start)[0]
    except json.JSONDecodeError:
      pass
    end = _closing(text, start)
    if end < 0:
      # An unclosed bracket is a truncated value: an object found inside it is only a fragment.
      return None
    pos = end + 1
  return None


def extract_json(text: str) -> dict | list:
  """The JSON object or array in a reply: bare, in a ```json fence, or with text around it."""
  for fenced in _FENCE.findall(text):
    found = _scan(fenced)
    if found is not None:
      return found
  found = _scan(text)
  if found is None:
    raise LLMOutputError(f"no JSON object or array in the reply ({len(text)} chars): "
                         f"{text[:200]!r}", text=text)
  return found


def _load(reply: Reply) -> dict | list | None:
  if isinstance(reply, (dict, list)):
    return reply
  try:
    return extract_json(reply) if isinstance(reply, str) else None
  except LLMOutputError:
    return None


def _position(entry: object, n_shown: int) -> int | None:
  """The 0-based position of a 1-based item number the model wrote (7, "7", "[7]"), or None."""
  if isinstance(entry, bool):
    return None
  if isinstance(entry, float) and entry.is_integer():
    entry = int(entry)
  if isinstance(entry, str):
    entry = entry.strip().strip("[]#").strip()
    entry = int(entry) if entry.isdigit() else None
  if isinstance(entry, int) and 1 <= entry <= n_shown:
    return entry - 1
  return None


@dataclasses.dataclass(frozen=True)
class Topic:
  summary: str
  turn_ids: tuple[str, ...]  # the snippets it came from, each one of the ids shown


@dataclasses.dataclass(frozen=True)
class TopicExtraction:
  topics: tuple[Topic, ...]
  dropped_turn_ids: int  # ids the model wrote that were not shown
  dropped_topics: int  # topics without a summary or without any shown turn id
  malformed: bool  # no {"topics": [...]} (or bare list) at all


def parse_topics(reply: Reply, shown_turn_ids: Sequence[str]) -> TopicExtraction:
  """Topics with their turn ids restricted to those shown; topics left with none are dropped."""
  data = _load(reply)
  items = data.get("topics") if isinstance(data, dict) else data
  if not isinstance(items, list):
    return TopicExtraction((), 0, 0, malformed=True)
  shown = set(shown_turn_ids)
  topics, dropped_ids, dropped_topics = [], 0, 0
  for item in items:
    summary = item.get("summary") if isinstance(item, dict) else None
    raw_ids = item.get("turn_ids") if isinstance(item, dict) else None
    if not isinstance(summary, str) or not summary.strip() or not isinstance(raw_ids, list):
      dropped_topics += 1
      continue
    ids = [raw.strip().strip("[]").strip() if isinstance(raw, str)
           else str(raw) if isinstance(raw, int) and not isinstance(raw, bool)  # "7" written as 7
           else None for raw in raw_ids]
    kept = list(dict.fromkeys(turn_id for turn_id in ids if turn_id in shown))
    dropped_ids += sum(turn_id not in shown for turn_id in ids)
    if kept:
      topics.append(Topic(summary.strip(), tuple(kept)))
    else:
      dropped_topics += 1
  return TopicExtraction(tuple(topics), dropped_ids, dropped_topics, malformed=False)


@dataclasses.dataclass(frozen=True)
class MergeDecision:
  action: Literal["add", "merge"]
  position: int | None  # merge: 0-based position of the existing memory in the list shown
  summary: str | None  # merge: the merged summary
  fell_back: bool  # the reply was unusable and "add" was chosen for it


_FELL_BACK = MergeDecision("add", None, None, fell_back=True)


def parse_merge(reply: Reply, n_shown: int) -> MergeDecision:
  """Add, or merge into one of the `n_shown` memories; anything unusable falls back to add."""
  data = _load(reply)
  if not isinstance(data, dict):
    return _FELL_BACK
  action = str(data.get("action")).strip().lower()  # (a value of another type matches nothing)
  if action == "add":
    return MergeDecision("add", None, None, fell_back=False)
  position = _position(data.get("index"), n_shown)
  summary = data.get("summary")
  if action != "merge" or position is None or not isinstance(summary, str) or not summary.strip():
    return _FELL_BACK
  return MergeDecision("merge", position, summary.strip(), fell_back=False)


@dataclasses.dataclass(frozen=True)
class CitedAnswer:
  answer: str
  cited: tuple[int, ...]  # 0-based positions of the memories shown, first citation first
  invalid_citations: int  # entries that were not a number from 1 to n_shown (repeats not counted)
  malformed: bool  # no usable {"answer": str, "citations": [...]}: cited is then empty


def parse_answer(reply: Reply, n_shown: int) -> CitedAnswer:
  """The answer and the valid citations among `n_shown` numbered memories; never raises."""
  data = _load(reply)
  if not isinstance(data, dict):
    # The text is still the best answer there is; it just earns no citation.
    return CitedAnswer(reply.strip() if isinstance(reply, str) else "", (), 0, malformed=True)
  answer, citations = data.get("answer"), data.get("citations")
  if isinstance(answer, (int, float)) and not isinstance(answer, bool):
    answer = str(answer)
  if not isinstance(answer, str) or not isinstance(citations, list):
    return CitedAnswer(answer if isinstance(answer, str) else "", (), 0, malformed=True)
  positions = [_position(entry, n_shown) for entry in citations]
  cited = tuple(dict.fromkeys(p for p in positions if p is not None))
  return CitedAnswer(answer.strip(), cited, positions.count(None), malformed=False)


@dataclasses.dataclass(frozen=True)
class Verdict:
  correct: bool  # False when malformed
  malformed: bool


def parse_verdict(reply: Reply) -> Verdict:
  """The judge's {"correct": bool}; a malformed verdict counts as not correct."""
  data = _load(reply)
  value = data.get("correct") if isinstance(data, dict) else None
  if isinstance(value, str) and value.strip().lower() in ("true", "false"):
    value = value.strip().lower() == "true"
  usable = isinstance(value, bool)
  return Verdict(usable and value, malformed=not usable)


@dataclasses.dataclass(frozen=True)
class Sufficiency:
  """A sufficiency verdict (also what every judge of `rmmjax.retrieve.judges` gives)."""

  label: Literal["EXACT", "INFERRABLE", "PARTIAL"]
  confidence: float  # in [0, 1]: how sufficient the evidence is
  missing: str  # what is still needed ("" when nothing is)
  malformed: bool = False  # output unusable: PARTIAL at confidence 0 keeps the search going


def parse_sufficiency(reply: Reply) -> Sufficiency:
  """The sufficiency judge's label, confidence and note on what is missing; never raises."""
  data = _load(reply)
  if not isinstance(data, dict):
    return Sufficiency("PARTIAL", 0.0, "", malformed=True)
  label = str(data.get("label")).strip().upper()  # (a value of another type matches no label)
  missing = data.get("missing")
  missing = missing.strip() if isinstance(missing, str) else ""
  confidence = data.get("confidence")
  if isinstance(confidence, str):
    try:
      confidence = float(confidence)
    except ValueError:
      confidence = None
  usable = (isinstance(confidence, (int, float)) and not isinstance(confidence, bool)
            and math.isfinite(confidence))
  if label not in SUFFICIENCY_LABELS or not usable:
    return Sufficiency("PARTIAL", 0.0, missing, malformed=True)
  return Sufficiency(label, min(max(float(confidence), 0.0), 1.0), missing, malformed=False)
