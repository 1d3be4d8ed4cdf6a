"""Answer-level metrics: token F1, ROUGE-L, the LLM judge, and agreement of citations with evidence.

One question's numbers come from `answer_row`; `aggregate_answers` averages them per category
like `rmmjax.retrieve.metrics.aggregate`. A value of None means undefined for that question (not
judged, nothing cited, no useful memory shown) and is left out of that key's mean, with the
number left out reported beside it.
"""

from __future__ import annotations

import collections
import functools
import re
import string

from rmmjax.llm.base import LLM
from rmmjax.llm.parse import Verdict, parse_verdict
from rmmjax.llm.prompts import answer_judge

Gold = str | int | float  # LoCoMo writes some answers as bare numbers
METRIC_KEYS = ("f1", "rouge_l", "judge", "citation_precision", "citation_recall",
               "citation_rate")
# Often undefined per question, so their aggregates also say how many questions were skipped.
CITATION_KEYS = ("citation_precision", "citation_recall", "citation_rate")

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> list[str]:
  """Lower-cased tokens without punctuation or articles (the usual QA normalisation)."""
  text = text.lower().translate(_PUNCTUATION)
  return _ARTICLES.sub(" ", text).split()


def token_f1(prediction: str, gold: Gold) -> float:
  """Normalised token F1; 1.0 when both are empty after normalising, 0.0 when one is."""
  pred, ref = normalize_answer(prediction), normalize_answer(str(gold))
  if not pred or not ref:
    return float(pred == ref)
  common = sum((collections.Counter(pred) & collections.Counter(ref)).values())
  if common == 0:
    return 0.0
  precision, recall = common / len(pred), common / len(ref)
  return 2 * precision * recall / (precision + recall)


@functools.cache
def _rouge_scorer():
  # Imported here so modules that never score ROUGE do not pay for loading nltk.
  from rouge_score import rouge_scorer
  return rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)


def rouge_l(prediction: str, gold: Gold) -> float:
  """ROUGE-L F-measure (Porter-stemmed); the library gives 0.0 when either side has no tokens."""
  return float(_rouge_scorer().score(str(gold), prediction)["rougeL"].fmeasure)


def judge_answer(llm: LLM, question: str, gold: Gold, prediction: str) -> Verdict:
  """The LLM judge's verdict on one answer; a malformed reply is flagged (answer_row leaves it
  out of the judge's mean). LLMError propagates: a question whose judging failed must not be
  scored as wrong."""
  prompt = answer_judge(question, str(gold), prediction, max_chars=llm.prompt_chars())
  return parse_verdict(llm.chat_structured(prompt.messages, prompt.schema))


def _ratio(num: int, den: int) -> float | None:
  return num / den if den else None


def citation_agreement(shown_turns: list[set[str]], cited: list[int],
                       evidence: set[str]) -> dict[str, float | None]:
  """Precision, recall and rate of the generator's citations (0-based positions among the
  shown memories, repeats counting once) against the evidence labels. A shown memory (the turn
  ids it covers) is useful when it covers an evidence turn. Precision is undefined (None) when
  nothing was cited, recall when no useful memory was shown, rate when nothing was shown."""
  useful = {i for i, turns in enumerate(shown_turns) if set(turns) & evidence}
  chosen = set(cited)
  hits = len(chosen & useful)
  return {"citation_precision": _ratio(hits, len(chosen)),
          "citation_recall": _ratio(hits, len(useful)),
          "citation_rate": _ratio(len(chosen), len(shown_turns))}


def answer_row(prediction: str, gold: Gold, *, verdict: Verdict | None = None,
               citation: dict[str, float | None] | None = None,
               answer_malformed: bool = False, answer_failed: bool = False) -> dict:
  """One question's answer metrics; without a verdict or citation (`citation_agreement`) their
  keys are None. `answer_malformed`: the generator's reply could not be parsed (its text is
  still scored); `answer_failed`: there is no answer (the LLM failed, or gave no text): it is
  wrong (judge 0) without being judged, and counted apart."""
  citation = citation or {}
  # A verdict the judge could not give (malformed) says nothing either way: unjudged, flagged.
  judge = (0.0 if answer_failed else
           None if verdict is None or verdict.malformed else float(verdict.correct))
  return {"f1": token_f1(prediction, gold), "rouge_l": rouge_l(prediction, gold),
          "judge": judge,
          **{key: citation.get(key) for key in CITATION_KEYS},
          "judge_malformed": verdict is not None and verdict.malformed,
          "answer_malformed": bool(answer_malformed), "answer_failed": bool(answer_failed)}


def _summary(group: list[dict]) -> dict:
  out: dict = {}
  for key in METRIC_KEYS:
    values = [row[key] for row in group if row[key] is not None]
    out[key] = sum(values) / len(values) if values else None
    if key in CITATION_KEYS:
      out[f"{key}_skipped"] = len(group) - len(values)
  out["questions"] = len(group)
  out["judged"] = sum(row["judge"] is not None and not row["answer_failed"] for row in group)
  out["failed_answers"] = sum(bool(row["answer_failed"]) for row in group)
  out["malformed_verdicts"] = sum(bool(row["judge_malformed"]) for row in group)
  out["malformed_answers"] = sum(bool(row["answer_malformed"]) for row in group)
  return out


def aggregate_answers(rows: list[tuple[str, dict]]) -> dict:
  """{"overall": summary, "by_category": {category: summary}} from (category, answer_row) rows:
  each metric's mean over the questions where it is defined (None where nowhere), how many the
  citation metrics skipped, and the counts of `_summary`."""
  if not rows:
    raise ValueError("no questions to aggregate")
  categories = sorted({str(c) for c, _ in rows})
  return {"overall": _summary([row for _, row in rows]),
          "by_category": {c: _summary([row for cat, row in rows if str(cat) == c])
                          for c in categories}}
