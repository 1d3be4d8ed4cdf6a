"""Candidate tensors for replaying labelled conversations through the core: each question's top
K units from the base retriever, with their embeddings and which of the question's evidence
turns each covers (recall everywhere counts evidence turns), as padded streams (`to_streams`)
or one pool of questions (`to_questions`) in the core's Batch layout."""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Callable

import jax
import numpy as np
from tqdm import tqdm

from rmmjax.core.types import Batch
from rmmjax.data.schema import Conversation
from rmmjax.retrieve.rankers import make_retriever
from rmmjax.retrieve.units import build_units, turn_line

RANK_DEPTH = 100  # base ranking kept per question beyond the K candidates (for NDCG, MRR)


@dataclasses.dataclass(frozen=True)
class ConversationReplay:
  """One conversation's questions with their base-retriever candidates (arrays on the host)."""

  conversation_id: str
  fingerprint: str  # hash of the conversation's turns (see `conversation_fingerprint`)
  questions: tuple[str, ...]
  categories: tuple[str, ...]
  q_NxD: np.ndarray  # question embeddings
  mem_NxKxD: np.ndarray  # candidate embeddings, base order
  mask_NxK: np.ndarray  # candidate exists (a conversation may hold fewer than K units)
  relevant_NxK: np.ndarray  # candidate covers an evidence turn
  evidence_NxKxE: np.ndarray  # candidate covers the question's e-th evidence turn (padded)
  num_evidence_N: np.ndarray  # evidence turns of each question (the recall denominator)
  num_relevant_N: np.ndarray  # units covering evidence in the whole conversation
  order_NxR: np.ndarray  # base ranking of unit indices to the kept depth (-1 past the end)
  unit_turns: tuple[tuple[str, ...], ...]
  unit_words: tuple[int, ...]
  evidence: tuple[tuple[str, ...], ...]
  unit_texts: tuple[str, ...] = ()  # what a cross reranker reads beside each question
  # The line of the turn before each unit's first, in its session ("" for a session's first).
  unit_previous: tuple[str, ...] = ()

  def candidate_texts(self, previous_turn: bool = False) -> list[list[str | None]]:
    """The text of each question's K candidates, base order (None: no candidate); with
    `previous_turn`, each followed by the turn before it in its session (an answer often
    reads as one only beside the question it answers). The unit's own text comes first, so a
    pair cut to the reader's length loses the neighbour before the candidate."""
    k = self.mask_NxK.shape[1]
    texts = self.unit_texts
    if previous_turn:
      texts = [f"{t} (after {p})" if p else t for t, p in zip(texts, self.unit_previous)]
    return [[texts[u] if u >= 0 else None for u in row[:k]] for row in self.order_NxR]


def conversation_fingerprint(conv: Conversation) -> str:
  """A hash of a conversation's dated turns: the same conversation under another file name,
  format or id has the same fingerprint."""
  digest = hashlib.sha256()
  for session in conv.sessions:
    digest.update(f"{session.date}\x1e".encode())
    for turn in session.turns:
      digest.update(f"{turn.turn_id}\x1f{turn.speaker}\x1f{turn.text}\x1e".encode())
  return digest.hexdigest()[:16]


def evidence_recall(conv: ConversationReplay, columns_NxM: np.ndarray) -> np.ndarray:
  """Recall (all) of each question when the candidates at columns_NxM (-1: none) are kept:
  evidence turns covered / evidence turns, recall_N (`rmmjax.retrieve.metrics`' definition)."""
  cols = np.asarray(columns_NxM)
  picked_NxMxE = np.take_along_axis(conv.evidence_NxKxE, np.maximum(cols, 0)[..., None], 1)
  covered_NxE = (picked_NxMxE & (cols >= 0)[..., None]).any(1)
  return covered_NxE.sum(1) / conv.num_evidence_N


def base_recall(conv: ConversationReplay, m: int) -> np.ndarray:
  """Recall of each question when the base retriever's top m candidates are kept, recall_N."""
  return evidence_recall(conv, np.broadcast_to(np.arange(m), (len(conv.questions), m)))


def ceiling_recall(conv: ConversationReplay) -> np.ndarray:
  """Recall of each question when all K candidates are kept (what any reranker is capped at)."""
  return evidence_recall(conv, np.where(conv.mask_NxK, np.arange(conv.mask_NxK.shape[1]), -1))


def unit_pools(conversations: list[Conversation], units: str, k: int,
               unit_builder: Callable = build_units) -> dict:
  """Each conversation's units by its id, refused when one holds fewer than k."""
  pools = {c.conversation_id: unit_builder(c, units) for c in conversations}
  small = {cid: len(p) for cid, p in pools.items() if len(p) < k}
  if small:
    cid, n = min(small.items(), key=lambda item: item[1])
    raise ValueError(f"k={k} candidates, but conversation {cid} has only {n} {units} units "
                     f"({len(small)} conversation{'s' if len(small) > 1 else ''} "
                     f"{'have' if len(small) > 1 else 'has'} fewer than {k}): expected k <= "
                     f"{min(small.values())} for these conversations")
  return pools


def build_replay(conversations: list[Conversation], units: str, retriever: str, encoder,
                 k: int, depth: int | None = RANK_DEPTH, progress: bool = False,
                 query_encoder=None,
                 unit_builder: Callable = build_units) -> list[ConversationReplay]:
  """Candidates from `retriever` (bm25, dense or hybrid) over each conversation's `units`; the
  base ranking is kept to max(depth, k) units (None: all of them). A tuned `query_encoder`
  embeds the questions (for dense search and for the reranker); units keep `encoder`'s
  embeddings. `unit_builder(conversation, units)` gives the units (topics come from a layer
  above, rmmjax.memory.units)."""
  out = []
  with_questions = [c for c in conversations if c.questions]
  pools = unit_pools(with_questions, units, k, unit_builder)  # before anything is embedded
  for conv in tqdm(with_questions, desc=f"candidates ({retriever}, {units} units)",
                   unit="conversation", disable=not progress):
    pool = pools[conv.conversation_id]  # (k or more units: unit_pools saw to it)
    texts = [u.text for u in pool]
    questions = [q.question for q in conv.questions]
    unit_emb = encoder.encode(texts)
    q_emb = (query_encoder or encoder).encode(questions)
    width = len(pool) if depth is None else max(depth, k)
    order = make_retriever(retriever, texts, encoder, query_encoder).rank(
        questions, min(len(pool), width))
    order_NxR = np.full((len(questions), max(width, k)), -1, np.int64)
    order_NxR[:, :order.shape[1]] = order
    evidence = [tuple(q.evidence) for q in conv.questions]
    num_e = max(len(e) for e in evidence)
    # covers_NxUxE[n, u, e]: unit u holds question n's e-th evidence turn.
    covers_NxUxE = np.zeros((len(questions), len(pool), num_e), bool)
    for n, ev in enumerate(evidence):
      for u, unit in enumerate(pool):
        turns = set(unit.turn_ids)
        covers_NxUxE[n, u, :len(ev)] = [e in turns for e in ev]
    covers = covers_NxUxE.any(-1)
    num_relevant = covers.sum(1)
    if (num_relevant == 0).any():
      bad = conv.questions[int(np.argmin(num_relevant))]
      raise ValueError(f"conversation {conv.conversation_id}: question {bad.question!r} has no "
                       f"evidence among its {units} units")
    before = {t.turn_id: turn_line(p) for s in conv.sessions
              for p, t in zip(s.turns, s.turns[1:])}
    cand = order_NxR[:, :k]
    mask = cand >= 0
    safe = np.maximum(cand, 0)
    rows = np.arange(len(questions))[:, None]
    out.append(ConversationReplay(
        conversation_id=conv.conversation_id, fingerprint=conversation_fingerprint(conv),
        questions=tuple(questions), categories=tuple(q.category for q in conv.questions),
        q_NxD=q_emb, mem_NxKxD=np.where(mask[..., None], unit_emb[safe], 0.0).astype(np.float32),
        mask_NxK=mask, relevant_NxK=np.take_along_axis(covers, safe, 1) & mask,
        evidence_NxKxE=covers_NxUxE[rows, safe] & mask[..., None],
        num_evidence_N=np.array([len(e) for e in evidence], np.int32),
        num_relevant_N=num_relevant.astype(np.int32), order_NxR=order_NxR,
        unit_turns=tuple(u.turn_ids for u in pool), unit_words=tuple(u.words for u in pool),
        evidence=tuple(evidence), unit_texts=tuple(texts),
        unit_previous=tuple(before.get(u.turn_ids[0], "") if u.turn_ids else "" for u in pool)))
  return out


def _arrays(conv: ConversationReplay, length: int, num_e: int, inputs=None) -> dict:
  """The conversation's questions padded with absent ones to `length`, evidence to num_e (and
  a learner's own inputs of its candidates, `inputs`, leading axis the questions, when given)."""
  n, k, _ = conv.mem_NxKxD.shape
  padded = lambda x, fill=0: np.concatenate(  # noqa: E731
      [x, np.full((length - n,) + x.shape[1:], fill, x.dtype)])
  evidence = np.zeros((length, k, num_e), bool)
  evidence[:n, :, :conv.evidence_NxKxE.shape[2]] = conv.evidence_NxKxE
  out = {"q": padded(conv.q_NxD), "mem": padded(conv.mem_NxKxD), "mask": padded(conv.mask_NxK),
         "relevant": padded(conv.relevant_NxK), "num_evidence": padded(conv.num_evidence_N, 1),
         "evidence": evidence}
  if inputs is not None:
    out["inputs"] = jax.tree.map(padded, inputs)
  return out


def _joined(convs: list[ConversationReplay], inputs, length, join) -> Batch:
  """Each conversation's `_arrays` padded to length(conversation) questions, each field (an
  array, or a learner's inputs: a tree of them) joined over the conversations by `join`
  (`inputs`: one entry per conversation, the learner built them from the same list)."""
  num_e = max(c.evidence_NxKxE.shape[2] for c in convs)
  parts = [_arrays(c, length(c), num_e, x)
           for c, x in zip(convs, [None] * len(convs) if inputs is None else inputs)]
  a = {name: jax.tree.map(lambda *xs: join(xs), *[p[name] for p in parts]) for name in parts[0]}
  return Batch(q_BxD=a["q"], mem_BxKxD=a["mem"], mask_BxK=a["mask"], relevant_BxK=a["relevant"],
               num_relevant_B=a["num_evidence"], evidence_BxKxE=a["evidence"],
               inputs=a.get("inputs"))


def stream_steps(conv: ConversationReplay, batch: int) -> int:
  return -(-len(conv.questions) // batch)


def to_streams(convs: list[ConversationReplay], batch: int, steps: int | None = None,
               inputs=None) -> Batch:
  """Conversations as parallel streams, stream_CxSxB, all padded to the longest (or `steps`).
  `inputs` (a learner's own inputs per conversation, of one shape beyond the questions: the
  cross reranker's pair tokens) adds them; likewise below."""
  steps = steps or max(stream_steps(c, batch) for c in convs)
  return _joined(convs, inputs, lambda c: steps * batch, lambda xs: np.stack(xs).reshape(
      (len(convs), steps, batch) + xs[0].shape[1:]))


def to_sequence(convs: list[ConversationReplay], batch: int, inputs=None) -> Batch:
  """Conversations one after another as one stream, stream_SxB (each padded to whole steps)."""
  return _joined(convs, inputs, lambda c: stream_steps(c, batch) * batch,
                 lambda xs: np.concatenate(xs).reshape((-1, batch) + xs[0].shape[1:]))


def to_questions(convs: list[ConversationReplay], inputs=None) -> Batch:
  """Every question of the conversations as one pool, questions_N (for pretraining)."""
  return _joined(convs, inputs, lambda c: len(c.questions), np.concatenate)


def folds(num_conversations: int, num_folds: int) -> list[list[int]]:
  """Conversation indices of each held-out fold: contiguous, sizes differing by at most one."""
  if not 2 <= num_folds <= num_conversations:
    raise ValueError(f"folds={num_folds}: expected between 2 and the {num_conversations} "
                     "conversations")
  return [list(part) for part in np.array_split(np.arange(num_conversations), num_folds)]
