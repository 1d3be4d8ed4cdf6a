"""Reciprocal-rank fusion credits BM25 only with texts that share a term with the query: against
a naive formula, and on every path that fuses (the retriever factory, the bank's search,
LaceMem)."""

from __future__ import annotations

import numpy as np
import pytest

from rmmjax.memory import MemoryBank, NewMemory
from rmmjax.memory.lace import LaceMem, LaceSettings
from rmmjax.memory.search import UserIndex
from rmmjax.retrieve.bm25 import BM25Retriever
from rmmjax.retrieve.fusion import RRF_C, rrf_scores, rrf_top
from rmmjax.retrieve.rankers import make_retriever


class FlatEncoder:
  """Every text the same direction: dense search can tell nothing apart (ties: row order)."""

  dim = 8
  identity = "flat (8)"

  def encode(self, texts):
    out = np.zeros((len(texts), self.dim), np.float32)
    out[:, 0] = 1.0
    return out


def _naive(rankings, n):
  fused = {}
  for ranking in rankings:
    for position, row in enumerate(ranking, start=1):
      fused[int(row)] = fused.get(int(row), 0.0) + 1.0 / (RRF_C + position)
  return fused


def test_rrf_matches_the_naive_sum_over_the_rankers_that_matched():
  rng = np.random.default_rng(0)
  for _ in range(20):
    n = int(rng.integers(5, 60))
    rankings = [rng.permutation(n)[:rng.integers(0, n + 1)] for _ in range(rng.integers(1, 4))]
    naive = _naive(rankings, n)
    want = sorted(naive, key=lambda r: (-naive[r], r))
    assert rrf_top(rankings, n).tolist() == want
    assert rrf_top(rankings, 3).tolist() == want[:3]
    scores = rrf_scores(rankings, n)
    assert scores.tolist() == pytest.approx([naive.get(r, 0.0) for r in range(n)])


TEXTS = [f"note {i} about the weather and the garden" for i in range(300)]
TEXTS[150] = "the zebra at the zoo"


def test_bm25_matched_is_only_what_shares_a_term():
  bm25 = BM25Retriever(TEXTS)
  (only,) = bm25.matched(["where is the zebra?"], 10)
  assert only.tolist() == [150]
  (garden,) = bm25.matched(["garden"], 500)
  assert sorted(garden.tolist()) == [i for i in range(300) if i != 150]
  assert bm25.matched(["the of and"], 5)[0].tolist() == []  # stopwords only: nothing matched


def test_fusion_ranks_the_only_matching_text_first():
  # Before, BM25's texts of score 0 counted in corpus order: rows 0-3 came before the zebra.
  order = make_retriever("hybrid", TEXTS, FlatEncoder()).rank(["where is the zebra?"], 5)[0]
  assert order[0] == 150 and order[1:].tolist() == [0, 1, 2, 3]


def test_the_banks_search_and_lacemem_fuse_the_same_way(tmp_path):
  encoder = FlatEncoder()
  with MemoryBank(tmp_path / "bank.sqlite") as bank:
    bank.add_user("u")
    bank.start_session("u", "s", "2024-01-01")
    bank.add_turns("u", "s", [(f"t{i}", "u", text) for i, text in enumerate(TEXTS)])
    vectors = encoder.encode(TEXTS)
    bank.apply_reflection("u", "s", [NewMemory(t, [f"t{i}"], v) for i, (t, v) in
                                     enumerate(zip(TEXTS, vectors))], [], encoder.identity)
    memories = tuple(bank.memories("u"))
  index = UserIndex(memories, vectors, BM25Retriever([m.summary for m in memories]), 0)
  assert index.rank("where is the zebra?", vectors[0], "hybrid", 5)[0] == 150
  lace = LaceMem(encoder, settings=LaceSettings(retrieval="hybrid"))
  for i, text in enumerate(TEXTS):
    lace.add_turn(f"t{i}", "s", "2024-01-01", "Ann", text)
  hits = lace.search("where is the zebra?", 5)
  assert lace.fact(hits[0][0]).turn_id == "t150"
