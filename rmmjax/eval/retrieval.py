"""`rmmjax eval`: evidence retrieval on a labelled conversation dataset, per category."""

from __future__ import annotations

from pathlib import Path

from rmmjax.data.locomo import load_locomo
from rmmjax.data.longmemeval import load_longmemeval
from rmmjax.data.msc import load_msc
from rmmjax.encode.cache import EmbeddingCache
from rmmjax.encode.encoder import DEFAULT_CACHE, SentenceEncoder
from rmmjax.eval.metrics import MRR_DEPTH, aggregate, question_metrics
from rmmjax.eval.reranked import load_reranker, reranked_orders
from rmmjax.io.workdir import atomic_write_json
from rmmjax.replay.candidates import build_replay
from rmmjax.retrieve.rankers import RETRIEVERS, make_retriever
from rmmjax.retrieve.units import GRANULARITIES, build_units

DATASETS = {"locomo": load_locomo, "longmemeval": load_longmemeval, "msc": load_msc}


def evaluate_retrieval(dataset: str, data: Path, units: str, retriever: str, ks: tuple[int, ...],
                       budget_words: int | None = None, encoder=None,
                       reranker: Path | None = None, online: bool = False) -> dict:
  """Retrieves for every question from its own conversation's units; returns the report.

  With a reranker (a training workdir or an exported file) its order over the retriever's K
  candidates replaces theirs; a workdir's reranker is evaluated only on the conversations it
  held out. `online` replays each conversation prequentially, the reranker learning as it goes.
  """
  for name, value, choices in (("dataset", dataset, DATASETS), ("units", units, GRANULARITIES),
                               ("retriever", retriever, RETRIEVERS)):
    if value not in choices:
      raise ValueError(f"--{name} {value!r} is not one of {', '.join(choices)}")
  if not ks or min(ks) < 1:
    raise ValueError(f"--k {ks}: expected positive cut-offs such as 5,10")
  if budget_words is not None and budget_words < 1:
    raise ValueError(f"--budget-words {budget_words}: expected a positive number of words")
  if online and reranker is None:
    raise ValueError("--online replays a reranker's online learning: pass --reranker as well")
  loaded = None
  if reranker is not None:
    loaded = load_reranker(Path(reranker))
  conversations, report = DATASETS[dataset](data)
  if not any(c.questions for c in conversations):
    raise ValueError(f"{data} holds no question with evidence labels; {dataset} cannot be "
                     "evaluated for retrieval")
  if (retriever != "bm25" or loaded) and encoder is None:
    encoder = SentenceEncoder(cache=EmbeddingCache(DEFAULT_CACHE))  # loads weights: only here
  config = {"dataset": dataset, "data": str(data), "units": units, "retriever": retriever,
            "k": list(ks), "budget_words": budget_words}
  if loaded:
    conversations = _unseen(conversations, loaded, data)
    config |= {"reranker": str(reranker), "online": online,
               "conversations": [c.conversation_id for c in conversations]}
    rows = _reranked_rows(conversations, units, retriever, encoder, loaded, online, ks,
                          budget_words)
  else:
    rows = _base_rows(conversations, units, retriever, encoder, ks, budget_words)
  return {"config": config,
          "load_report": {"counts": dict(report.counts), "examples": report.examples},
          "metrics": aggregate(rows)}


def _unseen(conversations: list, loaded: dict, data: Path) -> list:
  """The conversations a workdir's reranker held out, when it trained on this very file."""
  if loaded["holdout"] is None or Path(loaded["data"]).resolve() != Path(data).resolve():
    return conversations
  with_questions = [c for c in conversations if c.questions]
  return with_questions[-loaded["holdout"]:]


def _rows_from_orders(conv, pool, orders, ks, budget_words) -> list:
  rows = []
  for question, ranked_idx in zip(conv.questions, orders):
    evidence = set(question.evidence)
    ranked = [(pool[i].turn_ids, pool[i].words) for i in ranked_idx if i >= 0]
    num_relevant = sum(bool(evidence.intersection(u.turn_ids)) for u in pool)
    rows.append((question.category,
                 question_metrics(ranked, evidence, num_relevant, ks, budget_words)))
  return rows


def _reranked_rows(conversations, units, retriever, encoder, loaded, online, ks,
                   budget_words) -> list:
  conversations = [c for c in conversations if c.questions]
  # A word budget may reach past the first 100 units: keep the whole base ranking then.
  replays = build_replay(conversations, units, retriever, encoder, loaded["spec"].k,
                         depth=None if budget_words else max(max(ks), 10, MRR_DEPTH))
  rows = []
  for conv, orders in zip(conversations, reranked_orders(replays, loaded, online)):
    rows += _rows_from_orders(conv, build_units(conv, units), orders, ks, budget_words)
  return rows


def _base_rows(conversations, units, retriever, encoder, ks, budget_words) -> list:
  depth = max(max(ks), 10, MRR_DEPTH)
  rows = []
  for conv in conversations:
    if not conv.questions:
      continue
    pool = build_units(conv, units)
    ranker = make_retriever(retriever, [u.text for u in pool], encoder)
    order = ranker.rank([q.question for q in conv.questions], len(pool) if budget_words else depth)
    rows += _rows_from_orders(conv, pool, order, ks, budget_words)
  return rows


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
