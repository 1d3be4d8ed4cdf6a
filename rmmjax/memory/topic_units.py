"""Memory units of every granularity, topics included: topic units are the memories that
Prospective Reflection leaves after a conversation's sessions, so they need the encoder that
segments and compares topics (the per-session granularities are in rmmjax.retrieve.units)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from rmmjax.data.schema import Conversation
from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.ingest import ingest_conversations
from rmmjax.memory.records import Memory
from rmmjax.memory.topics import OfflineReflector
from rmmjax.retrieve.units import Unit, build_units


def topic_text(memory: Memory) -> str:
  """A topic memory's text as a topic unit holds it: what rerankers trained on topic units read,
  and so what the agent scores a bank's memories by (the generator is shown more: the summary
  with its dated turns)."""
  return memory.summary


def conversation_units(conversation: Conversation, granularity: str, encoder=None) -> list[Unit]:
  """All units of one conversation at a granularity of UNITS, in conversation order: a topic
  unit is a memory that replaying the sessions through a fresh bank with the offline reflector
  leaves, as its text covering all its snippets' turns."""
  if granularity != "topic":
    return build_units(conversation, granularity)
  if encoder is None:
    raise ValueError("units 'topic' need an encoder (topics are found and merged by embedding "
                     "similarity)")
  user = conversation.conversation_id
  with tempfile.TemporaryDirectory(prefix="rmmjax-topics-") as folder:
    with MemoryBank(Path(folder) / "memory.sqlite") as bank:
      ingest_conversations(bank, [conversation], OfflineReflector(encoder), encoder, user=user)
      memories = bank.memories(user)
  return [Unit(f"topic{i}", topic_text(m), tuple(s.turn_id for s in m.snippets),
               len(topic_text(m).split())) for i, m in enumerate(memories, start=1)]
