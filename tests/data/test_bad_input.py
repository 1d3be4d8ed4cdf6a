"""Bad input: every malformed file, field or cache fails with a message naming the file, the
record, the field, the value and what was expected; the few accepted departures are counted."""

from __future__ import annotations

import gzip
import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rmmjax.data.locomo import load_locomo
from rmmjax.data.longmemeval import load_longmemeval
from rmmjax.data.msc import load_msc
from rmmjax.data.schema import MalformedData

ROOT = os.geteuid() == 0  # permissions do not stop root: those cases are simulated instead


def _locomo() -> dict:
  return {"sample_id": "x", "conversation": {
      "speaker_a": "A", "speaker_b": "B", "session_1_date_time": "1:56 pm on 8 May, 2023",
      "session_1": [{"speaker": "A", "dia_id": "D1:1", "text": "Hi!"},
                    {"speaker": "B", "dia_id": "D1:2", "text": "I painted a lake in May.",
                     "blip_caption": "a photo of a lake"}]},
      "qa": [{"question": "When did B paint?", "answer": "May", "evidence": ["D1:2"],
              "category": 2}]}


def _msc() -> dict:
  return {"personas": [["I paint."], ["I swim."]], "metadata": {"initial_data_id": "valid_0"},
          "previous_dialogs": [{"dialog": [{"text": "Hi"}, {"text": "Hello"}],
                                "time_back": " 3 hours ago"}],
          "dialog": [{"id": "Speaker 1", "text": "Back again"},
                     {"id": "Speaker 2", "text": "Welcome"}]}


def _longmemeval() -> dict:
  return {"question_id": "q1", "question_type": "single-session-user",
          "question": "Where did I buy my bike?", "answer": "at the flea market",
          "haystack_session_ids": ["s1"], "haystack_dates": ["2023/05/20 (Sat) 17:30"],
          "haystack_sessions": [[{"role": "user", "content": "I bought a bike at the market.",
                                  "has_answer": True},
                                 {"role": "assistant", "content": "Nice find!"}]],
          "answer_session_ids": ["s1"]}


def _write(path: Path, records: list[dict], lines: bool = False) -> Path:
  path.write_text("\n".join(json.dumps(r) for r in records) if lines else json.dumps(records))
  return path


def _refused(load, path: Path, pattern: str) -> str:
  """The message of the MalformedData load(path) raises: it starts with the file's name."""
  with pytest.raises(MalformedData) as err:
    load(path)
  message = str(err.value)
  assert message.startswith(str(path)), message
  assert re.search(pattern, message), message
  return message


# --- LoCoMo fields --------------------------------------------------------------------------


def _qa(**fields):
  return lambda r: r["qa"][0].update(fields)


def _turn(**fields):
  return lambda r: r["conversation"]["session_1"][0].update(fields)


def _chat(**fields):
  return lambda r: r["conversation"].update(fields)


LOCOMO_REFUSED = [
    (_qa(evidence=42), r"qa\[0\]: field 'evidence' is a number \(42\); expected a list of turn"),
    (_qa(evidence={"id": "D1:2"}), r"field 'evidence' is an object \(keys id\); expected"),
    (_qa(evidence=["D1:2", 3]), r"qa\[0\]: evidence\[1\] is a number \(3\); expected a turn id"),
    (_qa(evidence=[None]), r"evidence\[0\] is null; expected a turn id string"),
    (_qa(category="Temporal"), r"field 'category' is a string \(\"Temporal\"\); expected a "
                               r"category number 1..5 .*multi-hop, temporal, open-domain, "
                               r"single-hop, adversarial"),
    (_qa(category=7), r"field 'category' is a number \(7\); expected a category number 1..5"),
    (_qa(category="7"), r"field 'category' is a string \(\"7\"\); expected"),
    (_qa(category=True), r"field 'category' is a boolean \(true\); expected"),
    (_qa(category=2.0), r"field 'category' is a number \(2.0\); expected"),
    (_qa(question=5), r"qa\[0\]: field 'question' is a number \(5\); expected a string"),
    (_qa(answer=["May"]), r"field 'answer' is a list \(1 item: \[\"May\"\]\); expected a "
                          r"string or a number"),
    (lambda r: r.update(qa={}), r"\(x\): field 'qa' is an object \(\{\}\); expected a "
                                r"list of questions"),
    (lambda r: r.update(qa="none"), r"field 'qa' is a string \(\"none\"\); expected a list"),
    (lambda r: r.update(qa=["When?"]), r"qa\[0\]: the question is a string \(\"When\?\"\); "
                                       r"expected an object"),
    (lambda r: r.update(sample_id=26), r"record 1: field 'sample_id' is a number \(26\); "
                                       r"expected a string"),
    (lambda r: r.update(conversation="Hi"), r"\(x\): field 'conversation' is a "
                                            r"string \(\"Hi\"\); expected an object"),
    (lambda r: r.update(conversation=[]), r"field 'conversation' is a list"),
    (_chat(session_1="Hi"), r"\(x\), conversation: field 'session_1' is a string "
                            r"\(\"Hi\"\); expected a list of turns"),
    (_chat(session_2={"speaker": "A"}), r"field 'session_2' is an object"),
    (_chat(session_1=["Hi"]), r"session_1\[0\]: the turn is a string \(\"Hi\"\); expected an "
                              r"object with speaker, dia_id and text"),
    (_chat(session_1_date_time=20230508), r"field 'session_1_date_time' is a number "
                                          r"\(20230508\); expected a string"),
    (_turn(speaker=7), r"session_1\[0\]: field 'speaker' is a number \(7\); expected a string"),
    (_turn(text=42), r"session_1\[0\]: field 'text' is a number \(42\); expected a string"),
    (_turn(dia_id=1), r"session_1\[0\]: field 'dia_id' is a number \(1\)"),
    (_turn(blip_caption=["a lake"]), r"field 'blip_caption' is a list"),
]


@pytest.mark.parametrize("mutate, pattern", LOCOMO_REFUSED)
def test_locomo_refuses_fields_of_the_wrong_type(tmp_path, mutate, pattern):
  record = _locomo()
  mutate(record)
  message = _refused(load_locomo, _write(tmp_path / "bad.json", [_locomo(), record]), pattern)
  assert re.match(rf"{re.escape(str(tmp_path / 'bad.json'))}: record 1( \(x\))?[:,]", message)


def test_locomo_reads_evidence_given_as_a_string_and_counts_it(tmp_path):
  records = [_locomo() for _ in range(3)]
  records[0]["qa"][0]["evidence"] = "D1:2"
  records[1]["qa"][0]["evidence"] = "D1:1; D1:2"
  conversations, report = load_locomo(_write(tmp_path / "c.json", records))
  assert [c.questions[0].evidence for c in conversations] == [("D1:2",), ("D1:1", "D1:2"),
                                                               ("D1:2",)]
  assert report.counts == {"evidence given as a string, not a list (read as a list of it)": 2,
                           "several evidence ids in one string (split)": 1}


def test_locomo_reads_category_names_and_digit_strings_and_counts_them(tmp_path):
  records = [_locomo() for _ in range(4)]
  for record, category in zip(records, ("temporal", "2", "adversarial", 4), strict=True):
    record["qa"][0]["category"] = category
  conversations, report = load_locomo(_write(tmp_path / "c.json", records))
  assert [c.questions[0].category for c in conversations] == ["temporal", "temporal",
                                                              "adversarial", "single-hop"]
  assert report.counts == {"category given as a name (kept)": 2,
                           "category given as a digit string (read as its number)": 1}


def test_values_keep_the_json_type_the_file_gives_them(tmp_path):
  """A digit string beside numeric categories is still seen (and counted), an ISO date stays a
  string and an integer answer beside a fractional one stays an integer."""
  records = [_locomo() for _ in range(3)]
  records[1]["qa"][0]["category"] = "2"
  for record, answer in zip(records, (2, "May", 2.5), strict=True):
    record["conversation"]["session_1_date_time"] = "2023-05-08"
    record["qa"][0]["answer"] = answer
  conversations, report = load_locomo(_write(tmp_path / "c.json", records))
  assert report.counts == {"category given as a digit string (read as its number)": 1}
  assert [c.sessions[0].date for c in conversations] == ["2023-05-08"] * 3
  assert [c.questions[0].answer for c in conversations] == ["2", "May", "2.5"]


def test_locomo_keeps_what_the_release_has(tmp_path):
  """Numeric answers, a null caption or session (as absent), a date key without a session."""
  record = _locomo()
  record["qa"][0]["answer"] = 3
  record["qa"].append({"question": "Q?", "adversarial_answer": "none", "evidence": ["D1:1"],
                       "category": 5})
  record["conversation"]["session_1"][0]["blip_caption"] = None
  record["conversation"].update(session_2=None, session_3_date_time="2 pm on 9 May, 2023")
  (conv,), report = load_locomo(_write(tmp_path / "c.json", [record]))
  assert [q.answer for q in conv.questions] == ["3", "none"]
  assert len(conv.sessions) == 1 and conv.sessions[0].turns[0].caption == ""
  assert not report.counts


# --- MSC and LongMemEval fields -------------------------------------------------------------


MSC_REFUSED = [
    (lambda e: e.update(dialog="Hi"), r"record 1 \(valid_0\): field 'dialog' is a string"),
    (lambda e: e.update(dialog=["Hi"]), r"session 2, turn 0: the turn is a string"),
    (lambda e: e["dialog"][0].update(text=5), r"session 2, turn 0: field 'text' is a number"),
    (lambda e: e["dialog"][0].update(id=["Speaker 1"]), r"turn 0: field 'id' is a list"),
    (lambda e: e.update(metadata="valid_0"), r"record 1: field 'metadata' is a string"),
    (lambda e: e["metadata"].update(initial_data_id=0), r"record 1, metadata: field "
                                                        r"'initial_data_id' is a number \(0\)"),
    (lambda e: e.update(previous_dialogs={}), r"field 'previous_dialogs' is an object"),
    (lambda e: e.update(previous_dialogs=["Hi"]), r"session 1: previous_dialogs entry is a "
                                                  r"string"),
    (lambda e: e["previous_dialogs"][0].update(dialog={}), r"session 1: field 'dialog' is an "
                                                           r"object"),
    (lambda e: e["previous_dialogs"][0].update(time_back=3), r"field 'time_back' is a number"),
    (lambda e: e.update(personas="I paint."), r"field 'personas' is a string \(\"I paint.\"\); "
                                              r"expected a list of lists of facts"),
    (lambda e: e.update(personas=["I paint.", "I swim."]), r"personas\[0\] is a string"),
    (lambda e: e.update(personas=[[1], []]), r"personas\[0\]\[0\] is a number \(1\)"),
]


@pytest.mark.parametrize("mutate, pattern", MSC_REFUSED)
def test_msc_refuses_fields_of_the_wrong_type(tmp_path, mutate, pattern):
  episode = _msc()
  mutate(episode)
  _refused(load_msc, _write(tmp_path / "valid.txt", [_msc(), episode], lines=True), pattern)


def test_msc_reads_a_numeric_speaker_id_as_the_release_does(tmp_path):
  episode = _msc()
  episode["dialog"][1]["id"] = 7
  (conv,), report = load_msc(_write(tmp_path / "valid.txt", [episode], lines=True))
  assert [t.speaker for t in conv.sessions[1].turns] == ["Speaker 1", "Speaker 2"]
  assert conv.personas == (("I paint.",), ("I swim.",))
  assert report.counts == {"speaker id not Speaker 1/2 (alternation used)": 1}


def _session(**fields):
  return lambda r: r["haystack_sessions"][0][0].update(fields)


LONGMEMEVAL_REFUSED = [
    (lambda r: r.update(haystack_sessions="abc"), r"record 1 \(q1\): field 'haystack_sessions' "
                                                  r"is a string \(\"abc\"\); expected a list"),
    (lambda r: r.update(haystack_session_ids="s"), r"field 'haystack_session_ids' is a string"),
    (lambda r: r.update(haystack_session_ids=[1]), r"haystack_session_ids\[0\] is a number"),
    (lambda r: r.update(haystack_dates=[20230520]), r"haystack_dates\[0\] is a number"),
    (lambda r: r.update(haystack_sessions=["hi"]), r"session s1: the session is a string"),
    (lambda r: r.update(haystack_sessions=[["hi"]]), r"session s1, turn 0: the turn is a "
                                                     r"string"),
    (_session(has_answer="yes"), r"turn 0: field 'has_answer' is a string \(\"yes\"\); "
                                 r"expected true or false"),
    (_session(content=12), r"turn 0: field 'content' is a number \(12\); expected a string"),
    (_session(role=None), r"turn 0: missing field 'role'"),
    (lambda r: r.update(answer_session_ids="s1"), r"field 'answer_session_ids' is a string"),
    (lambda r: r.update(question=["Where?"]), r"field 'question' is a list"),
    (lambda r: r.update(question_id=1), r"record 1: field 'question_id' is a number \(1\)"),
]


@pytest.mark.parametrize("mutate, pattern", LONGMEMEVAL_REFUSED)
def test_longmemeval_refuses_fields_of_the_wrong_type(tmp_path, mutate, pattern):
  record = _longmemeval()
  mutate(record)
  _refused(load_longmemeval, _write(tmp_path / "lme.json", [_longmemeval(), record]), pattern)


# --- Files ----------------------------------------------------------------------------------

LOADERS = [(load_locomo, "conversations", "a LoCoMo JSON file", _locomo, False),
           (load_msc, "episodes", "an MSC JSON Lines file", _msc, True),
           (load_longmemeval, "instances", "a LongMemEval JSON file", _longmemeval, False)]
IDS = ["locomo", "msc", "longmemeval"]


@pytest.mark.parametrize("load, noun, expected, _record, _lines", LOADERS, ids=IDS)
def test_empty_and_blank_files(tmp_path, capfd, load, noun, expected, _record, _lines):
  path = tmp_path / "data.json"
  for text in ("[]", "[ \n ]\n"):
    path.write_text(text)
    _refused(load, path, rf": no {noun} \(an empty list\); expected {expected}")
  path.write_text("")
  _refused(load, path, rf": an empty file; expected {expected}")
  path.write_text("  \n\n\t\n")
  _refused(load, path, rf": only whitespace \(6 characters\); expected {expected}")
  assert not capfd.readouterr().err  # the message says it all: nothing else is printed


@pytest.mark.parametrize("load, noun, expected, _record, _lines", LOADERS, ids=IDS)
def test_paths_that_are_not_readable_data_files(tmp_path, monkeypatch, load, noun, expected,
                                                _record, _lines):
  (tmp_path / "locomo10.json").write_text("[]")
  _refused(load, tmp_path, rf" is a directory, not a file; it holds locomo10.json; expected "
                           rf"{expected}")
  with pytest.raises(FileNotFoundError, match=rf"missing.json does not exist; expected "
                                              rf"{expected}"):
    load(tmp_path / "missing.json")
  with pytest.raises(FileNotFoundError, match=r"nowhere/missing.json does not exist \(nor does "
                                              r"its folder"):
    load(tmp_path / "nowhere" / "missing.json")
  locked = tmp_path / "locked.json"
  locked.write_text("[]")
  real_open = Path.open

  def deny(self, *args, **kwargs):
    if self == locked:
      raise PermissionError(13, "Permission denied", str(self))
    return real_open(self, *args, **kwargs)

  monkeypatch.setattr(Path, "open", deny)
  _refused(load, locked, rf" cannot be read \(permission denied\); expected {expected}")


@pytest.mark.skipif(ROOT, reason="file permissions do not apply to root")
def test_an_unreadable_file_is_named_as_such(tmp_path):
  path = _write(tmp_path / "c.json", [_locomo()])
  path.chmod(0)
  _refused(load_locomo, path, r" cannot be read \(permission denied\)")


@pytest.mark.parametrize("load, noun, expected, record, lines", LOADERS, ids=IDS)
def test_files_that_are_not_json_records(tmp_path, capfd, load, noun, expected, record, lines):
  path = tmp_path / "data.json"
  path.write_bytes(gzip.compress(b"[]"))
  _refused(load, path, rf": not UTF-8 text \(byte 0x8b at offset 1; a compressed file must be "
                       rf"unpacked first\); expected {expected}")
  path.write_text("hello")
  _refused(load, path, r": not JSON records: the file starts with 'hello', not '\[' \(a JSON "
                       r"list\) or '\{' \(JSON Lines\)")
  path.write_text("[1, 2]")
  _refused(load, path, rf": record 0 is a number \(1\), not an object; expected {expected}")
  path.write_text('["a"]')
  _refused(load, path, r": record 0 is a string \(\"a\"\), not an object")
  good = json.dumps(record())
  path.write_text(f"[{good}, 5]")
  _refused(load, path, r": record 1 is a number \(5\), not an object")
  path.write_text(f"[{good}, null]")
  _refused(load, path, r": record 1 is null, not an object")
  path.write_text(f"[{good}, {{}}]")
  _refused(load, path, r": record 1: missing field '\w+'")
  path.write_text(f"[{good},]")
  _refused(load, path, r": not JSON \(.* at line 1, column \d+\); expected")
  path.write_text(f"{good}\n[1]\n")
  _refused(load, path, r": record 1 \(line 2\) is a list \(1 item: \[1\]\), not an object")
  path.write_text(f"{good}\n\n{good[:-1]}\n")
  _refused(load, path, r": record 1 \(line 3\) is not JSON \(.* at line \d+, "
                       r"column \d+\); expected")
  path.write_text('[{"cut short')  # json's own message ends in "at": said once, not twice
  _refused(load, path, r": not JSON \(Unterminated string starting at line 1, column 3\)")
  assert not capfd.readouterr().err


@pytest.mark.parametrize("load, noun, expected, record, lines", LOADERS, ids=IDS)
def test_a_list_indented_far_is_read_as_written(tmp_path, load, noun, expected, record, lines):
  path = tmp_path / "data.json"
  path.write_text("[" + " " * 200 + json.dumps(record()) + "]")
  conversations, _ = load(path)
  assert len(conversations) == 1 and conversations[0].sessions


# --- The embedding cache ---------------------------------------------------------------------


def test_a_corrupt_cache_file_names_the_file_and_the_remedy(tmp_path):
  from rmmjax.encode.cache import CacheError, EmbeddingCache
  path = tmp_path / "embeddings.sqlite"
  path.write_bytes(b"this is not an SQLite database" * 100)
  with pytest.raises(CacheError, match=rf"embedding cache {re.escape(str(path))} cannot be "
                                       r"opened \(sqlite: file is not a database\): .*if it is the "
                                       r"cache, delete it \(it is only a cache.*RMMJAX_CACHE"):
    EmbeddingCache(path)
  assert issubclass(CacheError, ValueError)  # the command line reports it without a traceback


def test_corruption_that_shows_on_first_read_or_write(tmp_path):
  from rmmjax.encode.cache import CacheError, EmbeddingCache
  path = tmp_path / "embeddings.sqlite"
  cache = EmbeddingCache(path)
  texts = [f"text {i}" for i in range(2000)]
  cache.put("m", texts, np.ones((2000, 32), np.float32))
  cache.close()
  data = bytearray(path.read_bytes())
  page = 4096
  data[page:] = b"\xa5" * (len(data) - page)  # every page but the header and schema
  path.write_bytes(bytes(data))
  cache = EmbeddingCache(path)  # the header and schema still read
  with pytest.raises(CacheError, match=r"cannot be read \(sqlite: .*malformed.*\): the file is "
                                       r"corrupt .*delete it"):
    cache.get("m", texts[:3], 32)
  with pytest.raises(CacheError, match=r"cannot be written \(sqlite: .*\): .*delete it"):
    cache.put("m", texts[:3], np.zeros((3, 32), np.float32))
  cache.close()


def test_a_cache_path_that_cannot_be_created(tmp_path, monkeypatch):
  from rmmjax.encode.cache import CacheError, EmbeddingCache
  blocker = tmp_path / "cache"
  blocker.write_text("a file where the cache folder should be")
  with pytest.raises(CacheError, match=rf"its folder {re.escape(str(blocker))}/rmmjax cannot "
                                       rf"be created \({re.escape(str(blocker))} is a file, not "
                                       r"a folder\); set RMMJAX_CACHE to another folder"):
    EmbeddingCache(blocker / "rmmjax" / "embeddings.sqlite")
  with pytest.raises(CacheError, match=r"is a directory; expected an SQLite file"):
    EmbeddingCache(tmp_path)

  def read_only(self, *args, **kwargs):
    raise PermissionError(13, "Permission denied", str(self))

  monkeypatch.setattr(Path, "mkdir", read_only)
  with pytest.raises(CacheError, match=r"cannot be created \(Permission denied\)"):
    EmbeddingCache(tmp_path / "new" / "embeddings.sqlite")


@pytest.mark.skipif(ROOT, reason="file permissions do not apply to root")
def test_a_cache_in_a_read_only_folder(tmp_path):
  from rmmjax.encode.cache import CacheError, EmbeddingCache
  folder = tmp_path / "ro"
  folder.mkdir()
  folder.chmod(0o555)
  try:
    with pytest.raises(CacheError, match=r"cannot be opened .*writable"):
      EmbeddingCache(folder / "embeddings.sqlite")
  finally:
    folder.chmod(0o755)


_WRITER = """
    import sys, numpy as np
    from rmmjax.encode.cache import EmbeddingCache
    cache = EmbeddingCache(sys.argv[1])
    for i in range(150):
      texts = [f"{sys.argv[2]} {i} {j}" for j in range(20)]
      cache.put("m", texts, np.full((20, 8), i, np.float32))
      assert all(v is not None for v in cache.get("m", texts, 8))
    print("done")
"""


def test_two_processes_write_the_cache_at_once(tmp_path):
  path = tmp_path / "embeddings.sqlite"
  procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WRITER), str(path), tag],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for tag in ("a", "b")]
  for proc in procs:
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0 and out.strip() == "done", err[-2000:]
  with sqlite3.connect(path) as db:
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)  # readers never wait
    assert db.execute("SELECT COUNT(*) FROM embeddings").fetchone() == (2 * 150 * 20,)


_LOCK_HOLDER = """
    import sqlite3, sys, time
    db = sqlite3.connect(sys.argv[1], isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    time.sleep(6)  # longer than sqlite3's default 5 s wait
    db.execute("COMMIT")
"""


def test_a_write_waits_for_another_process_holding_the_lock(tmp_path):
  from rmmjax.encode.cache import EmbeddingCache
  path = tmp_path / "embeddings.sqlite"
  EmbeddingCache(path).close()
  holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_LOCK_HOLDER), str(path)],
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    cache = EmbeddingCache(path)
    cache.put("m", ["waited"], np.ones((1, 4), np.float32))
    assert cache.get("m", ["waited"], 4)[0] is not None
    cache.close()
  finally:
    holder.wait(timeout=60)
  assert holder.returncode == 0



def test_the_cache_variable_names_a_folder_or_a_file():
  from rmmjax.encode.cache import cache_path, per_host
  home = Path.home() / ".cache" / "rmmjax" / "embeddings.sqlite"
  assert cache_path({}) == cache_path({"RMMJAX_CACHE": " "}) == home
  assert cache_path({"RMMJAX_CACHE": "/data/cache"}) == Path("/data/cache/embeddings.sqlite")
  # A file name is the file (it used to become a folder of that name).
  for name in ("/data/e.sqlite", "/data/e.db", "/data/e.sqlite3"):
    assert cache_path({"RMMJAX_CACHE": name}) == Path(name)
  assert per_host(Path("/nfs/e.sqlite"), "node 7/a") == Path("/nfs/e-node_7_a.sqlite")
