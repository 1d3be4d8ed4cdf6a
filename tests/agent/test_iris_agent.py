"""IRIS in the agent: a user's LaceMem in the bank kept in step with their turns (built when
missing, extended as they chat, never losing a turn to a concurrent writer), answers through
IRIS from a real HTTP server on 127.0.0.1 (an abstention asks the LLM for a refusal), and
`recall --iris` / `chat --iris` from the command line, with their refusals."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from chat_server import ChatServer
from rmmjax.agent import IrisAgent
from rmmjax.cli import main
from rmmjax.data.schema import Conversation, Session, Turn
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.llm.client import LLMSettings, OpenAICompatibleLLM
from rmmjax.llm.prompts import _MISSING_NOTE
from rmmjax.memory import MemoryBank
from rmmjax.memory.lace import LaceMem
from rmmjax.memory.lace import add_missing_turns, synced_lace
from rmmjax.memory.records import EncoderMismatch
from rmmjax.retrieve.iris import IrisSettings

SESSIONS = {
    "s1": ("8 May 2023", ["Alice adopted a grey cat named Pixel last week.",
                          "Bob said his brother lives in Lisbon and teaches maths.",
                          "Alice is training for the spring marathon in Boston."]),
    "s2": ("20 June 2023", ["Alice started cello lessons on Sundays.",
                            "Bob moved to a flat near the river with his dog Rex.",
                            "Alice said Pixel likes to sleep on the piano."]),
}


@pytest.fixture(scope="module")
def encoder():
  return SentenceEncoder()


def _fill(bank: MemoryBank, sessions=SESSIONS) -> None:
  bank.add_user("alice", exist_ok=True)
  for sid, (date, texts) in sessions.items():
    bank.start_session("alice", sid, date)
    bank.add_turns("alice", sid, [(f"{sid}:{i}", "Alice" if i % 2 == 0 else "Bob", t)
                                  for i, t in enumerate(texts)])


@pytest.fixture
def db(tmp_path):
  path = tmp_path / "bank.sqlite"
  with MemoryBank(path) as bank:
    _fill(bank)
  return path


def test_a_built_lace_has_every_turn_with_the_facts_of_a_batch_build(db, encoder):
  with MemoryBank(db) as bank:
    lace, added = synced_lace(bank, "alice", encoder, progress=False)
    assert added == 6
    conv = Conversation("c", tuple(Session(sid, date, tuple(
        Turn(f"{sid}:{i}", "Alice" if i % 2 == 0 else "Bob", t) for i, t in enumerate(texts)))
        for sid, (date, texts) in SESSIONS.items()), ())
    batch = LaceMem.from_conversation(conv, encoder)
    assert [f.text for f in lace.facts] == [f.text for f in batch.facts]
    assert [(f.turn_id, f.session_id) for f in lace.facts] == [
        (f.turn_id, f.session_id) for f in batch.facts]
    np.testing.assert_allclose(lace.fact_vectors(list(range(len(lace)))),
                               batch.fact_vectors(list(range(len(batch)))), atol=1e-5)
    # Saved: a fresh load holds the same facts, and a second sync adds nothing.
    again, added = synced_lace(bank, "alice", encoder, progress=False)
    assert added == 0 and [f.text for f in again.facts] == [f.text for f in lace.facts]


def test_turns_added_later_reach_the_lace_and_a_concurrent_writer_loses_none(db, encoder):
  with MemoryBank(db) as one, MemoryBank(db) as two:
    a, _ = synced_lace(one, "alice", encoder, progress=False)
    b, _ = synced_lace(two, "alice", encoder, progress=False)
    # Each process appends a turn and saves its own LaceMem: the later save replaces the other.
    _, first = one.append_chat("alice", [("user", "Bob's brother moved to Porto.")], "1 July")
    assert add_missing_turns(a, one, "alice") == 1
    _, second = two.append_chat("alice", [("user", "The dog learnt to swim.")], "1 July")
    assert add_missing_turns(b, two, "alice") == 2  # its own turn and the other's
    turns = {t.turn_id for t in one.turns("alice")}
    assert turns == {t.turn_id for t in LaceMem.load(one, "alice", encoder).turns}
    assert set(first + second) <= turns


def test_a_lace_of_another_encoder_is_refused_until_rebuilt(db, encoder):
  @dataclasses.dataclass
  class Other:
    identity: str = "another-encoder"
    dim: int = encoder.dim

    def encode(self, texts):
      return np.eye(len(texts), self.dim, dtype=np.float32)

  with MemoryBank(db) as bank:
    synced_lace(bank, "alice", Other(), progress=False)
    with pytest.raises(EncoderMismatch, match="another-encoder.*--rebuild-lace"):
      synced_lace(bank, "alice", encoder, progress=False)
    lace, added = synced_lace(bank, "alice", encoder, progress=False, rebuild=True)
    assert added == 6
    assert LaceMem.load(bank, "alice", encoder).encoder.identity == encoder.identity


@pytest.fixture(scope="module")
def server():
  srv = ChatServer(lambda request: json.dumps({"answer": "Pixel", "citations": [1]}))
  yield srv
  srv.close()


def _llm(server):
  return OpenAICompatibleLLM(LLMSettings(server.url, "m", timeout_s=10.0))


def test_respond_answers_from_the_lace_records_the_exchange_and_adds_it(db, encoder, server):
  with MemoryBank(db) as bank:
    agent = IrisAgent(bank, encoder, m=3, llm=_llm(server), progress=False)
    response = agent.respond("alice", "What is the name of Alice's cat?")
    assert response.answer == "Pixel" and response.cited == (0,)
    assert not response.abstained and _MISSING_NOTE not in server.prompts[-1]
    assert "Pixel" in " ".join(response.shown_texts)
    assert response.shown_texts[0] in server.prompts[-1]
    recorded = bank.turns("alice", response.session_id)
    assert [t.text for t in recorded] == ["What is the name of Alice's cat?", "Pixel"]
    # Neither the question nor the answer is evidence: asked again, the question does not
    # find itself, with a question mark or without one (what a turn is, its writer says).
    assert [t.kind for t in recorded] == ["question", "answer"]
    assert not {t.turn_id for t in recorded} & {t.turn_id for t in agent.store("alice").turns}
    for question in ("What is the name of Alice's cat?", "what is the name of alice's cat"):
      again = agent.respond("alice", question)
      assert all("the name of" not in text.lower() for text in again.shown_texts)
    # A statement the user tells the agent is evidence, at once, and saved.
    session = agent.tell("alice", "Alice bought a red kayak in July")
    ids = {t.turn_id for t in agent.store("alice").turns}
    told = bank.turns("alice", session)[-1]
    assert told.kind == "statement" and told.turn_id in ids
    assert ids == {t.turn_id for t in LaceMem.load(bank, "alice", encoder).turns}
    assert "kayak" in agent.respond("alice", "What did Alice buy in July?").shown_texts[0]


def test_an_abstention_asks_the_llm_to_say_the_evidence_is_missing(db, encoder, server):
  # One iteration that abstains on any PARTIAL verdict below certainty (the goldfish is nowhere).
  settings = IrisSettings(max_iterations=1, abstain_below=1.0)
  with MemoryBank(db) as bank:
    agent = IrisAgent(bank, encoder, m=3, llm=_llm(server), settings=settings, progress=False)
    response = agent.respond("alice", "What is the name of Alice's goldfish?")
    assert response.abstained and agent.stats["abstained"] == 1
    assert _MISSING_NOTE in server.prompts[-1]


def _cli(*args, cwd) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-m", "rmmjax.cli", *args], capture_output=True,
                        text=True, env=env, cwd=cwd, timeout=300)


@pytest.mark.slow
def test_recall_iris_builds_the_lace_then_answers_and_refuses_bad_flags(db, tmp_path, capsys):
  run = _cli("recall", "--db", str(db), "--user", "alice", "--iris", "--json", "--k", "2",
             "Where does Bob's brother live?", cwd=tmp_path)
  assert run.returncode == 0, run.stderr[-2000:]
  out = json.loads(run.stdout)
  assert len(out["turns"]) == 2 and out["turns"][0]["turn_id"] == "s1:1"
  assert out["iterations"] >= 1 and out["label"] in ("EXACT", "INFERRABLE", "PARTIAL")
  with MemoryBank(db) as bank:  # built and saved by the first run
    assert len(LaceMem.load(bank, "alice", None).turns) == 6
  for flags, message in [
      (("--iris-model", str(tmp_path)), "pass --iris as well"),
      (("--iris", "--reranker", str(tmp_path)), "drop --reranker"),
      (("--iris", "--retriever", "bm25"), "drop --retriever"),
      (("--iris", "--iris-model", str(tmp_path / "none")), "expected a learner=iris workdir"),
  ]:
    # The refusals in this process: what they test is the message, not a process's start.
    code = main(["recall", "--db", str(db), "--user", "alice", *flags, "a question"])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err[-1500:]


@pytest.mark.slow
def test_chat_iris_answers_records_and_reflects(db, tmp_path, server):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  run = subprocess.run(
      [sys.executable, "-m", "rmmjax.cli", "chat", "--db", str(db), "--user", "alice", "--iris",
       "--llm-url", server.url, "--model", "m", "--m", "3"],
      input="What is the cat called?\n/qiut\nWhere does Bob's brother live?\n/end\n",
      capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]
  assert run.stdout.count("Pixel") >= 2 and "cited: [1]" in run.stdout
  assert "session chat-1 reflected" in run.stdout
  assert "/qiut: not a command" in run.stdout  # and not a question: 4 turns, not 6
  assert "IRIS abstentions" in run.stdout and "IRIS serves" in run.stdout
  with MemoryBank(db) as bank:
    assert len(bank.turns("alice", "chat-1")) == 4
    # The chat's questions and answers are in the bank, not among the evidence.
    assert {t.turn_id for t in bank.turns("alice") if not t.session_id.startswith("chat")} == {
        t.turn_id for t in LaceMem.load(bank, "alice", None).turns}


def test_the_lace_takes_statements_from_one_snapshot_of_the_bank(db, encoder, monkeypatch):
  with MemoryBank(db) as bank:
    lace, _ = synced_lace(bank, "alice", encoder, progress=False)
    bank.append_chat("alice", [("user", "what is the cat called", "question"),
                               ("assistant", "Pixel.", "answer")], "1 July")
    _, told = bank.append_chat("alice", [("user", "Pixel is nine years old")], "1 July")
    # What a turn is comes with the turn: the sessions are not read apart (a chat session
    # opened between two reads would let its question in).
    monkeypatch.setattr(bank, "sessions", lambda *a: pytest.fail("sessions read apart"))
    assert add_missing_turns(lace, bank, "alice") == 1
    assert told[0] in {t.turn_id for t in lace.turns}
