"""Prospective Reflection: when a session ends, its topics become memories of the user's bank.

Topics are decided one after another, each against the bank as the earlier topics left it, so
two topics of one session that belong to the same memory end up in one merged summary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import final

import numpy as np

from rmmjax.llm.base import DEFAULT_MAX_TOKENS, LLM, LLMError
from rmmjax.llm.context import fit_texts
from rmmjax.llm.parse import LLMOutputError, Topic, parse_merge, parse_topics
from rmmjax.llm.prompts import MAX_TOPICS, add_or_merge, topic_extraction
from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.records import BankTurn, Merge, NewMemory, ReflectionInput, StaleRead
from rmmjax.memory.topics import ADD, Candidate, Decision, Encoder, Extraction, Reflector

# A topic list of a long session outgrows the default reply length; a cut reply is unusable.
EXTRACTION_MAX_TOKENS = 2048
# The most one memory's summary holds. Offline summaries are the topic's turns verbatim (on the
# LoCoMo dev file at most 6,992 characters, merges included: none is cut); a pasted document
# must not become a memory that fills every prompt it is shown in.
MAX_SUMMARY_CHARS = 8000
# Reads and recomputations of one reflection when other writers keep changing the user.
REFLECTION_ATTEMPTS = 5
CANDIDATES = 5  # the memories most similar to a topic, shown to its add-or-merge decision


@final
class ReflectionFailed(LLMError):
  """The model's topic list could not be used and the reflector has no fallback: the session
  is left open (not reflected), so a later run can reflect it."""


@final
class LLMReflector(Reflector):
  """Asks a chat model for the topics and for each add-or-merge decision. An unusable topic
  list is replaced by `fallback`'s topics or raises ReflectionFailed; an unusable decision adds
  the topic; a failed call (LLMError) propagates, nothing applied. `cut_prompts` counts the
  prompts cut to fit the model's context."""

  def __init__(self, llm: LLM, *, fallback: Reflector | None = None):
    self.llm, self.fallback, self.cut_prompts = llm, fallback, 0

  def extract(self, turns: Sequence[BankTurn], date: str) -> Extraction:
    """The topics of the model's reply, restricted to the turn ids it was shown."""
    prompt = topic_extraction(turns, date, MAX_TOPICS,
                              max_chars=self.llm.prompt_chars(EXTRACTION_MAX_TOKENS))
    self.cut_prompts += bool(prompt.cut)
    try:
      reply = self.llm.chat_structured(prompt.messages, prompt.schema,
                                       max_tokens=EXTRACTION_MAX_TOKENS)
    except LLMOutputError as err:  # a reply with no text: as unusable as one that is not JSON
      reply, why = "", str(err)
    else:
      why = f"not a topic list: {reply[:120]!r}"
    parsed = parse_topics(reply, [turn.turn_id for turn in turns])
    # A list whose every topic had to be dropped (no summary, no turn shown) is as unusable as
    # one that is not a list: reflecting it would end the session with nothing in memory. An
    # empty list is the model's answer that nothing was worth remembering.
    if not parsed.malformed and (parsed.topics or not parsed.dropped_topics):
      return Extraction(parsed.topics, parsed.dropped_turn_ids, parsed.dropped_topics)
    if not parsed.malformed:
      why = (f"none of its {parsed.dropped_topics} topics has a summary and a turn id it was "
             f"shown: {reply[:120]!r}")
    if self.fallback is None:
      raise ReflectionFailed(f"the model's topic list could not be used ({why}) and no "
                             f"fallback reflector was given; the session stays unreflected")
    found = self.fallback.extract(turns, date)
    return dataclasses.replace(found, fallbacks=found.fallbacks + 1)

  def decide(self, topic: Topic, candidates: Sequence[Candidate]) -> Decision:
    """The model's choice among the candidates; an unusable reply adds the topic."""
    prompt = add_or_merge(topic.summary, [c.summary for c in candidates],
                          max_chars=self.llm.prompt_chars(DEFAULT_MAX_TOKENS))
    self.cut_prompts += bool(prompt.cut)
    try:
      reply = self.llm.chat_structured(prompt.messages, prompt.schema,
                                       max_tokens=DEFAULT_MAX_TOKENS)
    except LLMOutputError:
      reply = ""
    decision = parse_merge(reply, len(candidates))
    return Decision(decision.position, decision.summary, decision.fell_back)


@final
@dataclasses.dataclass(frozen=True)
class ReflectionReport:
  """What one session's reflection did."""

  session_id: str
  turns: int  # the session's turns
  topics: int  # topics extracted (after dropping unusable ones)
  added: int  # new memories written
  merged: int  # topics merged into a memory (an older one or one added by this reflection)
  updated: int  # older memories whose summary a merge rewrote
  dropped_turn_ids: int
  dropped_topics: int
  fallbacks: int  # unusable replies: a topic list, or add-or-merge decisions that became adds
  uncovered_turns: int  # session turns that no topic names
  cut_summaries: int  # summaries cut to MAX_SUMMARY_CHARS
  memory_ids: tuple[int, ...]  # the memories written: the new ones, then the updated ones

  def describe(self) -> str:
    """One line for a person: what the reflection wrote and what it had to leave out."""
    notes = [f"{n} {what}" for n, what in (
        (self.fallbacks, "unusable LLM replies (offline fallback or add)"),
        (self.dropped_topics, "topics dropped"), (self.dropped_turn_ids, "unknown turn ids"),
        (self.uncovered_turns, "turns in no topic"),
        (self.cut_summaries, f"summaries cut to {MAX_SUMMARY_CHARS:,} characters")) if n]
    return (f"session {self.session_id} reflected: {self.turns} turns, {self.topics} topics, "
            f"{self.added} memories added, {self.merged} merged into {self.updated}"
            + (f" ({'; '.join(notes)})" if notes else ""))


@dataclasses.dataclass
class _Entry:
  """A memory as this reflection sees it: stored (memory_id) or new, with pending changes."""

  memory_id: int | None
  summary: str
  turns: int
  vector: np.ndarray
  new_turn_ids: list[str]
  changed: bool = False
  stale: bool = False  # its summary was rewritten and its vector is not yet re-embedded


def _restrict(topics: Sequence[Topic], turn_ids: Sequence[str]) -> tuple[list[Topic], int, int]:
  """Topics keeping only the session's turn ids (once each); (topics, ids dropped, topics
  dropped). The LLM parser already does this; a custom reflector may not."""
  shown, kept, dropped_ids = set(turn_ids), [], 0
  for topic in topics:
    ids = tuple(dict.fromkeys(t for t in topic.turn_ids if t in shown))
    dropped_ids += sum(t not in shown for t in topic.turn_ids)
    if ids and isinstance(topic.summary, str) and topic.summary.strip():
      kept.append(Topic(topic.summary.strip(), ids))
  return kept, dropped_ids, len(topics) - len(kept)


def _unit_rows(vectors: np.ndarray) -> np.ndarray:
  vectors = np.asarray(vectors, np.float32)
  return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def _nearest(entries: list[_Entry], vector: np.ndarray, top_k: int) -> list[tuple[int, float]]:
  """(entry index, cosine) of the top_k entries most similar to vector, best first."""
  if not entries:
    return []
  scores = _unit_rows(np.stack([e.vector for e in entries])) @ _unit_rows(vector)
  order = np.argsort(-scores, kind="stable")[:top_k]
  return [(int(i), float(scores[i])) for i in order]


def _refresh(entries: list[_Entry], encoder: Encoder) -> None:
  """Re-embeds every rewritten summary, in one call: encoders batch better than they loop."""
  if stale := [e for e in entries if e.stale]:
    for entry, vector in zip(stale, encoder.encode([e.summary for e in stale]), strict=True):
      entry.vector, entry.stale = vector, False


def _check_decision(decision: Decision, n_candidates: int, reflector: Reflector) -> Decision:
  """A custom reflector's decision: add (position None), or a shown candidate and a summary."""
  if decision.position is not None and not (
      0 <= decision.position < n_candidates and isinstance(decision.summary, str)
      and decision.summary.strip()):
    raise ValueError(f"{type(reflector).__name__}.decide chose candidate {decision.position} "
                     f"with summary {decision.summary!r:.80}; expected None (add), or a "
                     f"position from 0 to {n_candidates - 1} with the merged memory's summary")
  return decision


def reflect_session(bank: MemoryBank, user: str, session_id: str, reflector: Reflector,
                    encoder: Encoder) -> ReflectionReport:
  """Extracts the session's topics, adds or merges each one (into the memories whose `encoder`
  embeddings are nearest), and ends the session atomically; computed from one snapshot, and
  recomputed when another writer changed what it read (docs/memory.md)."""
  for _ in range(REFLECTION_ATTEMPTS):
    snapshot = bank.reflection_input(user, session_id, encoder.identity)  # or SessionEnded
    adds, merges, report = _plan(snapshot, reflector, encoder)
    try:
      written = bank.apply_reflection(user, session_id, adds, merges, encoder.identity,
                                      expect=snapshot)
    except StaleRead:
      continue
    return dataclasses.replace(report, memory_ids=tuple(written))
  raise StaleRead(f"session {session_id!r} of user {user!r} could not be reflected: the user's "
                  f"memories or the session changed during each of {REFLECTION_ATTEMPTS} attempts")


def _plan(snapshot: ReflectionInput, reflector: Reflector,
          encoder: Encoder) -> tuple[list[NewMemory], list[Merge], ReflectionReport]:
  turns, info = snapshot.turns, snapshot.session
  extraction = reflector.extract(turns, info.date) if turns else Extraction(())
  topics, dropped_ids, dropped_topics = _restrict(extraction.topics, [t.turn_id for t in turns])
  capped = [cap_summary(t.summary) for t in topics]
  topics = [Topic(summary, t.turn_ids) for (summary, _), t in zip(capped, topics, strict=True)]
  cut = sum(was_cut for _, was_cut in capped)
  entries = [_Entry(m.id, m.summary, len(m.snippets), v, [])
             for m, v in zip(snapshot.memories, snapshot.vectors, strict=True)]
  vectors = encoder.encode([t.summary for t in topics]) if topics else []
  merged = fallbacks = 0
  for topic, vector in zip(topics, vectors, strict=True):
    _refresh(entries, encoder)  # later topics compare with a merged memory's new text
    near = _nearest(entries, vector, CANDIDATES)
    candidates = [Candidate(entries[i].summary, s, entries[i].turns) for i, s in near]
    decision = reflector.decide(topic, candidates) if candidates else ADD
    decision = _check_decision(decision, len(candidates), reflector)
    fallbacks += decision.fell_back
    if decision.position is None:
      entries.append(_Entry(None, topic.summary, len(topic.turn_ids), vector,
                            list(topic.turn_ids), changed=True))
      continue
    entry = entries[near[decision.position][0]]
    fresh = [t for t in topic.turn_ids if t not in entry.new_turn_ids]
    summary, was_cut = cap_summary(decision.summary.strip())
    cut += was_cut
    entry.summary, entry.changed, entry.stale = summary, True, True
    entry.new_turn_ids += fresh
    entry.turns += len(fresh)  # a stored memory may hold some of them already: an upper bound
    merged += 1
  _refresh(entries, encoder)
  adds = [NewMemory(e.summary, e.new_turn_ids, e.vector) for e in entries if e.memory_id is None]
  merges = [Merge(e.memory_id, e.summary, e.new_turn_ids, e.vector)
            for e in entries if e.memory_id is not None and e.changed]
  covered = {t for topic in topics for t in topic.turn_ids}
  return adds, merges, ReflectionReport(
      session_id=info.session_id, turns=len(turns), topics=len(topics), added=len(adds),
      merged=merged, updated=len(merges),
      dropped_turn_ids=extraction.dropped_turn_ids + dropped_ids,
      dropped_topics=extraction.dropped_topics + dropped_topics,
      fallbacks=extraction.fallbacks + fallbacks,
      uncovered_turns=sum(t.turn_id not in covered for t in turns), cut_summaries=cut,
      memory_ids=())


def cap_summary(summary: str) -> tuple[str, bool]:
  """The summary cut to MAX_SUMMARY_CHARS (a marker says so), and whether it was cut."""
  (capped,), cut = fit_texts([summary], MAX_SUMMARY_CHARS)
  return capped, bool(cut)
