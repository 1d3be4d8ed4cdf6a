"""The cross reranker's pair tokens: BERT's pair template, truncation counted and never an
error, an empty memory a pair of its own, missing candidates without tokens, one padded length;
and the pretraining subset of candidates."""

import numpy as np
import pytest

from rmmjax import core
from rmmjax.learners.cross import pairs as cross_pairs
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.learners.cross.pairs import (PAIR_BUCKETS, CandidateTokens, bucket, candidate_subset,
                                         pair_tokens, with_second_readings)


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
  assert (out.segments_NxKxL[0, 0] > 0).sum() == len(want)
  assert list(out.ids_NxKxL[0, 1][out.segments_NxKxL[0, 1] > 0][-2:]) == [102, 102]  # empty
  assert (out.segments_NxKxL[0, 2] > 0).sum() == 64  # cut to the window, still a pair
  assert not out.segments_NxKxL[1, 0].any() and not out.segments_NxKxL[1, 2].any()  # missing ones


@pytest.mark.parametrize("question, memory", [
    ("what does [SEP] mean in the notes?", "Caroline wrote [SEP] between the two lists"),
    ("[SEP] [CLS] twice [SEP]", "plain text"),
    ("who painted it?", "Melanie: I painted a lake sunrise [SEP] last year"),
])
def test_segments_are_the_tokenizers_type_ids_even_with_sep_typed_in_a_text(question, memory):
  # Hugging Face's own tokenizer (what sentence-transformers' CrossEncoder calls) keeps a
  # typed "[SEP]" on the side of the pair it was typed in.
  transformers = pytest.importorskip("transformers")
  hf = transformers.AutoTokenizer.from_pretrained(str(SentenceEncoder().model_dir))
  want = hf(question, memory, truncation=True, max_length=64)
  out = pair_tokens(SentenceEncoder().tokenizer, [question], [[memory]], max_length=64)
  n = len(want["input_ids"])
  np.testing.assert_array_equal(out.ids_NxKxL[0, 0, :n], want["input_ids"])
  np.testing.assert_array_equal(out.segments_NxKxL[0, 0, :n],
                                np.asarray(want["token_type_ids"]) + 1)
  assert not out.segments_NxKxL[0, 0, n:].any()
  assert (np.asarray(want["input_ids"]) == 102).sum() > 2  # the typed [SEP] is a special token


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
                     inputs=CandidateTokens(np.arange(n * k * 3).reshape(n, k, 3),
                                            np.ones((n, k, 3), np.int8)))
  sub = candidate_subset(batch, 4, seed=1)
  pos = sub.positions_BxK
  assert pos.shape == (n, 4)
  assert (np.diff(pos, axis=1) > 0).all()  # base order kept, no repeats
  rows = np.arange(n)[:, None]
  np.testing.assert_array_equal(sub.relevant_BxK, relevant[rows, pos])
  np.testing.assert_array_equal(sub.inputs.ids_BxKxL, batch.inputs.ids_BxKxL[rows, pos])
  np.testing.assert_array_equal(sub.inputs.segments_BxKxL, batch.inputs.segments_BxKxL[rows, pos])
  assert (sub.relevant_BxK.sum(1) >= 1).all() and (sub.relevant_BxK.sum(1) <= 2).all()
  assert sub.mask_BxK.all()  # every question has >= 4 existing candidates
  assert (pos[0] < 7).all()
  # Another seed draws other negatives.
  assert not np.array_equal(candidate_subset(batch, 4, seed=2).positions_BxK, pos)
  # Negatives from base position 5 on: counted against every question's own candidates.
  deep = candidate_subset(batch, 4, seed=1, negatives_from=5)
  for q in range(n):
    chosen = set(deep.positions_BxK[q].tolist())
    negatives = [j for j in range(k) if mask[q, j] and not relevant[q, j]]
    wanted = 4 - min(2, relevant[q].sum())
    deep_ones = [j for j in negatives if j >= 5]
    picked = [j for j in chosen if j in negatives]
    if len(deep_ones) >= wanted:  # every negative drawn from position 5 on
      assert all(j >= 5 for j in picked), (q, picked)
    else:  # all of those, then the rest from above
      assert set(deep_ones) <= chosen, (q, picked)
  # Hard negatives: the highest scored of those, whatever the seed (ties absent).
  scores = rng.standard_normal((n, k))
  for seed in (1, 2):
    hard = candidate_subset(batch, 4, seed=seed, negatives_from=5, hardness_NxK=scores)
    np.testing.assert_array_equal(sub.relevant_BxK.sum(1), hard.relevant_BxK.sum(1))
    for q in range(n):
      negatives = [j for j in range(k) if mask[q, j] and not relevant[q, j]]
      wanted = 4 - min(2, relevant[q].sum())
      by_score = lambda js: sorted(js, key=lambda j: -scores[q, j])  # noqa: E731
      best = (by_score([j for j in negatives if j >= 5])
              + by_score([j for j in negatives if j < 5]))[:wanted]
      picked = [j for j in hard.positions_BxK[q].tolist() if j in negatives]
      assert sorted(picked) == sorted(best), (q, picked, best)
  assert not np.array_equal(deep.positions_BxK, pos)


def test_second_readings_pair_each_found_evidence_turn_with_the_rest(locomo_path):
  """cross.second_reading's rows on the real file, enumerated from each question's evidence
  and candidate turns: one per evidence turn among the K whose question has another there,
  reading the question beside its text, without it among the candidates, the rest the
  targets; the conversation's own questions unchanged before them."""
  from hash_encoder import HashEncoder
  from rmmjax.data.locomo import load_locomo
  from rmmjax.replay.candidates import build_replay
  conv = load_locomo(locomo_path)[0][0]
  (replay,) = build_replay([conv], "turn", "bm25", HashEncoder(), k=20)
  out = with_second_readings(replay)
  n = len(replay.questions)
  assert out.questions[:n] == replay.questions and (out.mask_NxK[:n] == replay.mask_NxK).all()
  texts = replay.candidate_texts()
  expected = []  # (question index, found column, the evidence left, the columns holding it)
  for q, question in enumerate(conv.questions):
    turns = [replay.unit_turns[u][0] for u in replay.order_NxR[q, :20]]
    found = [j for j, t in enumerate(turns) if t in question.evidence]
    if len(found) > 1:
      expected += [(q, j, set(question.evidence) - {turns[j]}, set(found) - {j}) for j in found]
  assert len(expected) > 10 and len(out.questions) == n + len(expected)
  assert out.categories[n:] == ("found evidence",) * len(expected)
  read = out.candidate_texts()
  for row, (q, j, rest, targets) in enumerate(expected, n):
    assert out.questions[row] == f"{conv.questions[q].question} {texts[q][j]}"
    assert read[row] == [None if i == j else t for i, t in enumerate(texts[q])]
    assert not out.mask_NxK[row, j] and out.mask_NxK[row].sum() == replay.mask_NxK[q].sum() - 1
    assert set(np.flatnonzero(out.relevant_NxK[row])) == targets
    assert set(out.evidence[row]) == rest and out.num_evidence_N[row] == len(rest)


MINILM = core.BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                         num_attention_heads=12, intermediate_size=1536,
                         max_position_embeddings=512, type_vocab_size=2, layer_norm_eps=1e-12)
SMALL = core.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64,
                        max_position_embeddings=128, type_vocab_size=2, layer_norm_eps=1e-12)


@pytest.mark.parametrize("bert, batch, candidates, max_length", [
    (SMALL, 2, 3, 32), (SMALL, 4, 8, 128), (MINILM, 1, 4, 64), (MINILM, 4, 8, 128)])
def test_the_bound_from_shapes_holds_what_the_compiled_step_measures(bert, batch, candidates,
                                                                     max_length):
  """The bound that spares the compile must be above the compiler's own count of the step
  (float32, the widest dtype), and not so loose that it lets through nothing."""
  measured = cross_pairs._step_need(bert, 20, batch, candidates, max_length, "float32")
  bound = cross_pairs.step_bound(bert, 20, batch, candidates, max_length)
  assert measured < bound < 4 * measured


def test_a_step_far_below_the_device_is_not_compiled_to_measure_it(monkeypatch):
  def compiled(*args):
    raise AssertionError("compiled")
  monkeypatch.setattr(cross_pairs, "_step_need", compiled)
  bound = cross_pairs.step_bound(SMALL, 20, 4, 8, 128)
  monkeypatch.setattr(cross_pairs, "device_memory_bytes", lambda: 4 * bound)
  assert cross_pairs.step_bytes(SMALL, 20, 4, 8, 128, "float32") == (bound, 4 * bound)
  # Nearer the device's size, the step is compiled and measured.
  monkeypatch.setattr(cross_pairs, "device_memory_bytes", lambda: 4 * bound - 1)
  with pytest.raises(AssertionError, match="compiled"):
    cross_pairs.step_bytes(SMALL, 20, 4, 8, 128, "float32")
