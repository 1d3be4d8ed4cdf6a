"""MSC on the real valid split, and LongMemEval on a tiny file in its documented schema."""

import json

import pytest

from rmmjax.cli import main
from rmmjax.data.locomo import load_locomo
from rmmjax.data.longmemeval import load_longmemeval
from rmmjax.data.msc import load_msc
from rmmjax.data.schema import MalformedData


def test_locomo_dev_file_passes_the_type_checks_with_exactly_its_known_repairs(locomo_path):
  conversations, report = load_locomo(locomo_path)
  assert len(conversations) == 8 and sum(len(c.questions) for c in conversations) == 1584
  assert report.counts == {"question without valid evidence (skipped)": 2,
                           "several evidence ids in one string (split)": 1,
                           "evidence id names no turn (dropped)": 2,
                           "evidence string without an id (dropped)": 1,
                           "evidence id normalised": 1}
  answers = {q.answer for c in conversations for q in c.questions}
  assert "2022" in answers  # integer answers in the release are kept, as text


def test_msc_valid_split_loads_with_its_documented_counts(msc_path):
  episodes, report = load_msc(msc_path)
  assert len(episodes) == 500
  per_session = [sum(len(e.sessions[i].turns) for e in episodes) for i in range(3)]
  assert per_session == [7768, 5897, 5890]
  assert report.counts == {"speaker id not Speaker 1/2 (alternation used)": 53}
  first = episodes[0]
  assert first.conversation_id == "valid_0" and len(first.personas) == 2
  assert [t.speaker for t in first.sessions[0].turns[:3]] == ["Speaker 1", "Speaker 2",
                                                              "Speaker 1"]
  assert first.sessions[0].date.endswith("ago") and first.sessions[2].date == "now"
  assert all(not e.questions for e in episodes)


def test_msc_cannot_be_evaluated_for_retrieval(msc_path, capsys):
  try:
    code = main(["eval", "--dataset", "msc", "--data", str(msc_path)])
  except SystemExit as refused:  # the argument parser offers only datasets with evidence labels
    code = refused.code
  assert code == 2
  err = capsys.readouterr().err
  assert "no question with evidence labels" in err or "invalid choice: 'msc'" in err


def _instance(qid, has_answer=True, answer_sessions=("s2",)):
  return {
      "question_id": qid, "question_type": "single-session-user",
      "question": "Where did I buy my bike?", "answer": "at the flea market",
      "question_date": "2023/05/30 (Tue) 10:00",
      "haystack_session_ids": ["s1", "s2"],
      "haystack_dates": ["2023/05/01 (Mon) 09:00", "2023/05/20 (Sat) 17:30"],
      "haystack_sessions": [
          [{"role": "user", "content": "I love hiking in spring."},
           {"role": "assistant", "content": "Spring trails are lovely."}],
          [{"role": "user", "content": "I bought a bike at the flea market today.",
            **({"has_answer": True} if has_answer else {})},
           {"role": "assistant", "content": "Nice find!"}]],
      "answer_session_ids": list(answer_sessions),
  }


def test_longmemeval_schema_on_a_tiny_file(tmp_path, capsys):
  path = tmp_path / "lme.json"
  path.write_text(json.dumps([_instance("q1"), _instance("q2", has_answer=False),
                              _instance("q3_abs", has_answer=False, answer_sessions=())]))
  conversations, report = load_longmemeval(path)
  assert [c.conversation_id for c in conversations] == ["q1", "q2", "q3_abs"]
  assert conversations[0].questions[0].evidence == ("s2:1",)
  assert conversations[1].questions[0].evidence == ("s2:1", "s2:2")
  assert conversations[2].questions == ()
  assert report.counts == {"no has_answer turn (answer sessions used as evidence)": 1,
                           "question without evidence (skipped)": 1}
  assert conversations[0].sessions[1].date == "2023/05/20 (Sat) 17:30"
  assert conversations[0].sessions[1].turns[0].speaker == "user"
  out = tmp_path / "eval.json"
  assert main(["eval", "--dataset", "longmemeval", "--data", str(path), "--k", "1",
               "--out", str(out)]) == 0
  result = json.loads(out.read_text())
  assert result["metrics"]["overall"]["questions"] == 2
  assert result["metrics"]["overall"]["recall_any@1"] == 1.0  # the flea-market turn ranks first


def test_longmemeval_refuses_malformed_instances(tmp_path):
  path = tmp_path / "lme.json"
  bad = _instance("q1")
  del bad["haystack_dates"]
  path.write_text(json.dumps([bad]))
  with pytest.raises(MalformedData, match=r"record 0 \(q1\): missing field 'haystack_dates'"):
    load_longmemeval(path)
  bad = _instance("q1")
  bad["haystack_dates"] = bad["haystack_dates"][:1]
  path.write_text(json.dumps([bad]))
  with pytest.raises(MalformedData, match=r"differ in length \(2, 1, 2\)"):
    load_longmemeval(path)


def test_an_empty_question_is_skipped_and_counted(tmp_path):
  import synthetic_locomo  # noqa: PLC0415
  path = synthetic_locomo.write(tmp_path / "one.json", 1)
  records = json.loads(path.read_text())
  asked = len(records[0]["qa"])
  records[0]["qa"][0]["question"] = "  "
  path.write_text(json.dumps(records))
  [conversation], report = load_locomo(path)
  assert len(conversation.questions) == asked - 1
  assert report.counts == {"empty question (skipped)": 1}
