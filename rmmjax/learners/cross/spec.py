"""The cross reranker's core spec, from a run's config and the encoder it reads with (or, for a
trained run, the encoder configuration its record names), and that record's checks."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rmmjax import core
from rmmjax.config import effective_dtype
from rmmjax.encode.protocol import encoder_identity, tokenizer_identity
from rmmjax.io.trained import read_record
from rmmjax.learners.cross.model import CrossModel, cross_params_template


def cross_spec(cfg, bert: core.BertConfig) -> core.CoreSpec:
  """The core spec of a cross run of `cfg` over an encoder of configuration `bert`."""
  return dataclasses.replace(cfg.core_spec(), model=CrossModel(
      bert, effective_dtype(cfg.cross.compute_dtype), cfg.cross.head_lr_scale))


def cross_record(record: dict, where, fix: str = "the workdir is damaged: train it again",
                 name: str = "record.json") -> dict:
  """The record's `cross` entry (how the reranker reads pairs), checked; `fix` says what to do."""
  cross = record.get("cross") if isinstance(record.get("cross"), dict) else {}
  bert, length = cross.get("bert"), cross.get("max_length")
  if (not isinstance(bert, dict) or not isinstance(cross.get("tokenizer"), str)
      or not isinstance(length, int) or not 16 <= length <= 512):
    raise ValueError(f"{where}: its {name} does not say how the cross reranker reads pairs "
                     f"(cross.bert, cross.tokenizer, cross.max_length of 16 to 512); {fix}")
  try:
    core.BertConfig.from_dict(bert, where=f"{where}: record.json cross.bert")
  except TypeError as err:
    raise ValueError(f"{where}: record.json cross.bert is not a BERT configuration "
                     f"({err})") from None
  return cross


def restore(cfg, workdir: Path) -> tuple[core.CoreSpec, dict]:
  """A cross run's spec (from its record) and its parameters' structure, for a restore."""
  cross = cross_record(read_record(workdir), workdir)
  spec = cross_spec(cfg, core.BertConfig(**cross["bert"]))
  return spec, cross_params_template(spec.model.bert, cfg.k)


def check_trained_beside(record: dict, encoder, source: str, fix: str = "") -> None:
  """Refuses `encoder` unless it and its tokenizer are those the cross reranker of `record`
  (named `source`) trained beside: its weights read their embeddings and their cut pairs."""
  for what, trained, here in (("encoder", record.get("encoder"), encoder_identity(encoder)),
                              ("tokenizer", record["cross"]["tokenizer"],
                               tokenizer_identity(encoder))):
    if trained != here:
      raise ValueError(f"{source} was trained beside the {what} {trained}; this one is "
                       f"{here}{fix}")
