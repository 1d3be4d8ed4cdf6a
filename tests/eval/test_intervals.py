"""The one interval of every results table: a paired bootstrap over what shares a fitted model,
checked against distributions enumerated by hand."""

import itertools

import numpy as np
import pytest

from rmmjax.eval.intervals import MIN_FOLDS, paired_interval


def test_two_clusters_give_the_percentiles_of_the_four_draws():
  # Conversations a (0.1) and b (0.3), 2 folds: draws (a, a), (a, b), (b, a), (b, b).
  interval = paired_interval(np.array([0.1, 0.1, 0.3, 0.3]), list("aabb"), [0, 0, 1, 1])
  assert interval.mean == pytest.approx(0.2)
  assert (interval.low, interval.high) == pytest.approx((0.1, 0.3))
  assert interval.over == "conversations, indicative"
  assert str(interval) == "+0.200 [+0.100, +0.300] (conversations, indicative)"


def test_with_enough_folds_the_folds_are_resampled_not_the_conversations():
  rng = np.random.default_rng(1)
  folds_Q = np.repeat(np.arange(MIN_FOLDS), 6)
  diff_Q = rng.normal(size=folds_Q.size)
  # Two ways of cutting each fold into conversations: the same interval, as only folds count.
  by_three = paired_interval(diff_Q, [f"{f}-{i % 3}" for i, f in enumerate(folds_Q)], folds_Q)
  by_two = paired_interval(diff_Q, [f"{f}-{i % 2}" for i, f in enumerate(folds_Q)], folds_Q)
  assert by_three == by_two and by_three.over == "folds"
  # The draws' means are means of MIN_FOLDS folds drawn with replacement (equal sizes): the
  # interval lies within the enumerated distribution's 1st and 99th percentiles.
  fold_means = [diff_Q[folds_Q == f].mean() for f in range(MIN_FOLDS)]
  exact = [np.mean(d) for d in itertools.product(fold_means, repeat=MIN_FOLDS)]
  assert np.percentile(exact, 1) <= by_three.low <= np.percentile(exact, 5)
  assert np.percentile(exact, 95) <= by_three.high <= np.percentile(exact, 99)


def test_fewer_folds_resample_conversations_and_say_it_is_indicative():
  diff_Q = np.array([0.0, 1.0, 0.5, 0.2])
  interval = paired_interval(diff_Q, list("abcd"), [0, 0, 1, 1])
  assert interval.over == "conversations, indicative"
  # Each conversation its own cluster: the same as one question per conversation.
  assert interval == paired_interval(diff_Q, list("wxyz"), [0, 0, 1, 1])


def test_seeds_are_resampled_within_each_drawn_cluster():
  folds_Q = np.repeat(np.arange(4), 3)
  conversations = [str(f) for f in folds_Q]
  same = np.tile(np.linspace(-0.2, 0.4, 12), (3, 1))
  # Identical seeds: the interval of one of them.
  assert tuple(paired_interval(same, conversations, folds_Q)) == tuple(
      paired_interval(same[0], conversations, folds_Q))
  assert paired_interval(same, conversations, folds_Q).over == "folds x seeds"
  # Seeds that disagree everywhere (+1 and -1) average to zero on every question: without the
  # seeds' variance the interval would be the point 0; with it, it is wide.
  opposed = np.stack([np.ones(12), -np.ones(12)])
  interval = paired_interval(opposed, conversations, folds_Q)
  assert interval.mean == 0.0 and interval.low < -0.4 and interval.high > 0.4
  assert paired_interval(opposed.mean(0), conversations, folds_Q).low == 0.0
