"""`rmmjax bench iris`: LaceMem's streaming ingestion and IRIS's retrieval latency against
single-pass retrieval, on a LoCoMo conversation and on a synthetic store of 100,000 facts.

Count first: a streamed fact is compared with every fact before it through blocked matrix
products (N x 384 multiply-adds, about 77 MFLOP at N = 100,000), and keeps at most
`max_semantic` semantic neighbours, so edges grow linearly with N, never as N^2. A search is
BM25 over the facts plus one matrix-vector product; IRIS makes up to 2 searches per iteration
(anchor and refinement) for up to 3 iterations, plus one-hop expansions and entity buffers:
about 6 searches, so its latency is bounded by roughly 6x single-pass plus the judge.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from rmmjax.bench.core import write_result

from rmmjax.memory.lace import LaceMem
from rmmjax.memory.lace_synthetic import synthetic_lace
from rmmjax.retrieve.iris import IrisSettings, iris_retrieve
from rmmjax.retrieve.judges import HeuristicJudge


class _RandomQueries:
  """Queries as random unit vectors (the encoder's cost is `bench encode`'s, not measured)."""

  dim = 384
  identity = "random bench vectors"

  def __init__(self):
    self._rng = np.random.default_rng(0)

  def encode(self, texts):
    x = self._rng.standard_normal((len(texts), self.dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _latencies(store, questions, categories) -> dict:
  single, iris = [], []
  store.search(questions[0], 100)  # builds the BM25 index, which a store does once per change
  for question, category in zip(questions, categories):
    t0 = time.perf_counter()
    store.search(question, 100)
    single.append(time.perf_counter() - t0)
    result = iris_retrieve(store, question, category=category, judge=HeuristicJudge(),
                           settings=IrisSettings())
    iris.append(result.retrieval_s)
  pct = lambda x, q: 1e3 * float(np.percentile(x, q))  # noqa: E731
  return {"single_p50_ms": pct(single, 50), "single_p95_ms": pct(single, 95),
          "iris_p50_ms": pct(iris, 50), "iris_p95_ms": pct(iris, 95)}


def bench_conversation(data: Path) -> dict:
  """Streaming ingestion of the first LoCoMo conversation and latencies over its questions."""
  from rmmjax.data.locomo import load_locomo  # noqa: PLC0415  (only with --data)
  from rmmjax.encode.cache import EmbeddingCache  # noqa: PLC0415
  from rmmjax.encode.encoder import DEFAULT_CACHE, SentenceEncoder  # noqa: PLC0415
  conv = load_locomo(data)[0][0]
  encoder = SentenceEncoder(cache=EmbeddingCache(DEFAULT_CACHE))
  LaceMem.from_conversation(conv, encoder)  # fills the embedding cache: time the layers only
  store = LaceMem(encoder)
  turns = [(t, s) for s in conv.sessions for t in s.turns]
  t0 = time.perf_counter()
  for turn, session in turns:
    store.add_turn(turn.turn_id, session.session_id, session.date, turn.speaker,
                   turn.text + (f" [shares an image: {turn.caption}]" if turn.caption else ""))
  seconds = time.perf_counter() - t0
  out = {"facts": len(store), "turns": len(turns), "stream_s": seconds,
         "turns_per_s": len(turns) / seconds, "edges": len(store.edges())}
  return out | _latencies(store, [q.question for q in conv.questions],
                          [q.category for q in conv.questions])


def bench_synthetic(num_facts: int, queries: int = 30) -> dict:
  t0 = time.perf_counter()
  store = synthetic_lace(num_facts)
  built = time.perf_counter() - t0
  store.query_encoder = _RandomQueries()  # the synthetic facts have no text model
  rng = np.random.default_rng(0)
  questions = [f"fact {i} of topic" for i in rng.integers(0, num_facts, queries)]
  return {"facts": num_facts, "build_s": built, "edges": len(store.edges()),
          "edges_per_fact": len(store.edges()) / num_facts} | _latencies(
              store, questions, [None] * queries)


def bench_iris(out: Path | None, data: Path | None = None, quick: bool = False) -> dict:
  result = {"conversation": bench_conversation(data) if data else None,
            "synthetic": [bench_synthetic(n, queries=10 if quick else 30)
                          for n in ((2_000, 10_000) if quick else (10_000, 100_000))]}
  conv = result["conversation"]
  if conv:
    print(f"LoCoMo conversation, streamed turn by turn: {conv['turns']} turns -> "
          f"{conv['facts']} facts, {conv['edges']} edges in {conv['stream_s']:.1f} s "
          f"({conv['turns_per_s']:.0f} turns/s, embedding cache warm)")
  print(f"{'store':>22s}{'edges/fact':>12s}{'single p50':>12s}{'p95':>8s}"
        f"{'IRIS p50':>10s}{'p95':>8s}{'IRIS/single p95':>17s}")
  rows = ([("LoCoMo conversation", conv)] if conv else []) + [
      (f"synthetic {r['facts']:,}", r) for r in result["synthetic"]]
  for name, r in rows:
    print(f"{name:>22s}{r['edges'] / r['facts']:12.1f}{r['single_p50_ms']:12.1f}"
          f"{r['single_p95_ms']:8.1f}{r['iris_p50_ms']:10.1f}{r['iris_p95_ms']:8.1f}"
          f"{r['iris_p95_ms'] / r['single_p95_ms']:17.1f}x")
  write_result(result, out)
  return result
