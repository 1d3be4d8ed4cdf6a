"""How a trained cross reranker reads candidates where it serves (the agent, `eval`, IRIS): the
question beside each candidate's text, cut by its own tokenizer and length, packed."""

from __future__ import annotations

import dataclasses

from rmmjax.encode.encoder import compiler_options
from rmmjax.encode.protocol import require_bert
from rmmjax.learners.cross.spec import check_trained_beside
from rmmjax.learners.cross.pairs import (CandidateTokens, pack_batch, pack_streams, pair_tokens,
                                         replay_pairs, step_bytes)


@dataclasses.dataclass(frozen=True)
class CrossReader:
  tokenizer: object
  max_length: int
  source: str
  previous_turn: bool = False  # reads each turn beside the one before it (replays only)
  batchwise = True  # held out, packed batch by batch (`pack_many`), not evened as streams

  @classmethod
  def for_reranker(cls, reranker, encoder) -> "CrossReader":
    """Refused when `encoder` or its tokenizer is not the one the reranker trained with."""
    require_bert(encoder, f"the cross reranker {reranker.source}")
    check_trained_beside(reranker.record, encoder, f"the cross reranker {reranker.source}")
    read = reranker.record["cross"]
    return cls(encoder.tokenizer, read["max_length"], reranker.source,
               read.get("previous_turn", False))

  def compiler_options(self):
    return compiler_options()  # the encoder's, as its training compiled it

  def candidate_arrays(self, question: str, texts_K):
    """(ids_KxL, segments_KxL) of a question's pairs, at max_length for every question."""
    if self.previous_turn:
      raise ValueError(f"the cross reranker {self.source} reads each turn beside the one before "
                       "it (cross.previous_turn=true), which it is given only over replayed "
                       "conversations (`rmmjax eval --reranker`); serve one trained without it")
    pairs = pair_tokens(self.tokenizer, [question], [texts_K], self.max_length,
                        length=self.max_length)
    return pairs.ids_NxKxL[0], pairs.segments_NxKxL[0]

  def inputs(self, arrays):
    """A batch's `inputs` from candidate_arrays stacked over its queries."""
    return CandidateTokens(*arrays)

  def pack(self, batch):
    return pack_batch(batch, serving=True)

  def pack_many(self, batch):
    """A batch of several questions packed as training packs them (a few row counts)."""
    return pack_batch(batch)

  def replay_inputs(self, replays, spec, online: bool):
    """Every replayed question's pairs (`online`: refused where a learning step cannot fit)."""
    if online:
      need, limit = step_bytes(spec.model.bert, spec.k, spec.batch, spec.k, self.max_length,
                               spec.model.compute_dtype)
      if limit is not None and need > 0.9 * limit:
        raise ValueError(f"--online replays {self.source}'s learning steps (batches of "
                         f"{spec.batch} questions x {spec.k} candidates of up to "
                         f"{self.max_length} tokens), and one needs {need / 2**30:.1f} GiB where "
                         f"the device holds {limit / 2**30:.1f} GiB: evaluate without --online, "
                         "or on a larger device")
    return [p.candidates()
            for p in replay_pairs(self.tokenizer, replays, self.max_length, self.previous_turn)]

  def pack_streams(self, streams):
    return pack_streams(streams)
