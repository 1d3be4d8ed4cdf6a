"""Answer metrics: token F1, ROUGE-L, the LLM judge, citation agreement and their aggregation;
what `answer` does with questions left without an answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rouge_score import rouge_scorer

from rmmjax.eval.answering import Answered, Answerer, BankAnswerer, evaluate_answers
from rmmjax.eval.answers import (
    aggregate_answers, answer_row, citation_agreement, judge_answer, rouge_l, token_f1)
from rmmjax.llm import LLMError, Verdict, answer_judge
from scripted_llm import ScriptedLLM


@pytest.mark.parametrize("prediction, gold, expected", [
    # articles and punctuation go: cat sat on mat / cat is on mat share 3 of 4 tokens each
    ("The cat sat on the mat.", "A cat is on a mat", 0.75),
    # in may 2023 vs may 2023: P = 2/3, R = 1
    ("In May, 2023!", "May 2023", 0.8),
    ("7", 7, 1.0),
    ("7 cats", 7, 2 / 3),
    ("red red blue", "red blue blue", 2 / 3),  # repeats are matched at most as often as in both
    ("An apple", "apple", 1.0),
    ("yes", "no", 0.0),
    ("", "The", 1.0),  # both empty once normalised
    ("", "Paris", 0.0),
    ("Paris", "", 0.0),
])
def test_token_f1_matches_hand_computed_values(prediction, gold, expected):
  assert token_f1(prediction, gold) == pytest.approx(expected)


def test_rouge_l_is_the_lcs_f_measure():
  # cat sat on mat (4) vs the cat was on the mat (6): LCS cat on mat = 3, P = 3/4, R = 1/2,
  # F = 2 * 3/8 / (5/4) = 0.6; ROUGE keeps the articles that token F1 drops.
  assert rouge_l("cat sat on mat", "the cat was on the mat") == pytest.approx(0.6)
  assert rouge_l("runs", "running") == 1.0  # the stemmer is on
  assert rouge_l("7", 7) == 1.0
  assert rouge_l("", "anything") == 0.0


@pytest.mark.parametrize("prediction, gold", [
    ("She moved to Boston in 2021.", "Boston, in 2021"),
    ("He adopted two dogs and a cat", "two dogs"),
    ("not sure", "Caroline went hiking"),
])
def test_rouge_l_agrees_with_the_library(prediction, gold):
  scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
  assert rouge_l(prediction, gold) == scorer.score(gold, prediction)["rougeL"].fmeasure


def test_judge_reads_correct_and_incorrect_verdicts_from_the_judge_prompt():
  llm = ScriptedLLM([{"correct": True}, '```json\n{"correct": false}\n```'])
  assert judge_answer(llm, "When?", "7 May 2023", "May 7, 2023") == Verdict(True, False)
  assert judge_answer(llm, "How many?", 3, "two") == Verdict(False, False)
  expected = answer_judge("How many?", "3", "two")
  assert llm.requests[1].messages == expected.messages
  assert llm.requests[1].schema == expected.schema


@pytest.mark.parametrize("reply", ["I think it is right", {"correct": "maybe"}, {"verdict": 1}])
def test_a_malformed_verdict_is_flagged_and_not_correct(reply):
  assert judge_answer(ScriptedLLM([reply]), "Q?", "a", "a") == Verdict(False, True)


def test_judge_lets_transport_errors_through():
  with pytest.raises(LLMError, match="down"):
    judge_answer(ScriptedLLM([LLMError("server down")]), "Q?", "a", "a")


# Memory 0 covers no evidence; 1 and 2 each cover one evidence turn.
SHOWN = [{"D1:1"}, {"D1:2", "D1:3"}, {"D2:1"}]
EVIDENCE = {"D1:3", "D2:1"}


@pytest.mark.parametrize("cited, precision, recall, rate", [
    ([], None, 0.0, 0.0),
    ([0, 1, 2], 2 / 3, 1.0, 1.0),
    ([0], 0.0, 0.0, 1 / 3),
    ([2, 2], 1.0, 0.5, 1 / 3),  # a repeated citation counts once
])
def test_citation_agreement_on_hand_built_cases(cited, precision, recall, rate):
  got = citation_agreement(SHOWN, cited, EVIDENCE)
  assert got == pytest.approx({"citation_precision": precision, "citation_recall": recall,
                               "citation_rate": rate})


def test_citation_recall_is_undefined_without_a_useful_memory_shown():
  got = citation_agreement([{"D1:1"}, ("D1:2",)], [0], {"D9:9"})
  assert got == {"citation_precision": 0.0, "citation_recall": None, "citation_rate": 0.5}
  assert citation_agreement([], [], {"D9:9"}) == {
      "citation_precision": None, "citation_recall": None, "citation_rate": None}


def test_answer_row_combines_one_questions_numbers():
  citation = citation_agreement(SHOWN, [0, 2], EVIDENCE)
  row = answer_row("Boston", "Boston", verdict=Verdict(True, False), citation=citation)
  assert row == {"f1": 1.0, "rouge_l": 1.0, "judge": 1.0, "citation_precision": 0.5,
                 "citation_recall": 0.5, "citation_rate": 2 / 3, "judge_malformed": False,
                 "answer_malformed": False, "answer_failed": False}
  bare = answer_row("", "Boston", answer_malformed=True)
  assert bare["judge"] is None and bare["citation_recall"] is None and bare["answer_malformed"]
  # No answer at all is wrong, and never judged.
  failed = answer_row("", "Boston", answer_failed=True)
  assert failed["judge"] == 0.0 and failed["answer_failed"] and failed["f1"] == 0.0
  flagged = answer_row("x", "y", verdict=Verdict(False, True))
  assert flagged["judge"] is None and flagged["judge_malformed"]  # no verdict: unjudged


def _row(f1, judge=None, precision=None, recall=None, rate=None, bad_verdict=False,
         bad_answer=False, failed=False):
  return {"f1": f1, "rouge_l": f1, "judge": 0.0 if failed else judge,
          "citation_precision": precision, "citation_recall": recall, "citation_rate": rate,
          "judge_malformed": bad_verdict, "answer_malformed": bad_answer, "answer_failed": failed}


def test_aggregation_skips_undefined_values_per_key_and_counts_them():
  rows = [("multi-hop", _row(1.0, judge=1.0, precision=1.0, recall=None, rate=0.5)),
          ("multi-hop", _row(0.5, judge=None, precision=None, recall=0.0, rate=0.0,
                             bad_verdict=True)),
          ("temporal", _row(0.0, judge=None, precision=0.0, recall=1.0, rate=1.0,
                            bad_answer=True)),
          ("temporal", _row(0.5))]
  out = aggregate_answers(rows)
  assert out["overall"] == pytest.approx({
      "f1": 0.5, "rouge_l": 0.5, "judge": 1.0, "citation_precision": 0.5,
      "citation_precision_skipped": 2, "citation_recall": 0.5, "citation_recall_skipped": 2,
      "citation_rate": 0.5, "citation_rate_skipped": 1, "questions": 4, "judged": 1,
      "failed_answers": 0, "malformed_verdicts": 1, "malformed_answers": 1})
  # A failed answer counts against the judge's mean without being one of the judged.
  failed = aggregate_answers(rows + [("temporal", _row(0.0, failed=True))])["overall"]
  assert failed["judge"] == pytest.approx(1 / 2) and failed["judged"] == 1
  assert failed["failed_answers"] == 1
  multi, temporal = out["by_category"]["multi-hop"], out["by_category"]["temporal"]
  assert multi["f1"] == 0.75 and multi["citation_precision"] == 1.0
  assert multi["citation_precision_skipped"] == 1 and multi["malformed_verdicts"] == 1
  assert temporal["judge"] is None and temporal["judged"] == 0  # nothing judged: no mean
  assert temporal["citation_recall"] == 1.0 and temporal["malformed_answers"] == 1
  assert list(out["by_category"]) == ["multi-hop", "temporal"]


def test_aggregation_refuses_empty_rows():
  with pytest.raises(ValueError, match="no questions"):
    aggregate_answers([])


def _locomo_file(tmp_path, questions: int) -> Path:
  chat = {"speaker_a": "Ann", "speaker_b": "Bob", "session_1_date_time": "1 May 2023",
          "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "My cat is Pixel."}]}
  qa = [{"question": f"Question {i}?", "answer": "Pixel", "evidence": ["D1:1"], "category": 4}
        for i in range(questions)]
  path = tmp_path / "data.json"
  path.write_text(json.dumps([{"sample_id": "c1", "conversation": chat, "qa": qa}]))
  return path


class _Scripted(Answerer):
  """Hands back scripted answers (every one shows the evidence turn, citing it)."""

  def __init__(self, answers):
    self.answers = list(answers)

  def __call__(self, conv, question):
    answer, failure = self.answers.pop(0)
    return Answered(answer, [{"D1:1"}], (0,), ["D1:1"], failure, failure or "")


def test_a_question_without_an_answer_is_wrong_and_never_judged(tmp_path):
  data = _locomo_file(tmp_path, 3)
  judge = ScriptedLLM([json.dumps({"correct": True})])  # one verdict: a second call would fail
  report = evaluate_answers("locomo", data, _Scripted(
      [("Pixel", None), (None, "llm_error"), ("", None)]), judge)
  overall = report["metrics"]["overall"]
  assert (overall["judge"], overall["judged"], overall["failed_answers"]) == (
      pytest.approx(1 / 3), 1, 2)
  # Without an answer nothing was used: its citations count as none.
  assert overall["citation_rate"] == pytest.approx(1 / 3)
  assert [a["correct"] for a in report["answers"]] == [True, False, False]
  assert report["complete"] and judge.remaining == 0


def test_a_server_that_keeps_failing_stops_the_run_with_what_was_answered(tmp_path):
  data = _locomo_file(tmp_path, 9)
  answers = [("Pixel", None)] + [(None, "llm_error")] * 8
  report = evaluate_answers("locomo", data, _Scripted(answers),
                            ScriptedLLM([json.dumps({"correct": True})]))
  assert not report["complete"] and "5 questions in a row" in report["stopped"]
  assert report["metrics"]["overall"]["questions"] == 6


def test_a_bank_missing_a_conversation_is_refused_before_the_first_question(tmp_path):
  class Bank:
    where = "memory bank b.sqlite"

    def users(self):
      return ["another"]

  class AgentStub:
    bank = Bank()

  with pytest.raises(ValueError, match="has no memories of 1 of the 1 conversations \\(c1\\)"):
    evaluate_answers("locomo", _locomo_file(tmp_path, 2), BankAnswerer(AgentStub()),
                     ScriptedLLM([]))


def test_a_malformed_verdict_leaves_its_question_unjudged_in_the_mean_and_in_the_record(
    tmp_path):
  data = _locomo_file(tmp_path, 3)
  judge = ScriptedLLM([json.dumps({"correct": True}), "no verdict here",
                       json.dumps({"correct": False})])
  report = evaluate_answers("locomo", data, _Scripted([("Pixel", None)] * 3), judge)
  overall = report["metrics"]["overall"]
  assert (overall["judge"], overall["judged"], overall["malformed_verdicts"]) == (0.5, 2, 1)
  assert [a["correct"] for a in report["answers"]] == [True, None, False]
  assert [a["judge_malformed"] for a in report["answers"]] == [False, True, False]


def _pairwise_auc(scores, labels) -> float:
  """The definition, pair by pair: a positive above a negative 1, tied 1/2."""
  pos = [s for s, y in zip(scores, labels) if y]
  neg = [s for s, y in zip(scores, labels) if not y]
  return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_roc_auc_counts_ties_as_halves(seed):
  import numpy as np

  from rmmjax.eval.classifier import roc_auc
  rng = np.random.default_rng(seed)
  scores = rng.choice([0.2, 0.5, 0.5, 0.9], size=40)  # heavily tied, as a heuristic judge's
  labels = rng.random(40) < 0.4
  assert roc_auc(scores, labels) == pytest.approx(_pairwise_auc(scores, labels))
  # All-equal scores say nothing, whichever order the labels come in.
  assert roc_auc(np.ones(6), [True, True, False, False, False, True]) == 0.5
  assert roc_auc(np.ones(6), [False, False, False, True, True, True]) == 0.5
  assert np.isnan(roc_auc([0.3, 0.7], [True, True]))
