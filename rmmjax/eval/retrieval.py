"""`rmmjax eval`: evidence retrieval on a labelled conversation dataset, per category."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from tqdm import tqdm

from rmmjax.config import EVALUABLE_DATASETS
from rmmjax.data.locomo import load_locomo
from rmmjax.data.longmemeval import load_longmemeval
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.eval.leakage import unseen
from rmmjax.io.record import check_fit
from rmmjax.eval.iris_eval import lace_rows, summarise
from rmmjax.retrieve.metrics import MRR_DEPTH, aggregate, question_metrics
from rmmjax.eval.reranked import reranked_orders
from rmmjax.learners.loading import load_reranker
from rmmjax.learners.registry import reader
from rmmjax.replay.candidates import build_replay, ceiling_recall
from rmmjax.learners.query_encoder.files import load_query_encoder, query_encoder_record
from rmmjax.learners.query_encoder.fit import retrieval_encoders
from rmmjax.encode.protocol import encoder_identity
from rmmjax.io.kinds import model_kind
from rmmjax.learners.iris.files import is_iris_model, load_iris_model
from rmmjax.retrieve.iris import IRIS_PRESETS
from rmmjax.retrieve.rankers import make_retriever
from rmmjax.memory.topic_units import conversation_units

DATASETS = {"locomo": load_locomo, "longmemeval": load_longmemeval}
assert tuple(DATASETS) == EVALUABLE_DATASETS


def evaluate_retrieval(dataset: str, data: Path, units: str, retriever: str, ks: tuple[int, ...],
                       budget_words: int | None = None, encoder=None,
                       reranker: Path | None = None, online: bool = False,
                       in_sample: bool = False, allow_mismatch: bool = False,
                       progress: bool = False, query_encoder: Path | None = None,
                       iris: bool | str = False, judge: str = "heuristic", llm=None,
                       rerank_mode: str = "fused", iris_model: Path | None = None,
                       per_question: bool = False, candidates: int | None = None) -> dict:
  """Retrieves for every question from its own conversation's units; returns the report. Each
  argument is an `rmmjax eval` flag (docs/command-line.md, eval); `iris` is True or a name of
  IRIS_PRESETS. Which settings go together is the caller's to check (the CLI's check_flags)."""
  iris = "default" if iris is True else (iris or None)
  loaded = load_reranker(Path(reranker)) if reranker is not None else None
  if loaded and query_encoder is None and loaded.record.get("query_encoder_path"):
    query_encoder = recorded_query_encoder(Path(reranker), loaded.record)
  conversations, report = DATASETS[dataset](data)
  without_questions = [c.conversation_id for c in conversations if not c.questions]
  conversations = [c for c in conversations if c.questions]
  if not conversations:
    raise ValueError(f"{data} holds no question with evidence labels; it cannot be evaluated "
                     "for retrieval")
  if (retriever != "bm25" or loaded or units in ("topic", "lace")) and encoder is None:
    encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))  # loads weights: only here
  if candidates is not None and candidates != loaded.spec.k:
    # A cascade: the base order's first N of the K candidates read, the rest after them.
    _check_candidates(loaded, candidates, encoder)
    loaded = dataclasses.replace(loaded, spec=dataclasses.replace(loaded.spec, k=candidates))
  lace_anchor = (query_encoder is not None and units == "lace"
                 and is_iris_model(Path(query_encoder)))
  model = load_iris_model(Path(iris_model), encoder) if iris_model is not None else None
  if lace_anchor:
    model = load_iris_model(Path(query_encoder), encoder)
  tuned = (model.anchor if model is not None else
           load_query_encoder(Path(query_encoder), encoder) if query_encoder else None)
  config = {"dataset": dataset, "data": str(Path(data).resolve()), "units": units,
            "retriever": retriever, "k": list(ks), "budget_words": budget_words,
            "encoder": encoder_identity(encoder) if encoder is not None else None,
            "query_encoder": str(query_encoder) if query_encoder else None,
            "query_encoder_identity": tuned.identity if tuned else None, "mismatches": [],
            "without_questions": without_questions}
  models = []
  if model is not None:
    config["iris_model"] = model.source
    models.append((model.source, model.record))
  elif tuned:
    record = query_encoder_record(Path(query_encoder))
    config["mismatches"] += check_fit(f"the query encoder {query_encoder}", record,
                                      {"encoder": encoder_identity(encoder), "dim": encoder.dim},
                                      allow_mismatch)
    models.append((str(query_encoder), record))
    config["query_encoder_record"] = record
  if loaded:
    wanted = {"dataset": dataset, "units": units, "retriever": retriever,
              "encoder": encoder_identity(encoder), "dim": encoder.dim,
              "query_encoder": tuned.identity if tuned else None}
    if units == "lace":
      wanted["iris"] = iris  # the gathering its candidates came from
    config["mismatches"] += check_fit(f"the reranker {loaded.source}", loaded.record, wanted,
                                      allow_mismatch)
    models.append((loaded.source, loaded.record))
    config |= {"reranker": loaded.source, "reranker_record": loaded.record, "online": online,
               "candidates_read": loaded.spec.k,
               "reranker_step": loaded.step, "reranker_steps_planned": loaded.planned_steps,
               # (a cross reranker's encoder computes in bfloat16 on an accelerator under auto)
               "compute_dtype": getattr(loaded.spec.model, "compute_dtype", None)}
  if models:
    conversations, account = unseen(conversations, models, in_sample)
    config |= account
  tune = config.get("query_encoder_record", {}).get("tune", "query")
  memory_encoder, query_side = retrieval_encoders(encoder, tuned, tune)
  config["tune"] = tune if tuned else None
  beside, ceiling = {}, None
  if units == "lace":
    rows = lace_rows(conversations, encoder, ks, IRIS_PRESETS[iris] if iris else None, judge,
                     llm=llm, reranker=loaded, rerank_mode=rerank_mode, retriever=retriever,
                     progress=progress, query_encoder=tuned,
                     iris_model=model if iris_model is not None else None)
    config |= {"iris": iris, "judge": judge if iris else None,
               "rerank_mode": rerank_mode if loaded else None}
    metrics = summarise(aggregate(rows), rows)
  else:
    # Units once per conversation (topics replay the conversation through reflection).
    pools = {c.conversation_id: conversation_units(c, units, encoder) for c in conversations}
    if loaded:
      rows, base, ceiling = _reranked_rows(conversations, pools, units, retriever,
                                           memory_encoder, loaded, online, ks, budget_words,
                                           progress, query_side, encoder)
      # What the reranker is measured against: the order it reranks, and all K it reads.
      beside = {"base_order": aggregate(base),
                "ceiling": aggregate(ceiling) | {"k": loaded.spec.k}}
    else:
      rows = _base_rows(conversations, pools, retriever, memory_encoder, ks, budget_words,
                        progress, query_side)
    metrics = aggregate(rows)
  config["conversations"] = [c.conversation_id for c in conversations]
  out = {"config": config,
         "load_report": {"counts": dict(report.counts), "examples": report.examples},
         "metrics": metrics} | beside
  if ceiling:  # (each question's, in its row of per_question)
    rows = [(c, m | {"ceiling": r.pop("ceiling"), "base_order": b, "best_order": r})
            for (c, m), (_, b), (_, r) in zip(rows, base, ceiling)]
  if per_question:  # each question's metrics in order, for intervals over conversations
    asked = [c for c in conversations for _ in c.questions]
    out["per_question"] = [{"conversation": c.conversation_id, "category": category} | metrics
                           for c, (category, metrics) in zip(asked, rows)]
  return out


def _check_candidates(loaded, candidates: int, encoder) -> None:
  """Refuses --candidates a reranker cannot read: more than the K it trained on, fewer than the
  M it selects, or fewer than K for one whose rank prior scores K positions at once (all but
  the cross reranker, which reads each packed pair's own position)."""
  k, m = loaded.spec.k, loaded.spec.m
  if not m <= candidates <= k:
    raise ValueError(f"--candidates {candidates}: the reranker {loaded.source} reads from "
                     f"{m} (the M it selects) to {k} (the K it trained on) candidates")
  if not getattr(reader(loaded, encoder), "batchwise", False):
    raise ValueError(f"--candidates {candidates}: the reranker {loaded.source} scores the K = "
                     f"{k} positions it trained on together; only a cross reranker reads fewer")


def recorded_query_encoder(reranker: Path, record: dict) -> Path:
  """The tuned query encoder whose candidates a reranker trained on: a two-stage workdir's
  own query_encoder/, else (a two-stage export) the query_encoder/ beside it, else the one its
  record names. Which one it is, is checked against the record's identity."""
  recorded = Path(record["query_encoder_path"])
  beside = reranker.parent / "query_encoder" if model_kind(reranker) in (
      "reranker export", "reranker file") else None
  for candidate in (reranker / "query_encoder", beside, recorded):
    if candidate is not None and candidate.is_dir() and candidate.resolve() != reranker.resolve():
      return candidate
  raise ValueError(f"the reranker {reranker} ranks the candidates of the query encoder "
                   f"{recorded}, which is not there (moved?): pass it as --encoder DIR")


def _rows_from_orders(conv, pool, orders, ks, budget_words) -> list:
  rows = []
  for question, ranked_idx in zip(conv.questions, orders):
    evidence = set(question.evidence)
    ranked = [(pool[i].turn_ids, pool[i].words) for i in ranked_idx if i >= 0]
    num_relevant = sum(bool(evidence.intersection(u.turn_ids)) for u in pool)
    rows.append((question.category,
                 question_metrics(ranked, evidence, num_relevant, ks, budget_words)))
  return rows


def _best_orders(replay) -> np.ndarray:
  """order_NxR with each question's K candidates reordered evidence first (ties keep the base
  order): the ranking a perfect reranker of those K would give."""
  k = replay.relevant_NxK.shape[1]
  head = np.take_along_axis(replay.order_NxR[:, :k],
                            np.argsort(~replay.relevant_NxK, 1, kind="stable"), 1)
  return np.concatenate([head, replay.order_NxR[:, k:]], 1)


def _reranked_rows(conversations, pools, units, retriever, encoder, loaded, online, ks,
                   budget_words, progress, tuned, text_encoder) -> tuple[list, list, list]:
  """The reranked order's rows, the base order's over the same candidates, and the ceiling's:
  each metric of the best order of the K candidates (it uses the labels), with each question's
  recall of all K ("ceiling"), what any reranker of them is capped at."""
  # A word budget may reach past the first 100 units: keep the whole base ranking then.
  replays = build_replay(conversations, units, retriever, encoder, loaded.spec.k,
                         depth=None if budget_words else max(max(ks), 10, MRR_DEPTH),
                         progress=progress, query_encoder=tuned,
                         unit_builder=lambda conv, _: pools[conv.conversation_id])
  rows, base, ceiling = [], [], []
  for conv, replay, orders in zip(conversations, replays,
                                  reranked_orders(replays, loaded, online, text_encoder)):
    pool = pools[conv.conversation_id]
    rows += _rows_from_orders(conv, pool, orders, ks, budget_words)
    base += _rows_from_orders(conv, pool, replay.order_NxR, ks, budget_words)
    best = _rows_from_orders(conv, pool, _best_orders(replay), ks, budget_words)
    ceiling += [(c, m | {"ceiling": float(r)})
                for (c, m), r in zip(best, ceiling_recall(replay))]
  return rows, base, ceiling


def _base_rows(conversations, pools, retriever, encoder, ks, budget_words, progress,
               tuned) -> list:
  depth = max(max(ks), 10, MRR_DEPTH)
  rows = []
  for conv in tqdm(conversations, desc=f"retrieving ({retriever})",
                   unit="conversation", disable=not progress):
    pool = pools[conv.conversation_id]
    ranker = make_retriever(retriever, [u.text for u in pool], encoder, tuned)
    order = ranker.rank([q.question for q in conv.questions], len(pool) if budget_words else depth)
    rows += _rows_from_orders(conv, pool, order, ks, budget_words)
  return rows


def format_table(result: dict, ks: tuple[int, ...]) -> str:
  """One row per category and overall; column names say what each number is."""
  columns = ([(f"recall_all@{k}", f"R@{k} all") for k in ks]
             + [(f"recall_any@{k}", f"R@{k} any") for k in ks]
             + [("ndcg@10", "NDCG@10"), ("mrr", "MRR")]
             + [(f"words@{k}", f"words@{k}") for k in ks])
  budget = result["config"]["budget_words"]
  if budget:
    columns += [("recall_all@budget", f"R all@{budget}w"), ("words@budget", f"words@{budget}w")]
  if "iterations_mean" in result["metrics"]["overall"]:
    columns += [("iterations_mean", "iterations"), ("abstain_rate", "abstain"),
                ("latency_p50_ms", "p50 ms"), ("latency_p95_ms", "p95 ms")]
  width = max(10, max(len(label) for _, label in columns) + 2)
  lines = [f"{'':14s}{'questions':>10s}" + "".join(f"{label:>{width}s}" for _, label in columns)]
  groups = [("overall", result["metrics"]["overall"])] + list(
      result["metrics"]["by_category"].items())
  for name, m in groups:
    lines.append(f"{name:14s}{m['questions']:10d}" + "".join(
        f"{m[key]:{width}.1f}" if key.startswith(("words", "latency")) else
        f"{m[key]:{width}.3f}"
        for key, _ in columns))
  return "\n".join(lines)
