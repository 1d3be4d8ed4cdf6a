"""Memory units of every granularity, topics included: topic units are the memories that
Prospective Reflection leaves after a conversation's sessions, so they need the encoder that
segments and compares topics (the per-session granularities are in rmmjax.retrieve.units)."""

from __future__ import annotations

from rmmjax.data.schema import Conversation
from rmmjax.memory.ingest import replay_topics
from rmmjax.memory.records import Memory
from rmmjax.retrieve.units import Unit, build_units


def topic_text(memory: Memory) -> str:
  """A topic memory's text as a topic unit holds it: what rerankers trained on topic units read,
  and so what the agent scores a bank's memories by (the generator is shown more: the summary
  with its dated turns)."""
  return memory.summary


def topic_units(conversation: Conversation, encoder, reflector=None) -> list[Unit]:
  """Each memory left by replaying the conversation's sessions through a fresh bank (the
  offline reflector by default) as a unit of its text covering all its snippets' turns."""
  return [Unit(f"topic{i}", topic_text(m), tuple(s.turn_id for s in m.snippets),
               len(topic_text(m).split()))
          for i, m in enumerate(replay_topics(conversation, encoder, reflector), start=1)]


def conversation_units(conversation: Conversation, granularity: str,
                       encoder=None) -> list[Unit]:
  """All units of one conversation at a granularity of UNITS, in conversation order."""
  if granularity != "topic":
    return build_units(conversation, granularity)
  if encoder is None:
    raise ValueError("units 'topic' need an encoder (topics are found and merged by embedding "
                     "similarity)")
  return topic_units(conversation, encoder)
