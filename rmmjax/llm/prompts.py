"""The prompts: each builds chat messages and the JSON Schema of the reply it asks for.

Items the model may point at are labelled: turn ids as given, memories and evidence numbered
from 1 (`parse.py` turns them back into 0-based positions). Schemas keep every property required
and no extra ones: valid for strict structured output on every server form. With `max_chars` a
prompt's variable texts are cut to fit (`context.py`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import final

from rmmjax.llm.context import fit_texts
from rmmjax.llm.parse import SUFFICIENCY_LABELS

MAX_TOPICS = 12  # per session; also keeps a looping small model from running to max_tokens


@final
@dataclasses.dataclass(frozen=True)
class Prompt:
  messages: list[dict]
  schema: dict  # JSON Schema of the reply; "title" names it for servers that want a name
  cut: int = 0  # texts cut to fit max_chars


def _one_line(text: str) -> str:
  return " ".join(text.split())


def _fitted(texts: Sequence[str], max_chars: int | None, fixed: int,
            per_item: int) -> tuple[list[str], int]:
  """texts (on one line each) cut to share what max_chars leaves after `fixed` characters and
  `per_item` characters of framing each."""
  texts = [_one_line(t) for t in texts]
  if max_chars is None:
    return texts, 0
  return fit_texts(texts, max_chars - fixed - per_item * len(texts))


def _object(title: str | None, properties: dict) -> dict:
  schema = {"type": "object", "properties": properties, "required": list(properties),
            "additionalProperties": False}
  return {"title": title, **schema} if title else schema


def _numbers(n: int) -> dict:
  """Schema of one item number from 1 to n."""
  return {"type": "integer", "enum": list(range(1, n + 1))}


def _numbered(items: Sequence[str]) -> str:
  return "\n".join(f"[{i}] {_one_line(item)}" for i, item in enumerate(items, start=1))


_TOPICS_SYSTEM = """\
You write memory notes at the end of a conversation, to be recalled in later conversations.
Find the topics worth remembering: facts about the people, their plans, preferences, events and \
when they happened. Skip greetings and small talk.
For each topic write a short note that makes sense on its own: name the people and give dates \
where the dialogue has them. List the ids of the turns the note is based on, copied exactly as \
they appear in square brackets (without the brackets).
Reply in JSON: {"topics": [{"summary": "...", "turn_ids": ["..."]}]}. Use an empty list when \
nothing is worth remembering."""


def topic_extraction(turns: Sequence, date: str, max_topics: int = MAX_TOPICS, *,
                     max_chars: int | None = None) -> Prompt:
  """Prompt to extract topic memories from one session's turns (some, ids unique: anything with
  a turn_id, speaker and text, as the loaders and the memory bank hold them), on `date`."""
  turn_ids = [turn.turn_id for turn in turns]
  topic = _object(None, {"summary": {"type": "string"},
                         "turn_ids": {"type": "array", "minItems": 1,
                                      "items": {"type": "string", "enum": turn_ids}}})
  schema = _object("topics", {"topics": {"type": "array", "maxItems": max_topics,
                                         "items": topic}})
  heads = [f"[{turn.turn_id}] {date} - {turn.speaker}: " for turn in turns]
  fixed = len(_TOPICS_SYSTEM) + len(json.dumps(schema)) + sum(map(len, heads)) + 20
  texts, cut = _fitted([turn.text for turn in turns], max_chars, fixed, 1)
  user = "Conversation:\n" + "\n".join(h + t for h, t in zip(heads, texts, strict=True))
  return Prompt([{"role": "system", "content": _TOPICS_SYSTEM},
                 {"role": "user", "content": user}], schema, cut)


_MERGE_SYSTEM = """\
You keep a bank of memory notes. A new note has just been written. Decide whether it is about \
the same topic as one of the existing notes listed with numbers (the same people and the same \
subject, possibly with newer details).
If it is, merge the two: write one note that keeps every detail of both and prefers the newer \
note where they disagree. Reply in JSON: {"action": "merge", "index": <number of the existing \
note>, "summary": "<the merged note>"}.
If it is a different topic, reply in JSON: {"action": "add", "index": null, "summary": null}."""


def add_or_merge(new_summary: str, existing: Sequence[str], *,
                 max_chars: int | None = None) -> Prompt:
  """Prompt to add a new topic memory or merge it into one of the `existing` (some) similar ones."""
  texts, cut = _fitted([new_summary, *existing], max_chars, len(_MERGE_SYSTEM) + 60, 6)
  user = f"Existing notes:\n{_numbered(texts[1:])}\n\nNew note: {texts[0]}"
  schema = _object("memory_update", {
      "action": {"type": "string", "enum": ["add", "merge"]},
      "index": {"anyOf": [_numbers(len(existing)), {"type": "null"}]},
      "summary": {"anyOf": [{"type": "string"}, {"type": "null"}]}})
  return Prompt([{"role": "system", "content": _MERGE_SYSTEM},
                 {"role": "user", "content": user}], schema, cut)


_ANSWER_SYSTEM = """\
You are a personal assistant with a memory of earlier conversations with the user. Answer the \
user's question using the numbered memories below and the current conversation. Rely only on \
what they say; if they do not hold the answer, say that you do not know.
In "citations" list the numbers of the memories you actually used for the answer, and none \
that you did not use; leave the list empty if you used none.
Reply in JSON: {"answer": "...", "citations": [<numbers>]}."""


_MISSING_NOTE = ("Note: the search for this question judged its evidence missing. Unless the "
                 "memories state the answer, say that the conversations do not tell, instead of "
                 "guessing.")


def answer_with_citations(question: str, memories: Sequence[str], current_session: str = "", *,
                          max_chars: int | None = None, evidence_missing: bool = False) -> Prompt:
  """Prompt to answer from numbered memories and cite the ones used (RMM's reward signal);
  `evidence_missing` (an iterative search abstained) asks for a refusal over a guess."""
  # The question and the current conversation get at most a quarter of the budget each.
  quarter = None if max_chars is None else max_chars // 4
  (question,), cut_question = fit_texts([question.strip()], quarter)
  (current_session,), cut_session = fit_texts([current_session.strip()], quarter)
  fixed = len(_ANSWER_SYSTEM) + len(question) + len(current_session) + 80 + (
      len(_MISSING_NOTE) if evidence_missing else 0)
  memories, cut = _fitted(memories, max_chars, fixed, 6)
  shown = _numbered(memories) if memories else "(no memories retrieved)"
  user = f"Memories:\n{shown}\n\n"
  if current_session:
    user += f"Current conversation:\n{current_session}\n\n"
  user += f"Question: {question}"
  if evidence_missing:
    user += f"\n\n{_MISSING_NOTE}"
  # An empty enum is not a valid schema: with no memories, only the empty list fits.
  citations = ({"type": "array", "items": _numbers(len(memories))} if memories
               else {"type": "array", "items": {"type": "integer"}, "maxItems": 0})
  schema = _object("cited_answer", {"answer": {"type": "string"}, "citations": citations})
  return Prompt([{"role": "system", "content": _ANSWER_SYSTEM},
                 {"role": "user", "content": user}], schema, cut + cut_question + cut_session)


_JUDGE_SYSTEM = """\
You grade answers to questions about past conversations. Compare the candidate answer with the \
reference answer. The candidate is correct when it states the same fact as the reference, in any \
wording; for dates and numbers it must agree at the precision the reference gives. A candidate \
that says it does not know, that misses the point, or that contradicts the reference is not \
correct.
Reply in JSON: {"correct": true} or {"correct": false}."""


def answer_judge(question: str, gold: str, candidate: str, *,
                 max_chars: int | None = None) -> Prompt:
  """Prompt for a binary verdict: does the candidate answer match the reference answer."""
  (question, gold, candidate), cut = _fitted([question.strip(), gold.strip(), candidate.strip()],
                                             max_chars, len(_JUDGE_SYSTEM) + 60, 0)
  user = f"Question: {question}\nReference answer: {gold}\nCandidate answer: {candidate}"
  schema = _object("verdict", {"correct": {"type": "boolean"}})
  return Prompt([{"role": "system", "content": _JUDGE_SYSTEM},
                 {"role": "user", "content": user}], schema, cut)


_SUFFICIENCY_SYSTEM = """\
You decide whether the evidence gathered so far is enough to answer a question. Label it:
EXACT when one piece of evidence states the answer outright;
INFERRABLE when the answer follows from combining or reasoning over the evidence;
PARTIAL when something needed to answer is still missing.
Give your confidence in the label as a number from 0 to 1, and under "missing" say briefly what \
information is still needed (an empty string when nothing is).
Reply in JSON: {"label": "EXACT" | "INFERRABLE" | "PARTIAL", "confidence": <0 to 1>, \
"missing": "..."}."""


def sufficiency_judge(question: str, evidence: Sequence[str], *,
                      max_chars: int | None = None) -> Prompt:
  """Prompt to judge whether numbered evidence suffices to answer the question (IRIS)."""
  (question,), cut_question = fit_texts([question.strip()],
                                        None if max_chars is None else max_chars // 4)
  evidence, cut = _fitted(evidence, max_chars, len(_SUFFICIENCY_SYSTEM) + len(question) + 40, 6)
  shown = _numbered(evidence) if evidence else "(no evidence yet)"
  user = f"Evidence:\n{shown}\n\nQuestion: {question}"
  schema = _object("sufficiency", {
      "label": {"type": "string", "enum": list(SUFFICIENCY_LABELS)},
      "confidence": {"type": "number", "minimum": 0, "maximum": 1},
      "missing": {"type": "string"}})
  return Prompt([{"role": "system", "content": _SUFFICIENCY_SYSTEM},
                 {"role": "user", "content": user}], schema, cut + cut_question)
