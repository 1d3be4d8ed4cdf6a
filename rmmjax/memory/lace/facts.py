"""LaceMem's Index layer input: a turn cut into atomic statements (subject, predicate, object).

Offline extraction is deterministic and cheap: sentences, then semicolons, then the connectors
"and", "but" and "because" where both sides are long enough to stand alone (`parse_clause` then
finds each clause's parts).
"""

from __future__ import annotations

import dataclasses
import re
from typing import final


MIN_SIDE_WORDS = 3  # a connector splits a clause only when both sides have this many words
_IMAGE = re.compile(r"\[shares an image:\s*([^\]]*)\]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_CONNECTOR = re.compile(r"\s+(and|but|because)\s+", re.IGNORECASE)
_TOKEN = re.compile(r"[A-Za-z][A-Za-z']*")
_NAME = re.compile(r"[A-Z][a-z]+")
_CONTRACTIONS = {"'m": "am", "'re": "are", "'s": "is", "'ve": "have", "'ll": "will", "'d": "would"}
# Words that open a clause but never name its subject.
_NOT_NAMES = frozenset(
    "i you he she it we they me my your his her its our their this that these those there here "
    "what who which when where why how the a an so well oh ah hey hi hello wow yes yeah yep no "
    "nope thanks thank sure ok okay great awesome cool nice sounds gonna glad hope love just "
    "really also anyway and but because".split())
# Common verbs and auxiliaries; other verbs are caught by their -ed or -ing ending.
_VERBS = frozenset(
    "am is are was were be been has have had do does did will would can could shall should may "
    "might must go goes went get gets got make makes made take takes took love loves like likes "
    "want wants feel feels felt think thinks thought know knows knew see sees saw say says said "
    "tell told give gave find found keep kept leave left meet met run ran come came become "
    "became buy bought bring brought read write wrote hear heard try tries need needs plan "
    "plans enjoy enjoys start starts visit visits help helps work works live lives play plays "
    "paint paints took adopt adopts join joins hope hopes".split())
# Words whose ending looks like a verb's but which seldom are one.
_NOT_VERBS = frozenset("anything something nothing everything morning evening during wedding "
                       "spring king ring sibling indeed hundred speed".split())


@final
@dataclasses.dataclass(frozen=True)
class Draft:
  """One statement of a turn before it becomes a fact: its parts and its clause as written."""

  subject: str
  predicate: str
  object: str
  clause: str


def _split_connectors(text: str, min_words: int) -> list[str]:
  pieces, start = [], 0
  for match in _CONNECTOR.finditer(text):
    if (len(text[start:match.start()].split()) >= min_words
        and len(text[match.end():].split()) >= min_words):
      pieces.append(text[start:match.start()].strip())
      # "and" only joins; "but" and "because" carry meaning, so the right side keeps them.
      start = match.end() if match.group(1).lower() == "and" else match.start(1)
  pieces.append(text[start:].strip())
  return [p for p in pieces if p]


def split_clauses(text: str, min_words: int = MIN_SIDE_WORDS) -> list[str]:
  """The clauses of a text, in order; text with no word at all stays one clause (or none)."""
  clauses = [p for sentence in _SENTENCE_END.split(text.strip()) for part in sentence.split(";")
             for p in _split_connectors(part.strip(), min_words) if any(c.isalnum() for c in p)]
  return clauses or ([text.strip()] if text.strip() else [])


def _verb(token: str) -> str | None:
  """The predicate a token stands for, or None when it does not look like a verb."""
  low = token.lower()
  for suffix, verb in _CONTRACTIONS.items():
    if low.endswith(suffix) and len(low) > len(suffix):
      return verb
  regular = (low.endswith("ed") and len(low) >= 4) or (low.endswith("ing") and len(low) >= 5)
  if low in _VERBS or low.endswith("n't") or (regular and low not in _NOT_VERBS):
    return low
  return None


def parse_clause(clause: str, speaker: str) -> Draft:
  """Subject (the speaker, or a leading name followed by a verb), first verb, and the rest."""
  tokens = list(_TOKEN.finditer(clause.replace("\u2019", "'")))
  subject, first = speaker, 0
  if (len(tokens) >= 2 and _NAME.fullmatch(tokens[0].group())
      and tokens[0].group().lower() not in _NOT_NAMES
      and clause[tokens[0].end():tokens[1].start()].strip() == ""
      and _verb(tokens[1].group()) is not None):
    subject, first = tokens[0].group(), 1
  for token in tokens[first:]:
    if (verb := _verb(token.group())) is not None:
      rest = clause[token.end():].strip(" \t,.!?;:-")
      return Draft(subject, verb, rest or clause.strip(), clause)
  return Draft(subject, "says", clause.strip(), clause)


def take_images(text: str) -> tuple[str, list[str]]:
  """The text without its "[shares an image: ...]" marks, and the captions they held."""
  captions = [c.strip() for c in _IMAGE.findall(text)]
  return " ".join(_IMAGE.sub(" ", text).split()), [c for c in captions if c]


def turn_drafts(speaker: str, text: str) -> list[Draft]:
  """A turn's statements: its words' clauses, then one per image it shares."""
  words, captions = take_images(text)
  drafts = [parse_clause(c, speaker) for c in split_clauses(words)] if words else []
  return drafts + [Draft(speaker, "shares", f"an image: {c}", f"shares an image: {c}")
                   for c in captions]
