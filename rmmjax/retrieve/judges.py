"""Sufficiency judges: is the evidence gathered so far enough to answer the question?

A verdict is a label (EXACT: stated outright; INFERRABLE: follows from the evidence; PARTIAL:
something is still missing), a confidence in [0, 1] that reads as "how sufficient" (an oracle's
PARTIAL confidence is the fraction of evidence found, so a low PARTIAL means evidence is absent),
and a note on what is missing, which drives the next query.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal, final

from rmmjax.llm.base import LLM, LLMError
from rmmjax.llm.parse import Sufficiency, parse_sufficiency
from rmmjax.llm.prompts import sufficiency_judge
from rmmjax.retrieve.evidence import EvidenceStore, Fact, RawTurn
from rmmjax.retrieve.refine import (content_terms, has_time_expression, is_temporal,
                                    named_entities, stem, words)

Label = Literal["EXACT", "INFERRABLE", "PARTIAL"]
Verdict = Sufficiency
JUDGE_TOKENS = 256  # the LLM judge's reply: a label, a confidence and a short note
_DATE_PREFIX = re.compile(r"^\s*\[[^\]]*\]\s*")  # a fact's "[8 May 2023] " session-date prefix


def verdict_reward(label: str, confidence: float) -> float:
  """A reward in [-1, 1] for the evidence a verdict judged, usable beside citation rewards:
  sufficient evidence earns more the surer the judge (stated outright beats inferred),
  insufficient evidence -1 when nothing was found, nearer 0 as more of it was. A malformed
  verdict carries no information: callers give it 0, not this."""
  if label == "EXACT":
    return float(confidence)
  if label == "INFERRABLE":
    return 0.5 * float(confidence)
  return float(confidence) - 1.0


class SufficiencyJudge(abc.ABC):
  """Labels the accumulated evidence (facts in the order shown, with their raw turns)."""

  @abc.abstractmethod
  def judge(self, question: str, facts: Sequence[Fact], raws: Mapping[str, RawTurn], *,
            category: str | None = None) -> Verdict:
    """The verdict on whether `facts` (raws keyed by turn id) suffice to answer the question."""


def evidence_texts(facts: Sequence[Fact], raws: Mapping[str, RawTurn],
                   max_raw_chars: int = 400) -> list[str]:
  """One line per fact: its text, and the verbatim turn the first time that turn comes up."""
  shown_turns: set[str] = set()
  lines = []
  for fact in facts:
    line = fact.text
    raw = raws.get(fact.turn_id)
    if raw is not None and fact.turn_id not in shown_turns:
      shown_turns.add(fact.turn_id)
      said = " ".join(raw.text.split())[:max_raw_chars]
      if said and said not in fact.text:  # a fact that is the turn itself needs no repeat
        line += f' (from {raw.date}, {raw.speaker} said: "{said}")'
    lines.append(line)
  return lines


@final
class LLMJudge(SufficiencyJudge):
  """The sufficiency prompt over the numbered evidence; unusable replies never raise."""

  def __init__(self, llm: LLM):
    self.llm = llm

  def judge(self, question: str, facts: Sequence[Fact], raws: Mapping[str, RawTurn], *,
            category: str | None = None) -> Verdict:
    prompt = sufficiency_judge(question, evidence_texts(facts, raws))
    try:
      reply = self.llm.chat_structured(prompt.messages, prompt.schema, max_tokens=JUDGE_TOKENS)
    except LLMError:
      return Verdict("PARTIAL", 0.0, "", malformed=True)
    return parse_sufficiency(reply)


@final
class OracleJudge(SufficiencyJudge):
  """Knows a question's evidence turns: the ceiling of what a judge's diagnosis can drive.

  EXACT at 1 when every evidence turn is among the evidence facts' turns (vacuously so for a
  question without evidence turns); else PARTIAL at the fraction found, with the missing turns'
  text (read from `store`, or their ids without one) as the note the next query chases. That
  note copies the labels' text into the refined query: label leakage, which `note=False`
  removes (the labels then decide only when to stop, continue and abstain).
  """

  def __init__(self, evidence_turn_ids: Iterable[str], store: EvidenceStore | None = None,
               note: bool = True):
    self.evidence = tuple(dict.fromkeys(evidence_turn_ids))
    self.store, self.note = store, note

  def judge(self, question: str, facts: Sequence[Fact], raws: Mapping[str, RawTurn], *,
            category: str | None = None) -> Verdict:
    found = {fact.turn_id for fact in facts}
    missing = [t for t in self.evidence if t not in found]
    if not missing:
      return Verdict("EXACT", 1.0, "")
    if not self.note:
      note = ""
    elif self.store is None:
      note = "; ".join(missing)
    else:
      note = " ".join(f"{self.store.raw(t).speaker}: {self.store.raw(t).text}" for t in missing)
    return Verdict("PARTIAL", 1.0 - len(missing) / len(self.evidence), note)


@final
class HeuristicJudge(SufficiencyJudge):
  """Offline and label-free: how much of what the question names the evidence covers.

  Items to cover: each content word of the question (weight 1; covered when its stem appears in
  the evidence: fact texts, subjects, objects, raw turns), each named entity (weight 2; covered
  when named), and for temporal questions a date or time expression in some fact's statement or
  turn, its session-date prefix not counting (weight 2). Confidence = covered weight / total.
  EXACT when everything is covered, INFERRABLE when at least `most` is, else PARTIAL; the note
  lists what is uncovered. No evidence at all is PARTIAL at 0.
  """

  most, entity_weight, time_weight = 0.6, 2.0, 2.0

  def judge(self, question: str, facts: Sequence[Fact], raws: Mapping[str, RawTurn], *,
            category: str | None = None) -> Verdict:
    entities = named_entities(question)
    entity_words = {e.lower() for e in entities}
    terms = [t for t in content_terms(question) if t not in entity_words]
    temporal = is_temporal(question, category)
    if not facts:
      uncovered = [*entities, *terms] + (["a date or time"] if temporal else [])
      return Verdict("PARTIAL", 0.0, ", ".join(uncovered))
    turns = [raws[f.turn_id].text for f in facts if f.turn_id in raws]
    text = " ".join([*(f"{f.text} {f.subject} {f.object}" for f in facts), *turns])
    present = set(words(text))
    stems = {stem(w) for w in present}
    items = [(e, self.entity_weight, e.lower() in present) for e in entities]
    items += [(t, 1.0, stem(t) in stems) for t in terms]
    if temporal:
      dated = any(has_time_expression(_DATE_PREFIX.sub("", f.text)) for f in facts)
      items.append(("a date or time", self.time_weight, dated or any(map(has_time_expression,
                                                                         turns))))
    total = sum(weight for _, weight, _ in items)
    if total == 0:  # nothing checkable in the question: evidence exists, so call it inferrable
      return Verdict("INFERRABLE", self.most, "")
    confidence = sum(weight for _, weight, ok in items if ok) / total
    uncovered = ", ".join(name for name, _, ok in items if not ok)
    if confidence >= 1.0:
      return Verdict("EXACT", 1.0, "")
    label: Label = "INFERRABLE" if confidence >= self.most else "PARTIAL"
    return Verdict(label, confidence, uncovered)
