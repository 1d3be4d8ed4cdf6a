"""Synthetic LaceMems for scale checks: random topic-clustered unit vectors, no encoder."""

from __future__ import annotations

import math

import numpy as np

from rmmjax.memory.lace.settings import fact_text
from rmmjax.memory.lace.store import LaceMem
from rmmjax.retrieve.evidence import Fact, RawTurn

CLUSTER_SIZE, FACTS_PER_TURN, TURNS_PER_SESSION = 20, 2, 25


def synthetic_lace(num_facts: int, dim: int = 384) -> LaceMem:
  """Facts in random topics of about CLUSTER_SIZE, built in one batch: a topic's facts have
  cosine about 0.8 with each other and about 0 with the rest, so every fact has semantic
  candidates above the default threshold."""
  rng = np.random.default_rng(0)
  centres = rng.standard_normal((math.ceil(num_facts / CLUSTER_SIZE), dim)).astype(np.float32)
  centres /= np.linalg.norm(centres, axis=1, keepdims=True)
  topic = rng.integers(0, centres.shape[0], num_facts)
  # Noise of squared norm about 0.25: cosine within a topic about 1 / 1.25.
  vectors = centres[topic] + rng.standard_normal((num_facts, dim)).astype(np.float32) * (
      0.5 / math.sqrt(dim))
  vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
  turns, facts = [], []
  for first in range(0, num_facts, FACTS_PER_TURN):
    turn, ids = first // FACTS_PER_TURN, range(first, min(first + FACTS_PER_TURN, num_facts))
    session = turn // TURNS_PER_SESSION
    clauses = [f"fact {i} of topic {topic[i]}" for i in ids]
    raw = RawTurn(f"T{turn}", f"S{session}", f"day {session}", "AB"[turn % 2], "; ".join(clauses))
    turns.append(raw)
    facts += [Fact(i, raw.speaker, "states", clause, raw.date, raw.turn_id, raw.session_id,
                   fact_text(raw.date, raw.speaker, clause))
              for i, clause in zip(ids, clauses, strict=True)]
  return LaceMem.from_facts(turns, facts, vectors)
