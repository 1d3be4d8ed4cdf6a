"""Evaluation over LaceMem (units `lace`): single-pass retrieval of atomic facts, or IRIS's
iterative retrieval, each question's ranked evidence mapped to the turns the facts came from
(Recall@k over the first k distinct turns; docs/command-line.md, eval --iris)."""

from __future__ import annotations


import numpy as np
from tqdm import tqdm

from rmmjax.memory.lace import LaceMem, LaceSettings
from rmmjax.learners.cross.reader import CrossReader
from rmmjax.learners.registry import reader
from rmmjax.retrieve.metrics import turn_metrics
from rmmjax.learners.iris.cross_facts import CrossFactReranker
from rmmjax.learners.iris.episodes import FactReranker
from rmmjax.retrieve.iris import SINGLE_PASS_DEPTH, IrisSettings, iris_retrieve, single_pass
from rmmjax.retrieve.judges import HeuristicJudge, LLMJudge, OracleJudge
from rmmjax.retrieve.learned import EmbeddingRefiner, LearnedJudge

JUDGES = ("heuristic", "oracle", "llm")


def fact_reranker(reranker, store, encoder, mode: str):
  """IRIS's reranker from a LoadedReranker: a cross reranker reads the facts' texts with the
  tokenizer it trained with (another is refused), the others the store's embeddings."""
  read = reader(reranker, encoder)  # (refuses an encoder the reranker cannot read with)
  if isinstance(read, CrossReader):  # IRIS scores each fact's pair once per question
    return CrossFactReranker(reranker.params, reranker.spec, read.tokenizer, read.max_length,
                             mode)
  return FactReranker(reranker.params, reranker.spec, store, mode)


def make_judge(name: str, question, store, llm=None):
  """The judge of one of JUDGES (llm: of the LLM `llm`)."""
  if name == "oracle":
    return OracleJudge(question.evidence, store)
  return LLMJudge(llm) if name == "llm" else HeuristicJudge()


def lace_rows(conversations, encoder, ks: tuple[int, ...], iris: IrisSettings | None,
              judge: str = "heuristic", llm=None, reranker=None, rerank_mode: str = "fused",
              retriever: str = "hybrid", progress: bool = False, query_encoder=None,
              iris_model=None) -> list[tuple[str, dict]]:
  """(category, metrics) of every question, each conversation's LaceMem built from its turns
  and searched by `retriever`, by IRIS under its settings `iris` (None: in a single pass);
  `reranker` (a LoadedReranker) orders IRIS's evidence; `query_encoder` embeds the questions
  (the anchor of `iris_model`, an IrisModel, when given, whose judge and refiner IRIS then
  uses). Latency counts the refiner's and the judge's time too, but for an LLM judge's."""
  rows = []
  for conv in tqdm(conversations, desc="lace" + (" + IRIS" if iris is not None else ""),
                   unit="conversation", disable=not progress):
    store = LaceMem.from_conversation(conv, encoder, settings=LaceSettings(retrieval=retriever))
    store.query_encoder = query_encoder
    ranker = fact_reranker(reranker, store, encoder, rerank_mode) if reranker else None
    refiner = EmbeddingRefiner(iris_model.refine) if iris_model is not None else None
    for question in conv.questions:
      if iris is not None:
        chosen = (LearnedJudge(iris_model.judge, store) if iris_model is not None
                  else make_judge(judge, question, store, llm))
        result = iris_retrieve(store, question.question, category=question.category,
                               judge=chosen, settings=iris, reranker=ranker,
                               refiner=refiner)
        turns, seconds = list(result.turn_ids), result.retrieval_s + result.refine_s
        seconds += result.judge_s if judge != "llm" else 0.0
        extra = {"iterations": float(result.iterations), "abstained": float(result.abstained)}
      else:
        turns, seconds = single_pass(store, question.question, SINGLE_PASS_DEPTH)
        extra = {"iterations": 1.0, "abstained": 0.0}
      metrics = turn_metrics(store, turns, question.evidence, ks, len(set(question.evidence)))
      rows.append((question.category, metrics | extra | {"latency_ms": 1e3 * seconds}))
  return rows


def summarise(aggregated: dict, rows: list[tuple[str, dict]]) -> dict:
  """`aggregate`'s output with its means of iterations and abstentions named iterations_mean and
  abstain_rate, and latency p50/p95 (ms) in place of the mean latency."""
  groups = [(aggregated["overall"], [m for _, m in rows])] + [
      (part, [m for c, m in rows if c == category])
      for category, part in aggregated["by_category"].items()]
  for part, group in groups:
    del part["latency_ms"]
    p50, p95 = np.percentile([m["latency_ms"] for m in group], [50, 95])
    part |= {"iterations_mean": part.pop("iterations"), "abstain_rate": part.pop("abstained"),
             "latency_p50_ms": float(p50), "latency_p95_ms": float(p95)}
  return aggregated
