"""The memory commands as a user types them: what an encrypted bank leaves on disk (no
plaintext vector of its user in the embedding cache), what deleting a user removes, the
export/import/delete commands, and the refusals that used to pass silently."""

from __future__ import annotations

import json
import sqlite3

import pytest

from rmmjax import cli
from rmmjax.encode.cache import text_key
from rmmjax.memory import KEY_ENV, MemoryBank, generate_key

pytestmark = pytest.mark.slow  # each command loads the sentence encoder


def _locomo(tmp_path, user_turns: dict[str, list[str]]) -> str:
  """A LoCoMo-format file: one conversation per entry, two sessions of the given turns."""
  records = []
  for conv_id, texts in user_turns.items():
    half = len(texts) // 2
    chat = {"speaker_a": "Ann", "speaker_b": "Bob"}
    for n, part in ((1, texts[:half]), (2, texts[half:])):
      chat[f"session_{n}_date_time"] = f"{n} May 2023"
      chat[f"session_{n}"] = [{"speaker": ("Ann", "Bob")[i % 2], "dia_id": f"D{n}:{i + 1}",
                               "text": t} for i, t in enumerate(part)]
    records.append({"sample_id": conv_id, "conversation": chat,
                    "qa": [{"question": "What is the cat called?", "answer": "Pixel",
                            "evidence": ["D1:1"], "category": 4}]})
  path = tmp_path / "data.json"
  path.write_text(json.dumps(records))
  return str(path)


SECRET = ["My cat is called Pixel and my PIN is 4417.", "Pixel sleeps on the sofa all day.",
          "I run in the park on Sundays.", "The park run starts at nine."]
OTHER = ["Bob repairs old motorcycles.", "He moved to Oslo last winter.",
         "Oslo is cold in January.", "His garage is near the harbour."]


@pytest.fixture
def cache(tmp_path, monkeypatch):
  path = tmp_path / "cache" / "embeddings.sqlite"
  monkeypatch.setenv("RMMJAX_CACHE", str(path))  # a file name: the cache file itself
  monkeypatch.delenv(KEY_ENV, raising=False)
  return path


def _cached_keys(path) -> set[bytes]:
  if not path.exists():
    return set()
  with sqlite3.connect(path) as db:
    return {bytes(k) for (k,) in db.execute("SELECT key FROM embeddings")}


def _run(capsys, *argv) -> tuple[int, str, str]:
  code = cli.main([str(a) for a in argv])
  out, err = capsys.readouterr()
  return code, out, err


def test_an_encrypted_bank_writes_no_vector_to_the_cache(tmp_path, cache, capsys, monkeypatch):
  monkeypatch.setenv(KEY_ENV, generate_key().decode())
  data, db = _locomo(tmp_path, {"ann": SECRET}), tmp_path / "bank.sqlite"
  assert _run(capsys, "ingest", "--data", data, "--db", db, "--user", "ann", "--quiet")[0] == 0
  assert _run(capsys, "recall", "--db", db, "--user", "ann", "where is Pixel?")[0] == 0
  monkeypatch.setattr("sys.stdin", iter(["what is my PIN?\n", "/end\n"]))
  assert _run(capsys, "chat", "--db", db, "--user", "ann")[0] == 0
  assert _cached_keys(cache) == set()  # no row at all: not the turns, summaries or queries
  raw = b"".join(p.read_bytes() for p in tmp_path.glob("bank.sqlite*"))
  assert raw and b"Pixel" not in raw and b"4417" not in raw


def test_deleting_a_user_removes_their_texts_from_the_cache(tmp_path, cache, capsys):
  data, db = _locomo(tmp_path, {"ann": SECRET, "bob": OTHER}), tmp_path / "bank.sqlite"
  code, _, err = _run(capsys, "ingest", "--data", data, "--db", db, "--user-per-conversation",
                      "--quiet")
  assert code == 0, err
  with MemoryBank(db) as bank:
    texts = {u: [t.text for t in bank.turns(u)] + [m.summary for m in bank.memories(u)]
             for u in ("ann", "bob")}
  keys = {u: {text_key(t) for t in texts[u]} for u in texts}
  dated = {text_key(f"[1 May 2023] Ann: {SECRET[0]}")}  # the form reflection embeds a turn in
  assert (keys["ann"] & _cached_keys(cache)) and dated <= _cached_keys(cache)
  code, out, _ = _run(capsys, "memory", "delete", "--db", db, "--user", "ann")
  assert code == 0 and "removed" in out
  left = _cached_keys(cache)
  assert not (keys["ann"] | dated) & left and keys["bob"] & left  # bob's rows stay


def test_export_delete_import_through_the_command_line(tmp_path, cache, capsys):
  data, db = _locomo(tmp_path, {"ann": SECRET}), tmp_path / "bank.sqlite"
  assert _run(capsys, "ingest", "--data", data, "--db", db, "--user", "ann", "--quiet")[0] == 0
  out_file = tmp_path / "ann.json"
  code, out, _ = _run(capsys, "memory", "export", "--db", db, "--user", "ann", "--out", out_file)
  assert code == 0 and "2 sessions, 4 turns" in out
  exported = json.loads(out_file.read_text())
  assert _run(capsys, "memory", "delete", "--db", db, "--user", "ann")[0] == 0
  code, out, _ = _run(capsys, "memory", "list", "--db", db)
  assert code == 0 and out == ""
  code, out, _ = _run(capsys, "memory", "import", "--db", db, "--in", out_file)
  assert code == 0 and "as user 'ann'" in out
  with MemoryBank(db) as bank:
    assert bank.export_user("ann") == exported
  empty = tmp_path / "empty.sqlite"
  empty.write_bytes(b"")
  code, _, err = _run(capsys, "memory", "list", "--db", empty)
  assert code == 2 and "is an empty file" in err and empty.stat().st_size == 0
  bad = tmp_path / "bad.json"
  bad.write_text("{not json")
  code, _, err = _run(capsys, "memory", "import", "--db", db, "--in", bad)
  assert code == 2 and "is not JSON" in err
  # A failed import into a new bank leaves no (empty) bank behind.
  wrong = tmp_path / "wrong.json"
  wrong.write_text(json.dumps({**exported, "version": 99}))
  new = tmp_path / "new.sqlite"
  code, _, err = _run(capsys, "memory", "import", "--db", new, "--in", wrong)
  assert code == 2 and "version 99" in err
  assert not list(tmp_path.glob("new.sqlite*"))


def test_refusals_that_used_to_pass(tmp_path, cache, capsys, monkeypatch):
  data, db = _locomo(tmp_path, {"ann": SECRET, "ann2": SECRET}), tmp_path / "bank.sqlite"
  # One user cannot hold two conversations with the same ids: said in flags, no file left.
  code, _, err = _run(capsys, "ingest", "--data", data, "--db", db, "--user", "ann", "--quiet")
  assert code == 2 and "--user-per-conversation" in err and "user_per_conversation" not in err
  assert not db.exists()
  assert _run(capsys, "ingest", "--data", data, "--db", db, "--user-per-conversation",
              "--quiet")[0] == 0
  # A mistyped user is not created.
  monkeypatch.setattr("sys.stdin", iter(["hello\n"]))
  code, _, err = _run(capsys, "chat", "--db", db, "--user", "anne")
  assert code == 2 and "'anne' is not in" in err and "--new-user" in err
  with MemoryBank(db) as bank:
    assert bank.users() == ["ann", "ann2"]
  # /end with no open session says so and keeps serving.
  monkeypatch.setattr("sys.stdin", iter(["/end\n", "where is Pixel?\n"]))
  code, out, _ = _run(capsys, "chat", "--db", db, "--user", "ann")
  assert code == 0 and "/end: user 'ann' has no open chat session" in out and "[1]" in out
  for flags, message in ((["--candidates", "0"], "--candidates 0: expected a positive"),
                         (["--k", "30"], "(--k 30) but only --candidates 20")):
    code, _, err = _run(capsys, "recall", "--db", db, "--user", "ann", *flags, "Pixel")
    assert code == 2 and message in err, err
