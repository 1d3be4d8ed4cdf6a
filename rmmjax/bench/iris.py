"""`rmmjax bench iris`: LaceMem's streaming ingestion and IRIS's retrieval latency against
single-pass retrieval. The method: docs/benchmarks.md, "Memory and agent benchmarks"."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import numpy as np

from rmmjax.bench.core import percentiles_ms, timed, write_result
from rmmjax.memory.ingest import bank_text
from rmmjax.memory.lace import LaceMem, synthetic_lace
from rmmjax.retrieve.iris import IrisSettings, iris_retrieve
from rmmjax.retrieve.judges import HeuristicJudge


class _RandomQueries:
  """Queries as random unit vectors (the encoder's cost is `bench encode`'s, not measured)."""

  dim = 384
  identity = "random bench vectors"

  def encode(self, texts):
    # Drawn from the text's hash, so a query asked again (its timed run after the warm-up)
    # gets the same vector and IRIS takes the same path, asking the same refined queries.
    x = np.stack([np.random.default_rng(int.from_bytes(
        hashlib.sha256(t.encode("utf-8")).digest()[:8], "little")).standard_normal(self.dim)
                  for t in texts]).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _latencies(store, questions, categories) -> dict:
  def run_iris(question, category):
    return iris_retrieve(store, question, category=category, judge=HeuristicJudge(),
                         settings=IrisSettings())

  # Every timed query once untimed first, so none pays a one-time cost (an index build, a
  # compile, a first embedding). The judge, the refiner and the query vectors are
  # deterministic, so the timed runs ask exactly these texts.
  warmed = []
  for question, category in zip(questions, categories):
    store.search(question, 100)
    warmed.append([t.query for t in run_iris(question, category).trace])
  single, iris, asked = [], [], []
  for question, category in zip(questions, categories):
    single.append(timed(lambda question=question: store.search(question, 100)))
    result = run_iris(question, category)
    iris.append(result.retrieval_s)
    asked.append([t.query for t in result.trace])
  if asked != warmed:  # a query the warm-up missed could have paid a compile inside the timing
    raise RuntimeError("IRIS asked other refined queries when timed than in its warm-up run")
  return percentiles_ms({"single": single, "iris": iris})


def bench_conversation(data: Path) -> dict:
  """Streaming ingestion of the first LoCoMo conversation and latencies over its questions."""
  from rmmjax.data.locomo import load_locomo  # noqa: PLC0415  (only with --data)
  from rmmjax.encode.cache import EmbeddingCache, cache_path  # noqa: PLC0415
  from rmmjax.encode.encoder import SentenceEncoder  # noqa: PLC0415
  conv = load_locomo(data)[0][0]
  encoder = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  LaceMem.from_conversation(conv, encoder)  # fills the embedding cache: time the layers only
  store = LaceMem(encoder)
  turns = [(t, s) for s in conv.sessions for t in s.turns]
  t0 = time.perf_counter()
  for turn, session in turns:
    store.add_turn(turn.turn_id, session.session_id, session.date, turn.speaker,
                   bank_text(turn))
  seconds = time.perf_counter() - t0
  return {"facts": len(store), "turns": len(turns), "stream_s": seconds,
          "turns_per_s": len(turns) / seconds, "edges": len(store.edges())} | _latencies(
              store, [q.question for q in conv.questions], [q.category for q in conv.questions])


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
