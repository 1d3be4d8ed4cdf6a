"""The cross reranker's inputs (docs/command-line.md): each question paired with each of its K
candidates' text, tokenised once on the host and padded to one of a few lengths, so that a run
compiles once; packed several to a row for the encoder."""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Sequence
from typing import Any, final

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rmmjax.learners.cross.model import PackedPairs, cross_params_template, pair_logits
from rmmjax.encode.encoder import compiler_options

# Padded pair lengths: a run pads every pair to the first of these that holds its longest one.
PAIR_BUCKETS = (32, 48, 64, 96, 128, 192, 256, 384, 512)


class CandidateTokens(struct.PyTreeNode):
  """Pair tokens as the host keeps them, (..., B, K, L): a core.Batch's `inputs` until packed."""

  ids_BxKxL: Any
  segments_BxKxL: Any


@final
@dataclasses.dataclass(frozen=True)
class PairTokens:
  ids_NxKxL: np.ndarray  # int32, 0-padded
  # int8: each token's side of the pair by the tokenizer's type ids: 1 the question's ([CLS] and
  # its [SEP] included; a "[SEP]" typed in a question too), 2 the memory's, 0 padding.
  segments_NxKxL: np.ndarray
  truncated: int  # pairs cut to max_length
  pairs: int  # pairs tokenised (candidates that exist)

  def candidates(self) -> CandidateTokens:
    """The tokens as a batch's `inputs` (question n's candidates on axis 0)."""
    return CandidateTokens(self.ids_NxKxL, self.segments_NxKxL)

  def packed(self, serving: bool = False) -> PackedPairs:
    """These pairs packed into rows for the encoder (`pack`)."""
    return pack(self.ids_NxKxL, self.segments_NxKxL, self.ids_NxKxL.shape[-1],
                serving=serving)[0]


def pair_tokenizer(tokenizer, max_length: int):
  """A copy of a `tokenizers.Tokenizer` that encodes pairs cut to max_length, unpadded."""
  pairs = copy.deepcopy(tokenizer)
  pairs.no_padding()
  pairs.enable_truncation(max_length, strategy="longest_first")
  return pairs


def bucket(length: int, max_length: int) -> int:
  """The padded length of pairs whose longest has `length` tokens."""
  return next((b for b in PAIR_BUCKETS if b >= length and b <= max_length), max_length)


def pair_tokens(tokenizer, questions: Sequence[str], texts_NxK: Sequence[Sequence[str | None]],
                max_length: int, length: int | None = None) -> PairTokens:
  """The pairs of each question with its candidates' texts (None: no candidate), padded to
  `length` (default: the bucket of the longest pair), by a tokenizer with BERT's pair template."""
  k = max((len(row) for row in texts_NxK), default=0)
  flat = [(n, j) for n, row in enumerate(texts_NxK) for j, text in enumerate(row)
          if text is not None]
  texts = [(questions[n], texts_NxK[n][j]) for n, j in flat]
  encoded, whole = ((pair_tokenizer(tokenizer, max_length).encode_batch(texts),
                     pair_tokenizer(tokenizer, 10**6).encode_batch(texts)) if flat else ([], []))
  longest = max((len(e.ids) for e in encoded), default=1)
  length = length or bucket(longest, max_length)  # (pairs are cut to max_length, so they fit)
  ids = np.zeros((len(questions), k, length), np.int32)
  segments = np.zeros((len(questions), k, length), np.int8)
  for (n, j), e in zip(flat, encoded):
    ids[n, j, :len(e.ids)] = e.ids
    segments[n, j, :len(e.ids)] = np.asarray(e.type_ids, np.int8) + 1
  return PairTokens(ids, segments, sum(len(e.ids) > max_length for e in whole), len(flat))


def replay_pairs(tokenizer, convs, max_length: int, previous_turn: bool = False
                 ) -> list[PairTokens]:
  """The pair tokens of replayed conversations, padded alike so one program serves them all
  (`previous_turn`: each turn read with the one before it, `candidate_texts`)."""
  first = [pair_tokens(tokenizer, c.questions, c.candidate_texts(previous_turn), max_length)
           for c in convs]
  length = max((p.ids_NxKxL.shape[2] for p in first), default=PAIR_BUCKETS[0])
  pad = lambda x: np.pad(x, ((0, 0), (0, 0), (0, length - x.shape[2])))  # noqa: E731
  return [dataclasses.replace(p, ids_NxKxL=pad(p.ids_NxKxL), segments_NxKxL=pad(p.segments_NxKxL))
          for p in first]


def second_reading_query(question: str, found: str) -> str:
  """What the second reading reads as its question: the question followed by the text of a
  candidate already found (`with_second_readings`)."""
  return f"{question} {found}"


def with_second_readings(conv):
  """A replayed conversation (turn units) with one more question after its own for each
  (question, evidence candidate) whose question has other evidence among its K candidates:
  the question read beside that candidate's text (`second_reading_query`), the candidate
  itself no longer among its K, the rest of its evidence its targets. Training rows only: a
  reranker learns from them to find what completes what it has found (category "found
  evidence")."""
  k = conv.mask_NxK.shape[1]
  rows = [(n, j) for n in np.flatnonzero(conv.relevant_NxK.sum(-1) > 1)
          for j in np.flatnonzero(conv.relevant_NxK[n])]
  if not rows:
    return conv
  n_, j_ = (np.array(x) for x in zip(*rows))
  found_NxK = np.arange(k)[None, :] == j_[:, None]
  evidence = conv.evidence_NxKxE[n_] & ~conv.evidence_NxKxE[n_, j_][:, None, :]
  order = conv.order_NxR[n_].copy()
  order[np.arange(len(rows)), j_] = -1  # (its text is not paired: candidate_texts gives None)
  rest = [tuple(e for e in conv.evidence[n] if e not in conv.unit_turns[conv.order_NxR[n, j]])
          for n, j in rows]
  join = lambda old, new: np.concatenate([old, new])  # noqa: E731
  return dataclasses.replace(
      conv, questions=conv.questions + tuple(second_reading_query(
          conv.questions[n], conv.unit_texts[conv.order_NxR[n, j]]) for n, j in rows),
      categories=conv.categories + ("found evidence",) * len(rows),
      q_NxD=join(conv.q_NxD, conv.q_NxD[n_]), mem_NxKxD=join(conv.mem_NxKxD, conv.mem_NxKxD[n_]),
      mask_NxK=join(conv.mask_NxK, conv.mask_NxK[n_] & ~found_NxK),
      relevant_NxK=join(conv.relevant_NxK, evidence.any(-1)),
      evidence_NxKxE=join(conv.evidence_NxKxE, evidence),
      num_evidence_N=join(conv.num_evidence_N, np.array([len(e) for e in rest], np.int32)),
      num_relevant_N=join(conv.num_relevant_N, conv.num_relevant_N[n_] - 1),  # (one unit a turn)
      order_NxR=join(conv.order_NxR, order),
      evidence=conv.evidence + tuple(rest))


def candidate_subset(questions_N, n: int, seed: int, negatives_from: int = 0,
                     hardness_NxK: np.ndarray | None = None):
  """A pool of questions (a host `core.Batch`) with `n` of each one's K candidates, each keeping
  its base position (positions_BxK) and so its rank prior: a listwise loss over these costs n/K
  of one over all K, what makes pretraining on every labelled question affordable. With
  `hardness_NxK` (a trained reranker's scores) the irrelevant candidates are taken highest
  first rather than at random."""
  mask, relevant = np.asarray(questions_N.mask_BxK), np.asarray(questions_N.relevant_BxK)
  num, k = mask.shape  # (2 <= n <= k: the cross section's check)
  rng = np.random.default_rng(seed)
  keys = rng.random((num, k))
  if hardness_NxK is not None:  # (a key in [0, 1): the highest score 0)
    keys = np.where(relevant, keys, np.argsort(np.argsort(-hardness_NxK, 1), 1) / k)
  # Sort key per candidate: relevant ones (up to n // 2 of them) first, then the irrelevant
  # existing ones from base position `negatives_from` (0-based) on, then those above it (the top
  # of a tuned retriever's list holds evidence the labels missed), then the remaining relevant
  # ones, each group in a random order; missing ones last.
  rank_rel = np.argsort(np.argsort(np.where(relevant & mask, keys, 2.0), 1), 1)
  take_rel = relevant & mask & (rank_rel < max(1, n // 2))
  deep = np.arange(k)[None, :] >= negatives_from
  group = np.where(take_rel, 0.0, np.where(mask & ~relevant, np.where(deep, 1.0, 2.0),
                                           np.where(mask, 3.0, 4.0)))
  cols = np.sort(np.argsort(group + keys, 1, kind="stable")[:, :n], 1)  # kept in base order
  take = lambda x: np.take_along_axis(np.asarray(x), cols.reshape(  # noqa: E731
      cols.shape + (1,) * (np.ndim(x) - 2)), 1)
  return questions_N.replace(
      q_BxD=np.asarray(questions_N.q_BxD), mem_BxKxD=take(questions_N.mem_BxKxD),
      mask_BxK=take(mask), relevant_BxK=take(relevant),
      evidence_BxKxE=take(questions_N.evidence_BxKxE),
      inputs=jax.tree.map(take, questions_N.inputs), positions_BxK=cols.astype(np.int32))


SLOTS_PER_ROW = 4  # pairs a packed row holds at most (its last layer computes this many states)


def row_steps() -> int:
  """Into how many steps a batch's possible row counts are cut (each a compiled shape): a CPU
  pays for every empty row, an accelerator mostly idle computes them for nothing but pays most
  of a minute per compile."""
  return 16 if jax.default_backend() == "cpu" else 4


def pack(ids_NxKxL: np.ndarray, segments_NxKxL: np.ndarray, length: int,
         slots: int = SLOTS_PER_ROW, multiple_of: int = 1, serving: bool = False):
  """The pairs of N questions' K candidates packed first-fit decreasing into rows of `length`
  positions (numpy `PackedPairs`), and the share of their positions that are real. The rows are
  rounded up to a step of `row_steps` (and to `multiple_of`, the devices a batch is split over;
  `serving`: to a power of two), so a run compiles for a few row counts only.

  Rows are as long as the pairs' own padded length (LoCoMo's pairs average about half of 128):
  longer rows pack tighter, but on a CPU rows of 256 scored MiniLM's pairs 20% slower than rows
  of 128, at 90% real positions against 87% (attention grows with the square of the length)."""
  lengths = (np.asarray(segments_NxKxL) > 0).sum(-1)
  n, k = lengths.shape
  present = np.flatnonzero(lengths.reshape(-1))
  order = present[np.argsort(-lengths.reshape(-1)[present], kind="stable")]
  used, count, placed = [], [], {}
  for p in order:
    size = int(lengths.flat[p])
    row = next((r for r in range(len(used)) if used[r] + size <= length and count[r] < slots),
               len(used))
    if row == len(used):
      used, count = used + [0], count + [0]
    placed[p] = (row, count[row], used[row])
    used[row] += size
    count[row] += 1
  if serving:
    rows = 1 << max(0, len(used) - 1).bit_length()
  else:
    step = max(1, -(-n * k // row_steps()))
    rows = max(1, -(-len(used) // step) * step)
  rows = -(-rows // multiple_of) * multiple_of
  ids, positions = (np.zeros((rows, length), np.int32) for _ in range(2))
  segments, slot_ids = (np.zeros((rows, length), np.int8) for _ in range(2))
  cls = np.zeros((rows, slots), np.int32)
  where = np.zeros(n * k, np.int32)
  flat_ids = np.asarray(ids_NxKxL).reshape(n * k, -1)
  flat_segments = np.asarray(segments_NxKxL).reshape(n * k, -1)
  for p, (row, slot, start) in placed.items():
    size = int(lengths.flat[p])
    ids[row, start:start + size] = flat_ids[p, :size]
    segments[row, start:start + size] = flat_segments[p, :size]
    positions[row, start:start + size] = np.arange(size)
    slot_ids[row, start:start + size] = slot + 1
    cls[row, slot] = start
    where[p] = row * slots + slot
  real = float(lengths.sum()) / (rows * length)
  return PackedPairs(ids, positions, segments, slot_ids, cls, where.reshape(n, k)), real


def pack_batch(batch, multiple_of: int = 1, serving: bool = False):
  """A host `core.Batch` with pair tokens (B, K, L), its pairs packed (`pack`) for the core."""
  tokens = np.asarray(batch.inputs.ids_BxKxL)
  pairs, _ = pack(tokens, np.asarray(batch.inputs.segments_BxKxL), tokens.shape[-1],
                  multiple_of=multiple_of, serving=serving)
  return batch.replace(inputs=pairs)


def pack_streams(batch):
  """A host `core.Batch` of pair tokens (..., B, K, L), each (B, K) packed into as many rows."""
  tokens = np.asarray(batch.inputs.ids_BxKxL)
  segments = np.asarray(batch.inputs.segments_BxKxL)
  lead, (b, k, width) = tokens.shape[:-3], tokens.shape[-3:]
  flat_t, flat_s = tokens.reshape(-1, b, k, width), segments.reshape(-1, b, k, width)
  first = [pack(t, g, width)[0] for t, g in zip(flat_t, flat_s)]
  rows = max(p.ids_RxL.shape[0] for p in first)
  # Empty rows added at the end: every slot keeps its index (where_BxK stays as it is).
  grow = lambda x: np.pad(x, ((0, rows - len(x)), (0, 0)))  # noqa: E731
  packed = [p.replace(**{name: grow(getattr(p, name)) for name in (
      "ids_RxL", "positions_RxL", "segments_RxL", "slots_RxL", "cls_RxC")}) for p in first]
  pairs = jax.tree.map(lambda *xs: np.stack(xs).reshape(lead + xs[0].shape), *packed)
  return batch.replace(inputs=pairs)


def device_memory_bytes() -> int | None:
  """What the first device can hold (a CPU: the machine's memory; None where not known)."""
  device = jax.devices()[0]
  stats = getattr(device, "memory_stats", lambda: None)()
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def step_bytes(bert, k: int, batch: int, candidates: int, max_length: int,
               dtype: str) -> tuple[int, int | None]:
  """(the memory of one learning step on one device, what the device holds; (0, None) where
  not known): forward and backward over `batch` questions' `candidates` pairs, each at its
  longest and alone in its row, plus Adam's two moments of every parameter."""
  limit = device_memory_bytes()
  if limit is None:
    return 0, None
  # Compiling the step to measure it costs as much as the run's own compile (most of a minute
  # on an accelerator), so a step whose generous bound is far below the device is not measured.
  bound = step_bound(bert, k, batch, candidates, max_length)
  if bound <= limit // 4:
    return bound, limit
  return _step_need(bert, k, batch, candidates, max_length, dtype), limit


def _most_rows(pairs: int) -> int:
  """The rows `pack` may give a batch of this many pairs: every pair alone, rounded up."""
  return pairs + -(-pairs // row_steps())


def step_bound(bert, k: int, batch: int, candidates: int, max_length: int) -> int:
  """A bound from the shapes alone on a learning step's memory (tested against the compiled
  measurement): every float32 activation a BERT layer keeps for its backward pass, counted
  twice, and the parameters, their gradients and Adam's two moments."""
  rows, length = _most_rows(batch * candidates), max_length
  h, heads, inner = bert.hidden_size, bert.num_attention_heads, bert.intermediate_size
  tokens = rows * length
  # Per layer: 9 tensors of width h (input, q, k, v, context, attention out, two norms, the
  # feed-forward's output), 2 of its inner width, the attention scores and softmax per head.
  per_layer = tokens * (9 * h + 2 * inner) + 2 * heads * rows * length * length
  activations = 2 * 4 * (bert.num_hidden_layers * per_layer + tokens * h)
  params = sum(x.size for x in jax.tree.leaves(jax.eval_shape(
      lambda: cross_params_template(bert, k))))
  return activations + 4 * 4 * params


@functools.lru_cache(maxsize=32)  # a sweep checks each of its runs' steps before the first
def _step_need(bert, k: int, batch: int, candidates: int, max_length: int, dtype: str) -> int:
  # Every pair alone in a row, and the rows rounded up as `pack` rounds them.
  rows, length = _most_rows(batch * candidates), max_length
  params = jax.eval_shape(lambda: cross_params_template(bert, k))
  shaped = jax.ShapeDtypeStruct
  pairs = PackedPairs(
      shaped((rows, length), jnp.int32), shaped((rows, length), jnp.int32),
      shaped((rows, length), jnp.int8), shaped((rows, length), jnp.int8),
      shaped((rows, SLOTS_PER_ROW), jnp.int32), shaped((batch, candidates), jnp.int32))
  loss = lambda p, x: jnp.sum(pair_logits(p, x, bert, dtype))  # noqa: E731
  analysis = jax.jit(jax.grad(loss), compiler_options=compiler_options()).lower(
      params, pairs).compile().memory_analysis()
  if analysis is None:
    return 0
  moments = 2 * sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
  return (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
          + analysis.temp_size_in_bytes + moments)
