"""Every text of one user that the memory commands embed, in the form they embed it.

An embedding cache keyed by a text's hash tells whoever reads it which texts were embedded, and
its vectors can be inverted towards the text. Deleting a user therefore also deletes, from a
plain bank's cache, the embeddings of the texts the bank holds of them: each turn as a bare text
and as the dated line reflection embeds, each memory summary and snippet, and each LaceMem
fact. (Encrypted banks never use the cache; queries are never written to it.)
"""

from __future__ import annotations

from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.topics import turn_text


def embedded_texts(bank: MemoryBank, user: str) -> set[str]:
  """The user's texts, in every form ingest, chat, reflection and LaceMem embed."""
  texts: set[str] = set()
  for turn in bank.turns(user):
    texts |= {turn.text, turn_text(turn, turn.date)}
  for memory in bank.memories(user):
    texts.add(memory.summary)
    texts |= {s.text for s in memory.snippets}
  lace = bank.load_lace(user)
  if lace is not None:
    texts |= {f.text for f in lace.facts}  # LaceMem embeds its facts only
  return texts
