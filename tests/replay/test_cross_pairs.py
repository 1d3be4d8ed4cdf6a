"""The cross reranker's pair tokens: BERT's pair template, truncation counted and never an
error, an empty memory a pair of its own, missing candidates without tokens, one padded length;
and the pretraining subset of candidates."""

import numpy as np
import pytest

from rmmjax import core
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.replay.cross_pairs import PAIR_BUCKETS, bucket, candidate_subset, pair_tokens


@pytest.fixture(scope="module")
def tokenizer():
  return SentenceEncoder().tokenizer


def test_pairs_follow_the_template_and_long_ones_are_cut_and_counted(tokenizer):
  long_text = " ".join(["lighthouse"] * 300)
  out = pair_tokens(tokenizer, ["when did she paint it?", "who?"],
                    [["she painted a sunrise last Saturday", "", long_text], [None, "Mel", None]],
                    max_length=64)
  assert out.ids_NxKxL.shape == (2, 3, 64)
  assert out.pairs == 4 and out.truncated == 1
  # An independent encoding of the same pair by the tokenizer itself.
  want = tokenizer.encode("when did she paint it?", "she painted a sunrise last Saturday").ids
  want = [i for i in want if i != 0]
  np.testing.assert_array_equal(out.ids_NxKxL[0, 0, :len(want)], want)
  assert out.mask_NxKxL[0, 0].sum() == len(want)
  assert list(out.ids_NxKxL[0, 1][out.mask_NxKxL[0, 1]][-2:]) == [102, 102]  # empty memory
  assert out.mask_NxKxL[0, 2].sum() == 64  # cut to the window, still a pair
  assert not out.mask_NxKxL[1, 0].any() and not out.mask_NxKxL[1, 2].any()  # missing ones


def test_lengths_pad_to_buckets_within_the_window():
  assert bucket(20, 128) == PAIR_BUCKETS[0]
  assert bucket(50, 128) == 64
  assert bucket(200, 128) == 128


def test_a_subset_keeps_relevant_candidates_first_and_their_positions():
  rng = np.random.default_rng(0)
  n, k = 40, 10
  mask = np.ones((n, k), bool)
  mask[0, 7:] = False  # a question with 7 candidates
  relevant = (rng.random((n, k)) < 0.3) & mask
  relevant[:, 3] = True
  batch = core.Batch(q_BxD=np.zeros((n, 4), np.float32), mem_BxKxD=np.zeros((n, k, 4),
                                                                           np.float32),
                     mask_BxK=mask, relevant_BxK=relevant, num_relevant_B=relevant.sum(1),
                     evidence_BxKxE=relevant[..., None],
                     tokens_BxKxL=np.arange(n * k * 3).reshape(n, k, 3),
                     token_mask_BxKxL=np.ones((n, k, 3), bool))
  sub = candidate_subset(batch, 4, seed=1)
  pos = sub.positions_BxK
  assert pos.shape == (n, 4)
  assert (np.diff(pos, axis=1) > 0).all()  # base order kept, no repeats
  rows = np.arange(n)[:, None]
  np.testing.assert_array_equal(sub.relevant_BxK, relevant[rows, pos])
  np.testing.assert_array_equal(sub.tokens_BxKxL, batch.tokens_BxKxL[rows, pos])
  assert (sub.relevant_BxK.sum(1) >= 1).all() and (sub.relevant_BxK.sum(1) <= 2).all()
  assert sub.mask_BxK.all()  # every question has >= 4 existing candidates
  assert (pos[0] < 7).all()
  # Another seed draws other negatives.
  assert not np.array_equal(candidate_subset(batch, 4, seed=2).positions_BxK, pos)
  with pytest.raises(ValueError, match="expected 2 to k=10"):
    candidate_subset(batch, 11, seed=0)
