"""Every text of one user that the memory commands embed, in the form they embed it: deleting
a user also deletes their embeddings from a plain bank's cache (docs/memory.md says why)."""

from __future__ import annotations

from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.topics import turn_text


def embedded_texts(bank: MemoryBank, user: str) -> set[str]:
  """The user's texts, in every form ingest, chat, reflection and LaceMem embed."""
  lace = bank.load_lace(user)
  return ({x for t in bank.turns(user) for x in (t.text, turn_text(t, t.date))}
          | {x for m in bank.memories(user) for x in (m.summary, *(s.text for s in m.snippets))}
          | {f.text for f in (lace.facts if lace is not None else ())})  # LaceMem: facts only
