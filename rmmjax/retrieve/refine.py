"""Query refinement for iterative retrieval: schedules by question type and iteration, the
rule-based refiner, and the text helpers they share with the judges.

The rule: a refined query is the question's key terms, then the terms of the judge's note on what
is missing, then the cue terms of the schedule's current stage, deduplicated. Stopwords are
dropped from the question and the note; cue terms are kept as written (they are chosen words,
"when" among them). The k-th refinement of a question uses stage k of its schedule (the last stage
repeats):

- temporal questions: dates and time words, then temporal relations, then broader events;
- other questions: entities (the question's and those the evidence covers thinly, placed first),
  then attributes, then broader concepts.
"""

from __future__ import annotations

import abc
import collections
import dataclasses
import re
from collections.abc import Sequence
from typing import final

import numpy as np


STOPWORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below
between both but by can could did do does doing done down during each else ever few for from
further get got had has have having he her here hers herself him himself his how i if in into is
it its itself just let many may me might more most much must my myself no nor not now of off
on once only or other our ours ourselves out over own same shall she should so some such than that
the their theirs them themselves then there these they this those through to too under until up
upon us very was we were what whatever when where whether which while who whom whose why will with
would you your yours yourself yourselves yes also ever kind sort thing things one ones someone
something anything way ways tell say said""".split())
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'\-]*")
_CAPITALISED = re.compile(r"\b[A-Z][A-Za-z\-]*(?:'s)?")
_TEMPORAL_QUESTION = re.compile(
    r"\bwhen\b|\bwhat (?:date|day|year|month|time|week)\b|\bwhich (?:date|day|year|month|week)\b"
    r"|\bhow long\b|\bhow many (?:days|weeks|months|years)\b|\bdate\b", re.IGNORECASE)
_MONTH = (r"(?:January|February|March|April|May|June|July|August|September|October|November"
          r"|December|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)")
# Months only capitalised: "may" is a verb far more often than a month; the rest in any case.
_TIME_EXPRESSION = re.compile(
    rf"\b{_MONTH}\b|\b(?:19|20)\d\d\b|\b\d{{1,2}}/\d{{1,2}}(?:/\d{{2,4}})?\b"
    r"|(?i:\b(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday|yesterday|today"
    r"|tomorrow|tonight|ago|recently|weekend)\b"
    r"|\b(?:last|next|this|past) (?:week|month|year|night|weekend|summer|winter|spring|fall)\b)")


def words(text: str) -> list[str]:
  """Lower-case word tokens of a text, possessive 's removed."""
  return [w.removesuffix("'s") for w in _WORD.findall(text.lower())]


def content_terms(text: str) -> list[str]:
  """The words of a text that carry meaning: no stopwords, no single letters, first use first."""
  return list(dict.fromkeys(w for w in words(text) if len(w) > 1 and w not in STOPWORDS))


def feedback_terms(question: str, texts: Sequence[str], n: int) -> tuple[str, ...]:
  """The n content terms most frequent across the texts (the best evidence so far) that the
  question does not use: pseudo-relevance feedback, reaching statements that share the found
  evidence's words rather than the question's."""
  if n <= 0:
    return ()
  asked = set(content_terms(question))
  counts = collections.Counter(term for text in texts for term in set(content_terms(text)) - asked
                               if not term.isdigit())
  return tuple(sorted(counts, key=lambda t: (-counts[t], t))[:n])


def stem(word: str) -> str:
  """A crude suffix strip, so "painted", "painting" and "paints" meet at "paint"."""
  for suffix in ("ing", "ed", "es", "s"):
    if word.endswith(suffix) and len(word) - len(suffix) >= 3:
      return word[:-len(suffix)]
  return word


def named_entities(text: str) -> list[str]:
  """Capitalised words that are neither stopwords (a sentence's "When", "Did") nor dates."""
  names = (match.removesuffix("'s") for match in _CAPITALISED.findall(text))
  return list(dict.fromkeys(name for name in names if len(name) > 1 and name.lower()
                            not in STOPWORDS and name.lower() not in (*MONTHS, *WEEKDAYS)))


def is_temporal(question: str, category: str | None = None) -> bool:
  """Temporal when the category says so (LoCoMo "temporal", LongMemEval "temporal-reasoning")
  or the question asks when, what date, how long and the like."""
  if category is not None and "temporal" in category.lower():
    return True
  return bool(_TEMPORAL_QUESTION.search(question))


def has_time_expression(text: str) -> bool:
  """Whether the text names a date or a time: a month, a year, a weekday, "last week", "ago"."""
  return bool(_TIME_EXPRESSION.search(text))


@final
@dataclasses.dataclass(frozen=True)
class Stage:
  name: str
  cues: tuple[str, ...]
  entity_first: bool = False  # put the named and thinly covered entities at the query's head


TEMPORAL_SCHEDULE = (
    Stage("dates", ("date", "when", "day", "week", "month", "year", "ago", "yesterday", "last",
                    *MONTHS)),
    Stage("relations", ("before", "after", "during", "since", "until", "started", "began",
                        "first", "then")),
    Stage("events", ("event", "happened", "trip", "celebrated", "milestone", "birthday", "moved",
                     "plans")),
)
GENERAL_SCHEDULE = (
    Stage("entities", (), entity_first=True),
    Stage("attributes", ("likes", "favorite", "enjoys", "works", "job", "lives", "family",
                         "hobby", "owns", "feels")),
    Stage("broader", ("activities", "interests", "experience", "events", "life", "goals",
                      "related")),
)


@final
@dataclasses.dataclass(frozen=True)
class RefineRequest:
  """What a refiner knows when it writes the next query."""

  question: str
  current_query: str  # the query of the previous refinement path (the question at first)
  missing: str  # the judge's note on what is still missing ("" before the first verdict)
  stage_index: int  # 0 for the first refinement of this question
  temporal: bool  # use the temporal schedule
  entities: tuple[str, ...] = ()  # named in the question, and those covered thinly so far
  feedback: tuple[str, ...] = ()  # salient terms of the best evidence so far (pseudo-relevance)
  evidence: tuple[str, ...] = ()  # the best facts gathered so far, best first (their clauses)


class QueryRefiner(abc.ABC):
  """Writes the refinement path's query from the question, the gap and the schedule."""

  @abc.abstractmethod
  def refine(self, request: RefineRequest) -> str:
    """The next query (never empty)."""


@final
class RuleRefiner(QueryRefiner):
  """The rule of this module's docstring; needs no model."""

  max_missing_terms = 12  # a long note (a whole turn) would drown the cues

  def refine(self, request: RefineRequest) -> str:
    """Question terms + missing-note terms + the stage's cues (entities first at that stage)."""
    schedule = TEMPORAL_SCHEDULE if request.temporal else GENERAL_SCHEDULE
    stage = schedule[min(request.stage_index, len(schedule) - 1)]  # the last stage repeats
    entities = [e.lower() for e in request.entities] if stage.entity_first else []
    terms = [*entities, *content_terms(request.question),
             *content_terms(request.missing)[:self.max_missing_terms], *request.feedback,
             *stage.cues]
    query = " ".join(dict.fromkeys(terms))
    return query or request.question


class VectorRefiner(QueryRefiner):
  """A refiner whose query is searched by its embedding (multi-hop dense retrieval): `refine`
  writes the text, `query_vector` embeds it for the store's dense side."""

  @abc.abstractmethod
  def query_vector(self, text: str, question_vector: np.ndarray) -> np.ndarray:
    """The vector (D,) the store ranks its facts by, given the question's own embedding."""


def entity_context(question: str, thin: Sequence[str]) -> tuple[str, ...]:
  """The question's named entities followed by the thinly covered ones, each once."""
  return tuple(dict.fromkeys([*named_entities(question), *thin]))
