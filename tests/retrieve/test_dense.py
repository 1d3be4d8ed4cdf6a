"""Dense search: the best rows by inner product, as numpy's sort finds them, whatever the bank's
size; banks of nearby sizes share one compiled program."""

from __future__ import annotations

import logging

import jax
import numpy as np
import pytest

from rmmjax.retrieve import dense


def _naive(q_QxD, bank_NxD, k):
  return np.argsort(-(q_QxD @ bank_NxD.T), axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize("n, k", [(1, 1), (7, 3), (7, 7), (256, 20), (257, 257), (700, 50),
                                  (700, 700)])
def test_search_finds_the_best_rows_as_a_full_sort_does(n, k):
  rng = np.random.default_rng(n + k)
  q, bank = rng.normal(size=(70, 16)), rng.normal(size=(n, 16))  # 70: two query chunks
  np.testing.assert_array_equal(dense.search(q, bank, k), _naive(q, bank, k))


def test_banks_of_nearby_sizes_share_one_compiled_program(caplog):
  rng = np.random.default_rng(0)
  q = rng.normal(size=(5, 16))
  dense.search(q, rng.normal(size=(300, 16)), 300)  # (compiled here, if not before)
  with jax.log_compiles(True), caplog.at_level(logging.WARNING):
    for n in (301, 420, 511):  # whole rankings of every row, as the hybrid retriever asks
      bank = rng.normal(size=(n, 16))
      np.testing.assert_array_equal(dense.search(q, bank, n), _naive(q, bank, n))
  assert not [r.getMessage() for r in caplog.records if "Compiling" in r.getMessage()]
