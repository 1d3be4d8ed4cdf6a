"""`rmmjax eval`: evidence retrieval on a labelled conversation dataset, per category."""

from __future__ import annotations

from pathlib import Path

from rmmjax.data.locomo import load_locomo
from rmmjax.data.longmemeval import load_longmemeval
from rmmjax.data.msc import load_msc
from rmmjax.eval.metrics import MRR_DEPTH, aggregate, question_metrics
from rmmjax.io.workdir import atomic_write_json
from rmmjax.retrieve.bm25 import BM25Retriever
from rmmjax.retrieve.dense import DenseRetriever, FusionRetriever
from rmmjax.retrieve.units import GRANULARITIES, build_units

DATASETS = {"locomo": load_locomo, "longmemeval": load_longmemeval, "msc": load_msc}
RETRIEVERS = ("bm25", "dense", "hybrid")


def make_retriever(name: str, texts: list[str], encoder):
  """A ranker over texts: BM25, dense (the encoder), or their reciprocal-rank fusion."""
  if name == "bm25":
    return BM25Retriever(texts)
  if name == "dense":
    return DenseRetriever(texts, encoder)
  return FusionRetriever([BM25Retriever(texts), DenseRetriever(texts, encoder)], len(texts))


def evaluate_retrieval(dataset: str, data: Path, units: str, retriever: str, ks: tuple[int, ...],
                       budget_words: int | None = None, encoder=None) -> dict:
  """Retrieves for every question from its own conversation's units; returns the report."""
  for name, value, choices in (("dataset", dataset, DATASETS), ("units", units, GRANULARITIES),
                               ("retriever", retriever, RETRIEVERS)):
    if value not in choices:
      raise ValueError(f"--{name} {value!r} is not one of {', '.join(choices)}")
  if not ks or min(ks) < 1:
    raise ValueError(f"--k {ks}: expected positive cut-offs such as 5,10")
  if budget_words is not None and budget_words < 1:
    raise ValueError(f"--budget-words {budget_words}: expected a positive number of words")
  conversations, report = DATASETS[dataset](data)
  if not any(c.questions for c in conversations):
    raise ValueError(f"{data} holds no question with evidence labels; {dataset} cannot be "
                     "evaluated for retrieval")
  if retriever != "bm25" and encoder is None:
    from rmmjax.encode.encoder import SentenceEncoder  # noqa: PLC0415  (loads weights: only here)
    encoder = SentenceEncoder()
  depth = max(max(ks), 10, MRR_DEPTH)
  rows = []
  for conv in conversations:
    if not conv.questions:
      continue
    pool = build_units(conv, units)
    ranker = make_retriever(retriever, [u.text for u in pool], encoder)
    order = ranker.rank([q.question for q in conv.questions], len(pool) if budget_words else depth)
    for question, ranked_idx in zip(conv.questions, order):
      evidence = set(question.evidence)
      ranked = [(pool[i].turn_ids, pool[i].words) for i in ranked_idx]
      num_relevant = sum(bool(evidence.intersection(u.turn_ids)) for u in pool)
      rows.append((question.category,
                   question_metrics(ranked, evidence, num_relevant, ks, budget_words)))
  return {"config": {"dataset": dataset, "data": str(data), "units": units,
                     "retriever": retriever, "k": list(ks), "budget_words": budget_words},
          "load_report": {"counts": dict(report.counts), "examples": report.examples},
          "metrics": aggregate(rows)}


def write_report(result: dict, out: Path) -> None:
  atomic_write_json(out, result)


def format_table(result: dict, ks: tuple[int, ...]) -> str:
  keys = [f"recall_all@{k}" for k in ks] + [f"recall_any@{k}" for k in ks] + [
      "ndcg@10", "mrr"] + [f"words@{k}" for k in ks]
  if result["config"]["budget_words"]:
    keys.append("recall_all@budget")
  header = f"{'':14s}{'n':>6s}" + "".join(f"{k:>16s}" for k in keys)
  lines = [header]
  groups = [("overall", result["metrics"]["overall"])] + list(
      result["metrics"]["by_category"].items())
  for name, m in groups:
    lines.append(f"{name:14s}{m['questions']:6d}" + "".join(
        f"{m[k]:16.1f}" if k.startswith("words") else f"{m[k]:16.3f}" for k in keys))
  return "\n".join(lines)
