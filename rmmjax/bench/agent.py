"""`rmmjax bench agent`: how fast memories go in and answers' contexts come out. The method:
docs/benchmarks.md, "Memory and agent benchmarks"."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from rmmjax.agent import Agent, AgentSettings, IrisAgent
from rmmjax.bench.core import percentiles_ms, timed, write_result
from rmmjax.memory import MemoryBank, NewMemory
from rmmjax.memory.lace import synthetic_lace
from rmmjax.memory.search import FUSION_DEPTH

WORDS = ("garden guitar marathon bakery hospital cello lisbon oslo motorcycle painting poetry "
         "camping pottery adoption support group career counseling museum beach violin dinosaur "
         "sunset horse family book recipe travel concert school puppy").split()


class _RandomEncoder:
  """Queries as random unit vectors of the bank's dimension (the encoder is not measured here)."""

  dim = 384
  identity = "random bench vectors"

  def __init__(self, seed: int = 0):
    self._rng = np.random.default_rng(seed)

  def encode(self, texts):
    x = self._rng.standard_normal((len(texts), self.dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _synthetic_bank(path: Path, n: int, encoder) -> MemoryBank:
  rng = np.random.default_rng(n)
  bank = MemoryBank(path)
  bank.add_user("u")
  chunk = 5_000
  for start in range(0, n, chunk):
    session = f"s{start // chunk}"
    texts = [" ".join(rng.choice(WORDS, 12)) for _ in range(min(chunk, n - start))]
    bank.start_session("u", session, "2024-01-01")
    bank.add_turns("u", session, [(f"t{start + i}", "u", t) for i, t in enumerate(texts)])
    emb = encoder.encode(texts)
    bank.apply_reflection("u", session, [NewMemory(t, [f"t{start + i}"], e) for i, (t, e) in
                                         enumerate(zip(texts, emb))], [], encoder.identity)
  return bank


def bench_respond(sizes, queries: int, query_encoder) -> list[dict]:
  """Per bank size, each path's p50/p95 on the same queries, interleaved (this machine is
  shared: a slow spell hits every path)."""
  rows = []
  encoder = _RandomEncoder()
  for n in sizes:
    with tempfile.TemporaryDirectory() as folder:
      started = time.perf_counter()
      bank = _synthetic_bank(Path(folder) / "bank.sqlite", n, encoder)
      built = time.perf_counter() - started
      settings = AgentSettings(k=20, m=5, learn=False)
      agent = Agent(bank, encoder, settings)
      embedding = Agent(bank, encoder, settings, query_encoder=query_encoder)
      started = time.perf_counter()
      index = agent.search.index("u")
      indexed = time.perf_counter() - started
      rng = np.random.default_rng(1)
      texts = [" ".join(rng.choice(WORDS, 6)) for _ in range(queries)]
      vectors = encoder.encode(texts)
      paths = {"respond": lambda text, q: agent.recall("u", text),
               "dense": lambda text, q: index._dense(q, FUSION_DEPTH),
               "bm25": lambda text, q: index.bm25.matched([text], FUSION_DEPTH),
               "respond_embedded": lambda text, q: embedding.recall("u", text)}
      for text, q in zip(texts, vectors):  # every path compiled and warm (each query's shape)
        for run in paths.values():
          run(text, q)
      times = {name: [] for name in paths}
      for text, q in zip(texts, vectors):
        for name, run in paths.items():
          times[name].append(timed(lambda run=run, text=text, q=q: run(text, q)))
      bank.close()
    rows.append({"memories": n, "bank_build_s": built, "index_build_s": indexed,
                 "queries": queries}
                | percentiles_ms({"respond": times["respond"], "dense_top200": times["dense"]})
                | percentiles_ms({"bm25": times["bm25"]}, (50,))
                | {"respond_over_dense_p50": float(np.median(times["respond"])
                                                   / np.median(times["dense"]))}
                | percentiles_ms({"respond_embedded": times["respond_embedded"]}))
  return rows


def bench_statements(encoder, num_facts: int = 10_000, statements: int = 30) -> dict:
  """`chat --iris` over a LaceMem of num_facts facts: a statement's p50/p95, and IRIS's after."""
  lace = synthetic_lace(num_facts)
  rng = np.random.default_rng(2)
  told = [f"I went to the {a} with my {b} and we talked about {c}"
          for a, b, c in rng.choice(WORDS, (2 * statements, 3))]
  asked = [f"when did I talk about {w}" for w in rng.choice(WORDS, 2 * statements)]
  with tempfile.TemporaryDirectory() as folder, MemoryBank(Path(folder) / "b.sqlite") as bank:
    bank.add_user("u")
    # The bank holds the LaceMem's turns, so the agent's sync finds it complete.
    sessions: dict[str, list] = {}
    for turn in lace.turns:
      sessions.setdefault(turn.session_id, []).append(turn)
    for session, turns in sessions.items():
      bank.start_session("u", session, turns[0].date)
      bank.add_turns("u", session, [(t.turn_id, t.speaker, t.text) for t in turns])
    lace.save(bank, "u")
    agent = IrisAgent(bank, encoder, m=5, progress=False)
    agent.store("u")
    for text, question in zip(told[:statements], asked[:statements]):  # compiled and warm
      agent.tell("u", text)
      agent.recall("u", question)
    tell, respond = [], []
    for text, question in zip(told[statements:], asked[statements:]):
      tell.append(timed(lambda text=text: agent.tell("u", text)))
      respond.append(timed(lambda question=question: agent.recall("u", question)))
    facts = len(agent.store("u"))
  return {"facts": facts, "statements": statements} | percentiles_ms(
      {"statement": tell, "iris_respond": respond})


def bench_ingest(data: Path | None, conversations: int = 1) -> dict | None:
  """Turns/s of offline Prospective Reflection over LoCoMo sessions (warm embedding cache)."""
  if data is None:
    return None
  from rmmjax.data.locomo import load_locomo  # noqa: PLC0415  (only with --data)
  from rmmjax.encode.cache import EmbeddingCache, cache_path  # noqa: PLC0415
  from rmmjax.encode.encoder import SentenceEncoder  # noqa: PLC0415
  from rmmjax.memory.ingest import ingest_conversations  # noqa: PLC0415
  from rmmjax.memory.topics import OfflineReflector  # noqa: PLC0415
  convs = load_locomo(data)[0][:conversations]
  cached = SentenceEncoder(cache=EmbeddingCache(cache_path()))
  out = {"conversations": len(convs)}
  # Without a cache every turn and summary is embedded (the real cost of new sessions); with a
  # warm one only segmentation, reflection and the bank's writes remain.
  for name, encoder in (("embedding", cached.with_cache(None)), ("cached", cached),
                        ("cached_again", cached)):
    with tempfile.TemporaryDirectory() as folder, MemoryBank(Path(folder) / "b.sqlite") as bank:
      counts = ingest_conversations(bank, convs, OfflineReflector(encoder), encoder,
                                    user_per_conversation=True)
    out |= {"turns": counts["turns"], f"{name}_s": counts["seconds"],
            f"{name}_turns_per_s": counts["turns"] / counts["seconds"]}
  return out


def bench_respond_cross(encoder, memories: int = 2_000, queries: int = 30) -> dict:
  """The respond path's p50/p95 with a cross reranker at K = 20 (untrained weights: the cost
  does not depend on them) beside the linear reranker, over a bank embedded by `encoder`."""
  from rmmjax import core  # noqa: PLC0415
  from rmmjax.encode.protocol import tokenizer_identity  # noqa: PLC0415
  from rmmjax.learners.loaded import LoadedReranker  # noqa: PLC0415
  from rmmjax.learners.cross.model import CrossModel  # noqa: PLC0415
  from rmmjax.learners.cross.task import cross_initial_params  # noqa: PLC0415
  settings = AgentSettings(k=20, m=5, learn=False)
  spec = core.CoreSpec(variant="cross", dim=encoder.dim, k=20, m=5, batch=4,
                       model=CrossModel(encoder.cfg))
  record = {"units": "topic", "retriever": settings.retriever, "encoder": encoder.identity,
            "dim": encoder.dim, "k": 20, "query_encoder": None,
            "cross": {"tokenizer": tokenizer_identity(encoder), "max_length": 128}}
  cross = LoadedReranker("bench", cross_initial_params(encoder, 20, 1.0), spec,
                         core.HParams.create(), record)
  with tempfile.TemporaryDirectory() as folder:
    bank = _synthetic_bank(Path(folder) / "bank.sqlite", memories, encoder)
    agents = {"linear": Agent(bank, encoder, settings),
              "cross": Agent(bank, encoder, settings, reranker=cross)}
    rng = np.random.default_rng(2)
    texts = [" ".join(rng.choice(WORDS, 6)) for _ in range(queries)]
    for agent in agents.values():
      agent.recall("u", texts[0])  # compiled
    times = {name: [] for name in agents}
    for text in texts:
      for name, agent in agents.items():
        times[name].append(timed(lambda agent=agent, text=text: agent.recall("u", text)))
    bank.close()
  return {"memories": memories, "queries": queries, "pair_length": 128} | percentiles_ms(times)


def bench_agent(out: Path | None, data: Path | None = None, quick: bool = False,
                large: bool = False) -> dict:
  from rmmjax.encode.encoder import SentenceEncoder  # noqa: PLC0415  (loads the weights)
  minilm = SentenceEncoder(cache=None)  # queries are never cached: each is embedded afresh
  sizes = (2_000, 10_000) if quick else (10_000, 100_000) + ((1_000_000,) if large else ())
  respond = bench_respond(sizes, queries=20 if quick else 100, query_encoder=minilm)
  statements = bench_statements(minilm, 2_000 if quick else 10_000, 10 if quick else 30)
  ingest = bench_ingest(data, conversations=1)
  cross = bench_respond_cross(minilm, 500 if quick else 2_000, 10 if quick else 30)
  result = {"respond": respond, "statements": statements, "ingest": ingest,
            "respond_cross": cross}
  print("respond without the LLM (hybrid retrieval from the bank, rerank K=20, top M=5): with "
        "the query embedded by MiniLM as chat does, and with a random query vector (retrieval "
        "alone), beside its floor: dense top-200 alone")
  print(f"{'memories':>10s}{'MiniLM p50':>12s}{'p95':>7s}{'retrieval p50':>15s}{'p95':>7s}"
        f"{'dense p50':>11s}{'dense p95':>11s}{'BM25 p50':>10s}{'retrieval/dense':>17s}"
        f"{'index s':>9s}")
  for r in respond:
    print(f"{r['memories']:10d}{r['respond_embedded_p50_ms']:12.1f}"
          f"{r['respond_embedded_p95_ms']:7.1f}{r['respond_p50_ms']:15.1f}"
          f"{r['respond_p95_ms']:7.1f}{r['dense_top200_p50_ms']:11.2f}"
          f"{r['dense_top200_p95_ms']:11.2f}{r['bm25_p50_ms']:10.2f}"
          f"{r['respond_over_dense_p50']:17.1f}{r['index_build_s']:9.1f}")
  st = statements
  print(f"\nchat --iris over a LaceMem of {st['facts']:,} facts: a statement (/tell: recorded, "
        f"embedded, linked, saved) p50 {st['statement_p50_ms']:.1f} ms, p95 "
        f"{st['statement_p95_ms']:.1f} ms; IRIS's respond path after it p50 "
        f"{st['iris_respond_p50_ms']:.1f} ms, p95 {st['iris_respond_p95_ms']:.1f} ms")
  print(f"\nrespond with a cross reranker at K = 20 ({cross['memories']:,} memories, pairs "
        f"padded to {cross['pair_length']} tokens): p50 {cross['cross_p50_ms']:.0f} ms, p95 "
        f"{cross['cross_p95_ms']:.0f} ms; with the linear reranker p50 "
        f"{cross['linear_p50_ms']:.1f} ms, p95 {cross['linear_p95_ms']:.1f} ms")
  if ingest:
    print(f"\ningest, offline reflection, {ingest['turns']} LoCoMo turns: "
          f"{ingest['embedding_turns_per_s']:.0f} turns/s embedding every turn and summary, "
          f"{ingest['cached_again_turns_per_s']:.0f} turns/s with the embeddings cached")
  write_result(result, out)
  return result
