"""`rmmjax chat` as a user runs it, against an OpenAI-compatible server on 127.0.0.1: SIGKILL
loses no answer that was printed (the resumed run ends with the weights of an uninterrupted
one), Ctrl-C saves and says what it kept, and a server that fails, replies in plain text or
with no text at all never stops it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from chat_server import ChatServer
from rmmjax.memory import MemoryBank, NewMemory

pytestmark = pytest.mark.slow

FACTS = ["Alice adopted a grey cat named Pixel in May", "Alice runs marathons in the spring",
         "Alice works as a nurse at the city hospital", "Alice plays the cello on Sundays",
         "Alice's sister lives in Lisbon", "Alice is learning Japanese"]
QUESTIONS = ["what is the cat called?", "where does her sister live?", "what does she play?",
             "what is her job?", "which language is she learning?", "when does she run?"]


# What the server replies, by its mode: a cited answer, a failure, plain text, no text.
REPLIES = {"cite": json.dumps({"answer": "an answer", "citations": [1, 2]}), "fail": 500,
           "plain": "I think it is Pixel.", "null": None}


@pytest.fixture(scope="module")
def server():
  srv = ChatServer(lambda request: REPLIES[srv.mode])
  srv.mode = "cite"
  yield srv
  srv.close()


@pytest.fixture(scope="module")
def bank_file(tmp_path_factory):
  from rmmjax.encode.encoder import SentenceEncoder
  encoder = SentenceEncoder()
  path = tmp_path_factory.mktemp("chat") / "bank.sqlite"
  with MemoryBank(path) as bank:
    bank.add_user("alice")
    bank.start_session("alice", "s1", "2023-05-08")
    bank.add_turns("alice", "s1", [(f"t{i}", "alice", f) for i, f in enumerate(FACTS)])
    bank.apply_reflection("alice", "s1", [NewMemory(f, [f"t{i}"], v) for i, (f, v) in
                                          enumerate(zip(FACTS, encoder.encode(FACTS)))], [],
                          encoder.identity)
  return path


# A suite started in the background of a shell inherits SIGINT ignored, and so would the chat
# (Python then installs no handler): it is given Python's own, as a terminal's user has it.
_WITH_CTRL_C = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "from rmmjax.cli import main; sys.exit(main(sys.argv[1:]))")


def _chat(server, db, workdir, tmp_path, *extra) -> subprocess.Popen:
  env = dict(os.environ, RMMJAX_CACHE=str(tmp_path / "cache"), JAX_PLATFORMS="cpu")
  return subprocess.Popen(
      [sys.executable, "-c", _WITH_CTRL_C, "chat", "--db", str(db), "--user", "alice",
       "--llm-url", server.url, "--model", "m", "--batch", "2",
       "--candidates", "6", "--m", "3", "--lr", "0.05", "--workdir", str(workdir), *extra],
      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _ask(proc, question: str) -> list[str]:
  """Sends one question and reads the lines of its answer (the answer and its citations)."""
  proc.stdin.write(question + "\n")
  proc.stdin.flush()
  return [proc.stdout.readline(), proc.stdout.readline()]


def _weights(workdir) -> tuple[int, list[np.ndarray]]:
  steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  import jax  # noqa: PLC0415
  from rmmjax import core  # noqa: PLC0415
  from rmmjax.io.checkpoint import Checkpointer  # noqa: PLC0415
  from rmmjax.learners.embedding.model import EMBEDDING  # noqa: PLC0415
  spec = core.CoreSpec(model=EMBEDDING, dim=384, k=6, m=3, batch=2, rank_prior=True)
  template = core.init_state(spec, core.HParams.create(tau=0.5, lr=0.05))
  checkpointer = Checkpointer(workdir / "checkpoints", read_only=True)
  try:
    state = checkpointer.restore(steps[-1], template)
  finally:
    checkpointer.close()
  return steps[-1], [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_sigkill_loses_no_printed_answer_and_resumes_to_the_same_weights(server, bank_file,
                                                                           tmp_path):
  server.mode = "cite"
  whole_db, killed_db = tmp_path / "whole.sqlite", tmp_path / "killed.sqlite"
  shutil.copy(bank_file, whole_db)
  shutil.copy(bank_file, killed_db)
  whole = _chat(server, whole_db, tmp_path / "whole", tmp_path)
  out, err = whole.communicate("\n".join(QUESTIONS) + "\n", timeout=240)
  assert whole.returncode == 0, err[-2000:]
  killed = _chat(server, killed_db, tmp_path / "killed", tmp_path)
  for question in QUESTIONS[:3]:
    assert _ask(killed, question)[0].strip() == "an answer"
  killed.send_signal(signal.SIGKILL)
  killed.wait(timeout=30)
  # Three printed answers: one update checkpointed, the third's reward kept for the next one.
  assert _weights(tmp_path / "killed")[0] == 1
  with np.load(tmp_path / "killed" / "pending.npz") as pending:
    assert int(pending["base_step"]) == 1 and len(pending["rewards"]) == 1
  with MemoryBank(killed_db) as bank:
    assert [t.text for t in bank.turns("alice", "chat-1")][::2] == QUESTIONS[:3]
  resumed = _chat(server, killed_db, tmp_path / "killed", tmp_path)
  out, err = resumed.communicate("\n".join(QUESTIONS[3:]) + "\n", timeout=240)
  assert resumed.returncode == 0, err[-2000:]
  (step_a, weights_a), (step_b, weights_b) = _weights(tmp_path / "whole"), _weights(
      tmp_path / "killed")
  assert step_a == step_b == 3
  for a, b in zip(weights_a, weights_b):
    np.testing.assert_array_equal(a, b)


def test_ctrl_c_saves_and_says_what_it_kept(server, bank_file, tmp_path):
  server.mode = "cite"
  db = tmp_path / "bank.sqlite"
  shutil.copy(bank_file, db)
  proc = _chat(server, db, tmp_path / "w", tmp_path)
  for question in QUESTIONS[:3]:
    _ask(proc, question)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=60)
  assert proc.returncode == 130
  assert "nothing was written" not in err
  assert ("interrupted; 6 turns written by this run are in the bank; the reranker at update 1"
          in err and "1 rewarded answers waiting for the next update" in err), err[-1500:]
  with np.load(tmp_path / "w" / "pending.npz") as pending:
    assert len(pending["rewards"]) == 1


@pytest.mark.parametrize("mode", ["fail", "plain", "null"])
def test_a_failing_or_misbehaving_server_never_stops_the_chat(server, bank_file, tmp_path, mode):
  server.mode = mode
  db = tmp_path / "bank.sqlite"
  shutil.copy(bank_file, db)
  started = time.monotonic()
  proc = _chat(server, db, tmp_path / "w", tmp_path, "--timeout", "5")
  out, err = proc.communicate("\n".join(QUESTIONS[:2]) + "\n/end\n", timeout=240)
  assert proc.returncode == 0, err[-2000:]
  assert "Traceback" not in err and time.monotonic() - started < 200
  stats = out.strip().splitlines()[-1]
  if mode == "plain":
    assert out.count("I think it is Pixel.") == 2 and "malformed replies 2" in stats
  else:
    assert out.count("(the LLM failed:") == 2 and "LLM errors 2" in stats
  assert "session chat-1 reflected" in out  # /end still reflected what was said
  assert "reranker updates: 0" in stats
