"""Candidate tensors for replaying labelled conversations through the core.

For every question of a conversation the base retriever ranks that conversation's memory units;
the top K become the reranker's candidates, with their embeddings and whether each covers an
evidence turn. Conversations then become padded streams (`to_streams`) or one pool of
questions (`to_questions`) in the core's Batch layout.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from rmmjax.core.types import Batch
from rmmjax.data.schema import Conversation
from rmmjax.retrieve.rankers import make_retriever
from rmmjax.retrieve.units import build_units

RANK_DEPTH = 100  # base ranking kept per question, for metrics beyond the K candidates


@dataclasses.dataclass(frozen=True)
class ConversationReplay:
  """One conversation's questions with their base-retriever candidates (arrays on the host)."""

  conversation_id: str
  questions: tuple[str, ...]
  categories: tuple[str, ...]
  q_NxD: np.ndarray  # question embeddings
  mem_NxKxD: np.ndarray  # candidate embeddings, base order
  mask_NxK: np.ndarray  # candidate exists (a conversation may hold fewer than K units)
  relevant_NxK: np.ndarray  # candidate covers an evidence turn
  num_relevant_N: np.ndarray  # units covering evidence in the whole conversation
  order_NxR: np.ndarray  # base ranking of unit indices to the kept depth (-1 past the end)
  unit_emb_UxD: np.ndarray  # every unit's embedding (retrieval with a fine-tuned encoder)
  unit_relevant_NxU: np.ndarray  # unit covers the question's evidence
  unit_turns: tuple[tuple[str, ...], ...]
  unit_words: tuple[int, ...]
  evidence: tuple[frozenset, ...]


def build_replay(conversations: list[Conversation], units: str, retriever: str, encoder,
                 k: int, depth: int | None = RANK_DEPTH) -> list[ConversationReplay]:
  """Candidates from `retriever` (bm25, dense or hybrid) over each conversation's `units`; the
  base ranking is kept to `depth` units (None: all of them)."""
  out = []
  for conv in conversations:
    if not conv.questions:
      continue
    pool = build_units(conv, units)
    if not pool:
      raise ValueError(f"conversation {conv.conversation_id} has no {units} units to retrieve")
    texts = [u.text for u in pool]
    questions = [q.question for q in conv.questions]
    unit_emb = encoder.encode(texts)
    q_emb = encoder.encode(questions)
    width = len(pool) if depth is None else depth
    order = make_retriever(retriever, texts, encoder).rank(questions, min(len(pool), width))
    order_NxR = np.full((len(questions), max(width, k)), -1, np.int64)
    order_NxR[:, :order.shape[1]] = order
    covers = np.array([[bool(set(q.evidence).intersection(u.turn_ids)) for u in pool]
                       for q in conv.questions])
    num_relevant = covers.sum(1)
    if (num_relevant == 0).any():
      bad = conv.questions[int(np.argmin(num_relevant))]
      raise ValueError(f"conversation {conv.conversation_id}: question {bad.question!r} has no "
                       f"evidence among its {units} units")
    cand = order_NxR[:, :k]
    mask = cand >= 0
    safe = np.maximum(cand, 0)
    out.append(ConversationReplay(
        conversation_id=conv.conversation_id, questions=tuple(questions),
        categories=tuple(q.category for q in conv.questions),
        q_NxD=q_emb, mem_NxKxD=np.where(mask[..., None], unit_emb[safe], 0.0).astype(np.float32),
        mask_NxK=mask, relevant_NxK=np.take_along_axis(covers, safe, 1) & mask,
        num_relevant_N=num_relevant.astype(np.int32), order_NxR=order_NxR,
        unit_emb_UxD=unit_emb, unit_relevant_NxU=covers,
        unit_turns=tuple(u.turn_ids for u in pool), unit_words=tuple(u.words for u in pool),
        evidence=tuple(frozenset(q.evidence) for q in conv.questions)))
  return out


def _batch(arrays: dict) -> Batch:
  return Batch(q_BxD=arrays["q"], mem_BxKxD=arrays["mem"], mask_BxK=arrays["mask"],
               relevant_BxK=arrays["relevant"], num_relevant_B=arrays["num_relevant"])


def _arrays(conv: ConversationReplay, length: int) -> dict:
  """The conversation's questions padded with absent ones to `length`."""
  n, k, d = conv.mem_NxKxD.shape
  pad = length - n
  return {"q": np.concatenate([conv.q_NxD, np.zeros((pad, d), np.float32)]),
          "mem": np.concatenate([conv.mem_NxKxD, np.zeros((pad, k, d), np.float32)]),
          "mask": np.concatenate([conv.mask_NxK, np.zeros((pad, k), bool)]),
          "relevant": np.concatenate([conv.relevant_NxK, np.zeros((pad, k), bool)]),
          "num_relevant": np.concatenate([conv.num_relevant_N, np.ones(pad, np.int32)])}


def stream_steps(conv: ConversationReplay, batch: int) -> int:
  return -(-len(conv.questions) // batch)


def to_streams(convs: list[ConversationReplay], batch: int, steps: int | None = None) -> Batch:
  """Conversations as parallel streams, stream_CxSxB, all padded to the longest (or `steps`)."""
  steps = steps or max(stream_steps(c, batch) for c in convs)
  stacked = [_arrays(c, steps * batch) for c in convs]
  return _batch({name: np.stack([s[name] for s in stacked]).reshape(
      (len(convs), steps, batch) + stacked[0][name].shape[1:]) for name in stacked[0]})


def to_sequence(convs: list[ConversationReplay], batch: int) -> Batch:
  """Conversations one after another as one stream, stream_SxB (each padded to whole steps)."""
  parts = [_arrays(c, stream_steps(c, batch) * batch) for c in convs]
  flat = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
  return _batch({name: x.reshape((-1, batch) + x.shape[1:]) for name, x in flat.items()})


def to_questions(convs: list[ConversationReplay]) -> Batch:
  """Every question of the conversations as one pool, questions_N (for pretraining)."""
  return _batch({name: np.concatenate([_arrays(c, len(c.questions))[name] for c in convs])
                 for name in ("q", "mem", "mask", "relevant", "num_relevant")})


def folds(num_conversations: int, num_folds: int) -> list[list[int]]:
  """Conversation indices of each held-out fold: contiguous, sizes differing by at most one."""
  if not 2 <= num_folds <= num_conversations:
    raise ValueError(f"folds={num_folds}: expected between 2 and the {num_conversations} "
                     "conversations")
  return [list(part) for part in np.array_split(np.arange(num_conversations), num_folds)]
