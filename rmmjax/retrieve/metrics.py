"""Evidence retrieval metrics over ranked memory units (docs/command-line.md, eval): a unit is
relevant when it covers an evidence turn; the words retrieved are reported beside recall, since
larger units buy recall with context."""

from __future__ import annotations

import math

import numpy as np

MRR_DEPTH = 100  # MRR counts a first hit within the top 100 units, else 0


def question_metrics(ranked: list[tuple[tuple[str, ...], int]], evidence: set[str],
                     num_relevant_units: int, ks: tuple[int, ...],
                     budget_words: int | None = None) -> dict[str, float]:
  """Metrics of one question from `ranked`, the (turn ids covered, words) of the retrieved
  units, best first (at least max(ks) of them, or every unit there is). `num_relevant_units`
  (units of the whole pool that cover an evidence turn) gives the ideal DCG; with
  `budget_words`, also recall_all@budget over units taken until that many words."""
  if not evidence:
    raise ValueError("a question without evidence has no recall; skip it before evaluating")
  relevant = [bool(evidence.intersection(turns)) for turns, _ in ranked]
  out = {}
  for k in ks:
    found = evidence.intersection(t for turns, _ in ranked[:k] for t in turns)
    out[f"recall_all@{k}"] = len(found) / len(evidence)
    out[f"recall_any@{k}"] = float(bool(found))
    out[f"words@{k}"] = float(sum(words for _, words in ranked[:k]))
  dcg = sum(1.0 / math.log2(i + 2) for i, rel in enumerate(relevant[:10]) if rel)
  idcg = sum(1.0 / math.log2(i + 2) for i in range(min(num_relevant_units, 10)))
  out["ndcg@10"] = dcg / idcg if idcg else 0.0
  first = next((i for i, rel in enumerate(relevant[:MRR_DEPTH]) if rel), None)
  out["mrr"] = 0.0 if first is None else 1.0 / (first + 1)
  if budget_words is not None:
    taken, used = set(), 0
    for turns, words in ranked:
      if used + words > budget_words:
        break
      taken.update(turns)
      used += words
    out["recall_all@budget"] = len(evidence & taken) / len(evidence)
    out["words@budget"] = float(used)
  return out


def turn_metrics(store, turn_ids, evidence, ks, num_relevant) -> dict:
  """Metrics of the ranked turns; a turn's words are its verbatim text's."""
  return question_metrics([((t,), len(store.raw(t).text.split())) for t in turn_ids],
                          set(evidence), num_relevant, ks)


def aggregate(rows: list[tuple[str, dict[str, float]]]) -> dict:
  """{"overall": means, "by_category": {category: means}} from one or more (category, metrics)
  rows."""

  def mean(group):
    return {key: float(np.mean([m[key] for m in group])) for key in group[0]} | {
        "questions": len(group)}

  categories = sorted({c for c, _ in rows})
  return {"overall": mean([m for _, m in rows]),
          "by_category": {c: mean([m for cat, m in rows if cat == c]) for c in categories}}
