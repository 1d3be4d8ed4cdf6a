"""The retriever factory: a ranker over a list of texts, by name."""

from __future__ import annotations

from rmmjax.retrieve.bm25 import BM25Retriever
from rmmjax.retrieve.dense import DenseRetriever, FusionRetriever

RETRIEVERS = ("bm25", "dense", "hybrid")


def make_retriever(name: str, texts: list[str], encoder, query_encoder=None):
  """A ranker over texts: BM25, dense (the encoder), or their reciprocal-rank fusion; a
  fine-tuned `query_encoder` embeds the queries of dense search, `encoder` the texts."""
  if name == "bm25":
    return BM25Retriever(texts)
  dense = DenseRetriever(texts, encoder, query_encoder)
  if name == "dense":
    return dense
  return FusionRetriever(BM25Retriever(texts), dense, len(texts))
