"""Several writers of one user: nothing lost, misfiled or duplicated, in one process (a write
that lands while a reflection computes) and across processes (chats and ingests at once)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hash_encoder import HashEncoder
from rmmjax.data.schema import Conversation, Session, Turn
from rmmjax.memory import MemoryBank, NewMemory
from rmmjax.memory.ingest import ingest_conversations
from rmmjax.memory.reflection import Reflector, reflect_session
from rmmjax.memory.topics import OfflineReflector

ROOT = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parents[1] / "helpers"
CAT = "Alice adopted a grey cat named Pixel in May"


class _Meanwhile(Reflector):
  """The offline reflector, with another writer's change landing during its first extract:
  after the reflection has read the bank and before it writes."""

  def __init__(self, offline: OfflineReflector, meanwhile):
    self.offline, self.meanwhile, self.extracts = offline, meanwhile, 0

  def extract(self, turns, date):
    self.extracts += 1
    if self.extracts == 1:
      self.meanwhile()
    return self.offline.extract(turns, date)

  def decide(self, topic, candidates):
    return self.offline.decide(topic, candidates)


def _cat_bank(path, encoder) -> MemoryBank:
  bank = MemoryBank(path)
  bank.add_user("u")
  bank.start_session("u", "S1", "2023-05-08")
  bank.add_turns("u", "S1", [("t1", "Alice", CAT)])
  bank.apply_reflection("u", "S1", [NewMemory(CAT, ["t1"], encoder.encode([CAT])[0])], [],
                        encoder.identity)
  for session, text in (("S2", "Alice said the grey cat Pixel sleeps in May"),
                        ("S3", "Alice says Pixel the grey cat was adopted in May")):
    bank.start_session("u", session, "2023-06-01")
    bank.add_turns("u", session, [(f"{session}:1", "Alice", text)])
  return bank


def test_a_merge_made_during_a_reflection_is_not_lost(tmp_path):
  encoder = HashEncoder()
  bank = _cat_bank(tmp_path / "bank.sqlite", encoder)
  offline = OfflineReflector(encoder, merge_at=0.5)
  reflector = _Meanwhile(offline, lambda: reflect_session(bank, "u", "S3", offline, encoder))
  reflect_session(bank, "u", "S2", reflector, encoder)
  (memory,) = bank.memories("u")
  # Both sessions merged into the one memory, and its summary kept every one of them.
  assert [s.turn_id for s in memory.snippets] == ["t1", "S3:1", "S2:1"]
  assert all(s.text in memory.summary for s in memory.snippets)
  assert reflector.extracts == 2  # the first plan was stale: read and computed again


def test_a_turn_appended_during_a_reflection_is_reflected(tmp_path):
  encoder = HashEncoder()
  bank = _cat_bank(tmp_path / "bank.sqlite", encoder)
  session, _ = bank.append_chat("u", [("user", "what is my cat called?")], "2023-07-01")
  late = lambda: bank.append_chat("u", [("assistant", "Your cat is Pixel.")], "2023-07-01")
  reflect_session(bank, "u", session, _Meanwhile(OfflineReflector(encoder), late), encoder)
  assert bank.sessions("u")[-1].ended
  snippets = {s.turn_id for m in bank.memories("u") for s in m.snippets}
  assert {t.turn_id for t in bank.turns("u", session)} == {f"{session}:1", f"{session}:2"}
  assert {f"{session}:1", f"{session}:2"} <= snippets


_CHAT = """
import json, sys
sys.path.insert(0, sys.argv[4])
from hash_encoder import HashEncoder
from rmmjax.agent import Agent, AgentSettings
from scripted_llm import ScriptedLLM
from rmmjax.memory import MemoryBank, SessionEnded
path, tag, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
replies = [json.dumps({"answer": f"{tag} answer {i}", "citations": [1]}) for i in range(n)]
with MemoryBank(path) as bank:
  agent = Agent(bank, HashEncoder(), AgentSettings(k=4, m=2, batch=2, lr=0.05),
                llm=ScriptedLLM(replies))
  ended = 0
  for i in range(n):
    agent.respond("u", f"{tag} asks {i}: how are the garden roses doing?")
    if i % 5 == 4:
      try:
        agent.end_session("u")
        ended += 1
      except SessionEnded:  # another chat ended the shared session after this one found it open
        pass
      except ValueError as err:  # another chat ended the shared session first
        if "no open chat session" not in str(err):
          raise
print(json.dumps({"updates": agent.stats["updates"], "ended": ended}))
"""

_INGEST = """
import json, sys
sys.path.insert(0, sys.argv[3])
from hash_encoder import HashEncoder
from rmmjax.data.schema import Conversation, Session, Turn
from rmmjax.memory import MemoryBank
from rmmjax.memory.ingest import ingest_conversations
from rmmjax.memory.topics import OfflineReflector
sessions = json.loads(sys.argv[2])
conv = Conversation("c", tuple(Session(s, d, tuple(Turn(*t) for t in turns))
                               for s, d, turns in sessions), ())
encoder = HashEncoder()
with MemoryBank(sys.argv[1]) as bank:
  counts = ingest_conversations(bank, [conv], OfflineReflector(encoder), encoder, user="u")
print(json.dumps({"sessions": counts["sessions"], "skipped": counts["sessions_skipped"]}))
"""


def _dataset() -> list:
  words = ["garden roses", "grey cat Pixel", "marathon training", "cello lessons"]
  return [(f"S{s}", f"2023-0{s}-01",
           [(f"D{s}:{i}", ("Alice", "Bob")[i % 2], f"{words[(s + i // 3) % 4]} story {s}.{i}")
            for i in range(1, 9)]) for s in range(1, 7)]


def test_chats_and_ingests_of_one_user_at_once_lose_nothing(tmp_path):
  path, n = tmp_path / "bank.sqlite", 12
  with MemoryBank(path) as bank:
    bank.add_user("u")
  data = json.dumps(_dataset())
  procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_CHAT), str(path), tag, str(n),
                             str(HELPERS)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for tag in ("ann", "ben")]
  procs += [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_INGEST), str(path), data,
                              str(HELPERS)], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]
  outs = []
  for proc in procs:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    outs.append(json.loads(out.strip().splitlines()[-1]))
  assert [o["updates"] for o in outs[:2]] == [n // 2, n // 2]  # every answer was rewarded
  # The two ingests of one file shared its six sessions: each reflected once.
  assert sum(o["sessions"] for o in outs[2:]) == 6
  assert all(o["sessions"] + o["skipped"] == 6 for o in outs[2:])
  with MemoryBank(path) as bank:
    sessions = {s.session_id: s for s in bank.sessions("u")}
    turns = bank.turns("u")
    memories = bank.memories("u")
  # Every chat exchange is there once, in a chat session; the dataset's turns only in its own.
  for tag in ("ann", "ben"):
    asked = [t for t in turns if t.text.startswith(f"{tag} asks ")]
    answered = [t for t in turns if t.text.startswith(f"{tag} answer ")]
    assert sorted(t.text for t in asked) == sorted(
        f"{tag} asks {i}: how are the garden roses doing?" for i in range(n))
    assert len(answered) == n
    assert all(sessions[t.session_id].origin == "chat" for t in asked + answered)
  dataset = {t[0]: (s, d) for s, d, ts in _dataset() for t in ts}
  assert {t.turn_id: (t.session_id, t.date) for t in turns if t.turn_id in dataset} == dataset
  assert all(sessions[s].origin == "ingest" and sessions[s].ended for s, _ in dataset.values())
  assert len({t.turn_id for t in turns}) == len(turns) == n * 4 + len(dataset)
  # Every turn of every reflected session is in a memory, whose summary still holds its text.
  snippets = {s.turn_id for m in memories for s in m.snippets}
  assert {t.turn_id for t in turns if sessions[t.session_id].ended} <= snippets
  assert all(s.text in m.summary for m in memories for s in m.snippets)


def test_ingest_never_appends_to_a_chat_session_and_chat_never_to_a_dataset_one(tmp_path):
  encoder = HashEncoder()
  with MemoryBank(tmp_path / "bank.sqlite") as bank:
    bank.add_user("u")
    # A dataset session left open (an ingest stopped before its reflection)...
    bank.ingest_session("u", "S1", "2023-01-01", [("D1:1", "Alice", "roses in the garden")])
    # ...is not where a chat writes: it opens its own session.
    session, ids = bank.append_chat("u", [("user", "hello")], "2024-01-01")
    assert (session, ids) == ("chat-1", ["chat-1:1"])
    assert [t.turn_id for t in bank.turns("u", "S1")] == ["D1:1"]
    # A dataset whose session id is the chat's is refused, not merged into it.
    conv = Conversation("c", (Session("chat-1", "2024-01-01", (Turn("x:1", "A", "hi"),)),), ())
    with pytest.raises(ValueError, match="was opened by chat"):
      ingest_conversations(bank, [conv], OfflineReflector(encoder), encoder, user="u")
    assert [t.text for t in bank.turns("u", "chat-1")] == ["hello"]
