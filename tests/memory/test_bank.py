"""The memory bank: per-user scoping, one transaction per write (a SIGKILL inside one leaves the
bank as it was), four writer processes at once, complete deletion, encoder identity, export and
import, and encryption at rest."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hash_encoder import HashEncoder

from rmmjax.memory import (
    BankFileError, BankKeyError, EncoderMismatch, MemoryBank, Merge, NewMemory, UnknownRecord,
    bank as bank_module, generate_key, key_from_env)
from rmmjax.memory.lace import LaceMem

ROOT = Path(__file__).resolve().parents[2]


def _vec(seed: int, dim: int = 8) -> np.ndarray:
  return np.random.default_rng(seed).normal(size=dim).astype(np.float32)


def _fill(bank: MemoryBank, user: str, *, sessions: int = 2, turns: int = 6) -> list[int]:
  """sessions of turns for user, each reflected: two memories, then a merge into the first."""
  first = None
  for s in range(sessions):
    sid = f"{user}-S{s}"
    bank.start_session(user, sid, f"2024-03-{s + 1:02d}")
    bank.add_turns(user, sid, [(f"{user}:D{s}:{k}", "me" if k % 2 else "bot",
                                f"{user} told story {s}.{k}") for k in range(turns)])
    adds = [NewMemory(f"{user} topic {s}a", [f"{user}:D{s}:0", f"{user}:D{s}:1"], _vec(s)),
            NewMemory(f"{user} topic {s}b", [f"{user}:D{s}:2"], _vec(s + 100))]
    merges = [] if first is None else [
        Merge(first, f"{user} topic 0a, again in {s}", [f"{user}:D{s}:3", f"{user}:D0:0"],
              _vec(s + 200))]
    ids = bank.apply_reflection(user, sid, adds, merges, "enc-a", now=1000.0 + s)
    first = first or ids[0]
  return [m.id for m in bank.memories(user)]


def _integrity(path: Path) -> None:
  with sqlite3.connect(path) as db:
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []


def _file_bytes(path: Path) -> bytes:
  return b"".join(p.read_bytes() for p in (path, Path(f"{path}-wal")) if p.exists())


def test_sessions_turns_memories_and_merges(tmp_path):
  with MemoryBank(tmp_path / "bank.sqlite") as bank:
    bank.add_user("ann")
    assert bank.users() == ["ann"] and bank.has_user("ann") and not bank.has_user("bob")
    ids = _fill(bank, "ann", sessions=3)
    assert [(s.session_id, s.ordinal, s.ended) for s in bank.sessions("ann")] == [
        ("ann-S0", 0, True), ("ann-S1", 1, True), ("ann-S2", 2, True)]
    turns = bank.turns("ann", "ann-S1")
    assert [(t.turn_id, t.speaker, t.text, t.date) for t in turns[:2]] == [
        ("ann:D1:0", "bot", "ann told story 1.0", "2024-03-02"),
        ("ann:D1:1", "me", "ann told story 1.1", "2024-03-02")]
    assert len(bank.turns("ann")) == 18
    first = bank.memories("ann")[0]
    # Two merges: every old snippet kept, new ones appended, a repeated turn id stored once.
    assert first.summary == "ann topic 0a, again in 2"
    assert [s.turn_id for s in first.snippets] == ["ann:D0:0", "ann:D0:1", "ann:D1:3", "ann:D2:3"]
    assert first.snippets[2] == ("ann:D1:3", "ann-S1", "2024-03-02", "ann told story 1.3")
    assert (first.created, first.updated) == (1000.0, 1002.0)
    _, memories, matrix = bank.memory_snapshot("ann", "enc-a")
    assert [m.id for m in memories] == ids
    assert matrix.dtype == np.float32 and matrix.shape == (len(ids), 8)
    np.testing.assert_array_equal(matrix[0], _vec(202))  # the last merge's embedding
    with pytest.raises(ValueError, match="has ended"):
      bank.add_turns("ann", "ann-S0", [("x", "me", "late")])
    with pytest.raises(ValueError, match="reflection is already applied"):
      bank.apply_reflection("ann", "ann-S0", [], [], "enc-a")
    bank.start_session("ann", "ann-S3", "2024-04-01")
    with pytest.raises(ValueError, match=r"already has turn 'ann:D0:1' \(in session 'ann-S0'\)"):
      bank.add_turns("ann", "ann-S3", [("ann:D0:1", "me", "again")])
    with pytest.raises(ValueError, match="turn ids repeat"):
      bank.add_turns("ann", "ann-S3", [("t", "me", "a"), ("t", "me", "b")])
    with pytest.raises(ValueError, match="turn_ids must be a list"):
      bank.apply_reflection("ann", "ann-S3", [NewMemory("s", "ann:D0:1", _vec(0))], [], "enc-a")
    with pytest.raises(ValueError, match="embedding must be a non-empty vector of finite"):
      bank.apply_reflection("ann", "ann-S3", [NewMemory("s", ["ann:D0:1"], [np.nan])], [],
                            "enc-a")


def test_every_call_is_scoped_to_one_user(tmp_path):
  with MemoryBank(tmp_path / "bank.sqlite") as bank:
    for user in ("ann", "bob"):
      bank.add_user(user)
      _fill(bank, user)
    bob_memory = bank.memories("bob")[0].id
    bank.start_session("ann", "ann-S9", "2024-05-01")
    bank.add_turns("ann", "ann-S9", [("ann:D9:0", "me", "hello")])
    before = bank.export_user("ann"), bank.export_user("bob")
    # Another user's memory id is refused with the words used for an id nobody has.
    with pytest.raises(UnknownRecord) as theirs:
      bank.apply_reflection("ann", "ann-S9", [], [Merge(bob_memory, "mine", [], _vec(1))],
                            "enc-a")
    with pytest.raises(UnknownRecord) as nobodys:
      bank.apply_reflection("ann", "ann-S9", [], [Merge(99999, "mine", [], _vec(1))], "enc-a")
    assert str(theirs.value).replace(str(bob_memory), "N") == str(nobodys.value).replace(
        "99999", "N")
    assert "bob" not in str(theirs.value)
    with pytest.raises(UnknownRecord, match="user 'ann' has no turn 'bob:D0:0'"):
      bank.apply_reflection("ann", "ann-S9", [NewMemory("x", ["bob:D0:0"], _vec(1))], [],
                            "enc-a")
    with pytest.raises(UnknownRecord, match="has no memory"):
      bank.put_embeddings("ann", "enc-a", [bob_memory], _vec(1)[None])
    with pytest.raises(UnknownRecord, match="user 'ann' has no session 'bob-S0'"):
      bank.turns("ann", "bob-S0")
    with pytest.raises(UnknownRecord, match="has no user 'cy'"):
      bank.memories("cy")
    assert (bank.export_user("ann"), bank.export_user("bob")) == before
    assert all(t.turn_id.startswith("ann:") for t in bank.turns("ann"))
    assert all(m.summary.startswith("ann ") for m in bank.memories("ann"))
    assert all(s.turn_id.startswith("ann:") for m in bank.memories("ann") for s in m.snippets)


def test_a_failed_reflection_writes_nothing(tmp_path, monkeypatch):
  with MemoryBank(tmp_path / "bank.sqlite") as bank:
    bank.add_user("ann")
    first = _fill(bank, "ann", sessions=1)[0]
    bank.start_session("ann", "S1", "2024-05-01")
    bank.add_turns("ann", "S1", [("t0", "me", "one"), ("t1", "me", "two")])
    before = bank.export_user("ann")
    adds = [NewMemory("new", ["t0"], _vec(1))]
    with pytest.raises(UnknownRecord, match="no turn 'missing'"):
      bank.apply_reflection("ann", "S1", adds, [Merge(first, "m", ["missing"], _vec(2))], "enc-a")
    with pytest.raises(ValueError, match="sizes \\[8, 9\\]"):
      bank.apply_reflection("ann", "S1", adds, [Merge(first, "m", [], _vec(2, dim=9))], "enc-a")

    def fail():
      raise RuntimeError("stopped inside the transaction")

    monkeypatch.setattr(bank_module, "_inside_reflection", fail)
    with pytest.raises(RuntimeError, match="stopped inside"):
      bank.apply_reflection("ann", "S1", adds, [Merge(first, "m", ["t1"], _vec(2))], "enc-a")
    assert bank.export_user("ann") == before


_KILLED = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import numpy as np
    from rmmjax.memory import MemoryBank, Merge, NewMemory, bank as bank_module
    path, inside = sys.argv[1], Path(sys.argv[2])
    def hook():
      inside.touch()
      time.sleep(60)
    bank_module._inside_reflection = hook
    # Summaries large enough (about 4 MB in all) that the page cache spills: the transaction's
    # uncommitted pages are on disk, in the write-ahead log, when the process is killed.
    adds = [NewMemory(f"new {i} " + "lorem ipsum " * 10000, [f"ann:D1:{i}"],
                      np.full(8, i, np.float32)) for i in range(30)]
    with MemoryBank(path) as bank:
      first = bank.memories("ann")[0].id
      bank.apply_reflection("ann", "ann-S1", adds, [Merge(first, "merged", ["ann:D1:0"],
                            np.ones(8, np.float32))], "enc-a")
    """)


def test_sigkill_inside_a_reflection_leaves_the_bank_as_before(tmp_path):
  path = tmp_path / "bank.sqlite"
  with MemoryBank(path) as bank:
    bank.add_user("ann")
    _fill(bank, "ann", sessions=1)
    bank.start_session("ann", "ann-S1", "2024-06-01")
    bank.add_turns("ann", "ann-S1", [(f"ann:D1:{k}", "me", f"turn {k}") for k in range(30)])
    before = bank.export_user("ann")
  wal = Path(f"{path}-wal")
  wal_before = wal.stat().st_size if wal.exists() else 0
  inside = tmp_path / "inside"
  child = subprocess.Popen([sys.executable, "-c", _KILLED, str(path), str(inside)], cwd=ROOT,
                           stderr=subprocess.PIPE)
  deadline = time.monotonic() + 60
  while not inside.exists():
    assert child.poll() is None, child.stderr.read().decode()
    assert time.monotonic() < deadline, "the child never reached the hook"
    time.sleep(0.01)
  wal_inside = wal.stat().st_size
  child.send_signal(signal.SIGKILL)
  child.wait()
  assert child.returncode == -signal.SIGKILL
  assert wal_inside > wal_before + 1_000_000, "no uncommitted rows reached the disk"
  _integrity(path)
  with MemoryBank(path) as bank:
    assert bank.export_user("ann") == before
    assert not bank.sessions("ann")[1].ended
    # The bank takes the same reflection afterwards.
    ids = bank.apply_reflection("ann", "ann-S1", [NewMemory("new", ["ann:D1:1"], _vec(1))], [],
                                "enc-a")
    assert bank.memories("ann")[-1].id == ids[0] and bank.sessions("ann")[1].ended
  _integrity(path)


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import numpy as np
    from rmmjax.memory import MemoryBank, Merge, NewMemory
    path, user, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    (folder / f"ready-{user}").touch()
    while not (folder / "go").exists():
      time.sleep(0.002)
    with MemoryBank(path) as bank:  # the four open a file that does not exist yet
      bank.add_user(user)
      first = None
      for s in range(3):
        sid = f"S{s}"
        bank.start_session(user, sid, f"day {s}")
        for k in range(0, 100, 2):  # one transaction per two turns, interleaved with the others
          bank.add_turns(user, sid, [(f"D{s}:{j}", user, f"{user} said {s}.{j}")
                                     for j in (k, k + 1)])
          time.sleep(0.002)  # turns arrive over time; a writer in a tight loop starves the rest
        adds = [NewMemory(f"{user} topic {s}.{c}", [f"D{s}:{j}" for j in range(c, c + 10)],
                          np.full(4, s, np.float32)) for c in range(0, 100, 10)]
        merges = [] if first is None else [Merge(first, f"{user} topic 0.0 to {s}", [f"D{s}:0"],
                                                 np.ones(4, np.float32))]
        ids = bank.apply_reflection(user, sid, adds, merges, "enc")
        first = first or ids[0]
    """)


def test_four_processes_write_four_users_at_once(tmp_path):
  path, users = tmp_path / "bank.sqlite", ["u0", "u1", "u2", "u3"]
  procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), u, str(tmp_path)],
                            cwd=ROOT, stderr=subprocess.PIPE) for u in users]
  deadline = time.monotonic() + 60
  while not all((tmp_path / f"ready-{u}").exists() for u in users):
    assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
    time.sleep(0.01)
  (tmp_path / "go").touch()
  for p in procs:
    assert p.wait(timeout=120) == 0, p.stderr.read().decode()
  _integrity(path)
  with MemoryBank(path) as bank:
    assert bank.users() == users
    for u in users:
      want = [(f"D{s}:{j}", u, f"{u} said {s}.{j}") for s in range(3) for j in range(100)]
      assert [(t.turn_id, t.speaker, t.text) for t in bank.turns(u)] == want
      memories = bank.memories(u)
      assert len(memories) == 30 and all(m.summary.startswith(f"{u} topic") for m in memories)
      assert memories[0].summary == f"{u} topic 0.0 to 2"
      assert [s.turn_id for s in memories[0].snippets] == [f"D0:{j}" for j in range(10)] + [
          "D1:0", "D2:0"]
      assert all(s.text.startswith(f"{u} said") for m in memories for s in m.snippets)
      assert bank.memory_snapshot(u, "enc")[2].shape == (30, 4)
  with sqlite3.connect(path) as db:
    order = [r[0] for r in db.execute("SELECT user_id FROM turns ORDER BY rowid")]
  switches = sum(a != b for a, b in zip(order, order[1:], strict=False))
  assert switches >= 20, f"the writers did not interleave ({switches} switches)"


def _rows_mentioning(path: Path, needles: list[str]) -> list[tuple[str, str]]:
  """(table, needle) for every cell of every table that holds a needle."""
  found = []
  with sqlite3.connect(path) as db:
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    assert {"users", "sessions", "turns", "memories", "snippets", "embeddings"} <= set(tables)
    for table in tables:
      for row in db.execute(f'SELECT * FROM "{table}"'):
        for cell in row:
          text = cell.decode("latin-1") if isinstance(cell, bytes) else str(cell)
          found += [(table, n) for n in needles if n in text]
  return found


def test_delete_user_leaves_no_row_and_no_bytes(tmp_path):
  path = tmp_path / "bank.sqlite"
  with MemoryBank(path) as bank:
    for user in ("gone", "kept"):
      bank.add_user(user)
      _fill(bank, user)
    kept = bank.export_user("kept")
    needles = ["gone", "told story", "topic"]
    assert {t for t, _ in _rows_mentioning(path, needles)} >= {
        "users", "sessions", "turns", "memories", "snippets", "embeddings"}
    bank.delete_user("gone")
    assert bank.users() == ["kept"] and bank.export_user("kept") == kept
    with pytest.raises(UnknownRecord, match="has no user 'gone'"):
      bank.delete_user("gone")
  assert _rows_mentioning(path, ["gone"]) == []
  # secure_delete and the checkpoint: the deleted text is not left in free pages or the log.
  assert b"gone told story" not in _file_bytes(path)
  assert b"kept told story" in _file_bytes(path)
  _integrity(path)


def test_another_encoder_is_refused_until_re_embedded(tmp_path):
  with MemoryBank(tmp_path / "bank.sqlite") as bank:
    bank.add_user("ann")
    ids = _fill(bank, "ann")
    with pytest.raises(EncoderMismatch) as err:
      bank.memory_snapshot("ann", "enc-b")
    message = str(err.value)
    assert "'enc-a'" in message and "'enc-b'" in message and "must be re-embedded" in message
    bank.start_session("ann", "S9", "2024-07-01")
    bank.add_turns("ann", "S9", [("t", "me", "x")])
    with pytest.raises(EncoderMismatch, match="'enc-a'.*this reflection uses encoder 'enc-b'"):
      bank.apply_reflection("ann", "S9", [NewMemory("x", ["t"], _vec(1, 3))], [], "enc-b")
    bank.put_embeddings("ann", "enc-b", ids[:2], np.ones((2, 3), np.float32))
    with pytest.raises(EncoderMismatch, match=r"2 of the 4 memories of user 'ann' \(ids \[3, 4"):
      bank.memory_snapshot("ann", "enc-b")
    with pytest.raises(ValueError, match=r"sizes \[3, 5\]"):
      bank.put_embeddings("ann", "enc-b", ids[2:], np.ones((2, 5), np.float32))
    bank.put_embeddings("ann", "enc-b", ids[2:], np.ones((2, 3), np.float32))
    assert bank.memory_snapshot("ann", "enc-b")[2].shape == (4, 3)
    assert bank.memory_snapshot("ann", "enc-a")[2].shape == (4, 8)
    # A merge rewrites the summary: the other encoder's vector of it is stale and goes.
    bank.apply_reflection("ann", "S9", [], [Merge(ids[0], "new", ["t"], _vec(1, 3))], "enc-b")
    with pytest.raises(EncoderMismatch, match=r"1 of the 4 memories of user 'ann' \(ids \[1\]\)"):
      bank.memory_snapshot("ann", "enc-a")


def test_export_import_round_trips_exactly(tmp_path):
  with MemoryBank(tmp_path / "a.sqlite") as bank:
    bank.add_user("ann")
    _fill(bank, "ann", sessions=3)
    bank.put_embeddings("ann", "enc-b", [1, 2], np.full((2, 3), 0.1, np.float32))
    bank.start_session("ann", "open", "2024-08-01")  # a session not yet reflected
    bank.add_turns("ann", "open", [("o1", "me", "unicode: caf\u00e9 \U0001f600")])
    lace = LaceMem(HashEncoder())
    for i, text in enumerate(["Ann adopted a cat named Pixel.", "Ann and her cat moved to Oslo.",
                              "The cat Pixel likes Oslo."]):
      lace.add_turn(f"l{i}", "S1", "2024-07-01", "Ann", text)
    lace.save(bank, "ann")
    exported = bank.export_user("ann")
    assert len(exported["lace"]["facts"]) == len(lace.facts) and exported["lace"]["links"]
    # Export, delete, import: the user comes back whole, their LaceMem included.
    bank.delete_user("ann")
    bank.import_user(json.loads(json.dumps(exported)))
    back = LaceMem.load(bank, "ann", HashEncoder())
    assert back.facts == lace.facts and back.edges() == lace.edges()
    np.testing.assert_array_equal(back.fact_vectors(list(range(len(lace.facts)))),
                                  lace.fact_vectors(list(range(len(lace.facts)))))
    assert bank.export_user("ann") == exported
  data = json.loads(json.dumps(exported))
  for key in (None, generate_key()):
    with MemoryBank(tmp_path / f"b{key is None}.sqlite", key=key) as fresh:
      fresh.add_user("other")
      _fill(fresh, "other", sessions=1)  # memory ids differ from the first bank's
      assert fresh.import_user(data) == "ann"
      assert fresh.export_user("ann") == exported
      with pytest.raises(ValueError, match="already in"):
        fresh.import_user(data)
      fresh.import_user(data, user="ann2")
      assert fresh.export_user("ann2") == {**exported, "user": "ann2"}
  # A document of another version is refused naming it: nothing older is read.
  older = {**json.loads(json.dumps(exported)), "version": 2}
  with MemoryBank(tmp_path / "v2.sqlite") as fresh, pytest.raises(
      ValueError, match="import_user data was written in rmmjax's format "
      "'rmmjax-memory-bank-user' version 2; this rmmjax reads format 'rmmjax-memory-bank-user' "
      "version 3; give what export_user gives"):
    fresh.import_user(older)
  bare = json.loads(json.dumps(exported))
  for memory in bare["memories"]:
    memory["embeddings"] = []
  reopened = json.loads(json.dumps(exported))
  reopened["sessions"] += [{"session_id": f"chat-{n}", "date": "2024-09-01", "ended": False,
                            "origin": "chat", "turns": []} for n in (1, 2)]
  for doc, message in ((bare, r"memories\[0\] has no embedding"),
                       (reopened, r"chat sessions \['chat-1', 'chat-2'\] are all open")):
    with MemoryBank(tmp_path / "d.sqlite") as fresh, pytest.raises(ValueError, match=message):
      fresh.import_user(doc)
  broken = json.loads(json.dumps(exported))
  broken["lace"]["links"][0] = [0, 99, 0.5]
  with MemoryBank(tmp_path / "c.sqlite") as fresh, pytest.raises(
      ValueError, match=r"lace.links\[0\] is \[0, 99, 0.5\]; expected"):
    fresh.import_user(broken)
  broken = json.loads(json.dumps(exported))
  broken["memories"][0]["snippets"][0]["text"] = "edited"
  with MemoryBank(tmp_path / "c.sqlite") as fresh, pytest.raises(
      ValueError, match=r"memories\[0\]\.snippets\[0\]: turn 'ann:D0:0' is not among"):
    fresh.import_user(broken)


def test_encrypted_bank_holds_no_plaintext_and_needs_its_key(tmp_path):
  secret = "my bank PIN is 4417 and my sister is Zelda"
  for key in (None, generate_key()):
    path = tmp_path / f"{key is None}.sqlite"
    with MemoryBank(path, key=key) as bank:
      bank.add_user("ann")
      bank.start_session("ann", "S0", "2024-09-01")
      bank.add_turns("ann", "S0", [("t0", "Zelda's sister", secret)])
      bank.apply_reflection("ann", "S0", [NewMemory(f"summary: {secret}", ["t0"], _vec(0))], [],
                            "enc-a")
      assert Path(f"{path}-wal").stat().st_size > 0  # the rows are in the log, not yet moved
      found = [secret.encode(), b"Zelda", _vec(0).tobytes()]
      raw = _file_bytes(path)
      assert all((f in raw) == (key is None) for f in found), key
      assert bank.turns("ann")[0].text == secret
  key = generate_key()
  path = tmp_path / "False.sqlite"
  with pytest.raises(BankKeyError, match="is encrypted: open it with its key"):
    MemoryBank(path)
  with pytest.raises(BankKeyError, match="the key does not open"):
    MemoryBank(path, key=key)
  with pytest.raises(BankKeyError, match="is not encrypted, so a key is refused"):
    MemoryBank(tmp_path / "True.sqlite", key=key)
  with pytest.raises(BankKeyError, match="is not a Fernet key") as err:
    MemoryBank(tmp_path / "new.sqlite", key=b"hunter2-hunter2")
  assert b"hunter2" not in str(err.value).encode()
  assert key_from_env({"RMMJAX_BANK_KEY": key.decode() + "\n"}) == key
  assert key_from_env({}) is None


def test_files_that_are_not_a_bank_are_refused(tmp_path):
  text = tmp_path / "notes.txt"
  text.write_text("not a database " * 100)
  with pytest.raises(BankFileError, match="notes.txt cannot be opened.*not a memory bank"):
    MemoryBank(text)
  other = tmp_path / "other.sqlite"
  with sqlite3.connect(other) as db:
    db.execute("CREATE TABLE embeddings (model TEXT)")
  with pytest.raises(BankFileError, match=r"not a memory bank \(it has tables \['embeddings'\]"):
    MemoryBank(other)
  # A bank of another schema version, older or newer, is refused naming it: nothing migrates.
  versioned = tmp_path / "versioned.sqlite"
  MemoryBank(versioned).close()
  for version in (3, 99):
    with sqlite3.connect(versioned) as db:
      db.execute("UPDATE schema_version SET version = ?", (version,))
    with pytest.raises(BankFileError, match=f"written in rmmjax's schema version {version}; "
                       "this rmmjax reads schema version 4; open it with the rmmjax that"):
      MemoryBank(versioned)
  with pytest.raises(BankFileError, match="is a directory"):
    MemoryBank(tmp_path)
  bank = MemoryBank(tmp_path / "closed.sqlite")
  bank.close()
  with pytest.raises(BankFileError, match="is closed"):
    bank.users()
  assert os.path.exists(tmp_path / "closed.sqlite")


def test_turn_kinds_survive_export_and_import(tmp_path):
  with MemoryBank(tmp_path / "a.sqlite") as bank:
    bank.add_user("ann")
    bank.append_chat("ann", [("user", "where do I live", "question"),
                             ("assistant", "In Oslo.", "answer")], "2024-01-01")
    bank.append_chat("ann", [("user", "my cat is called Pixel", "statement")], "2024-01-01")
    with pytest.raises(ValueError, match="kind 'remark' is not one of"):
      bank.append_chat("ann", [("user", "hm", "remark")], "2024-01-01")
    exported = bank.export_user("ann")
  kinds = [t["kind"] for s in exported["sessions"] for t in s["turns"]]
  assert kinds == ["question", "answer", "statement"]
  with MemoryBank(tmp_path / "b.sqlite") as fresh:
    fresh.import_user(exported, user="now")
    assert [t.kind for t in fresh.turns("now")] == kinds


def test_a_search_index_is_read_from_one_snapshot(tmp_path, monkeypatch):
  from rmmjax.memory.search import BankSearch
  with MemoryBank(tmp_path / "a.sqlite") as bank:
    bank.add_user("ann")
    _fill(bank, "ann")
    expected = [m.id for m in bank.memories("ann")]
    # The version lookup says whether a kept index is current; the index itself is one read.
    for name in ("memories",):
      monkeypatch.setattr(bank, name, lambda *a, name=name: pytest.fail(f"{name} read apart"))
    index = BankSearch(bank, "enc-a", "hybrid").index("ann")
    assert [m.id for m in index.memories] == expected
    assert index.emb_NxD.shape == (len(expected), 8)
