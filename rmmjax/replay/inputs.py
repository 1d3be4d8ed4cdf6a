"""What every replay task starts from: the dataset's conversations with questions and the
encoder, both checked against the config before anything is embedded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rmmjax import distributed
from rmmjax.config import Config
from rmmjax.data.locomo import load_locomo, load_observations
from rmmjax.data.schema import Conversation, MalformedData
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.replay.candidates import folds


def heldout_split(items: list, cfg: Config) -> tuple[list, list]:
  """(trained on, held out) of a file's conversations (or what was built from each, in the
  file's order): fold `fold` of `folds` when folds is set, else the last `holdout`."""
  test = set(folds(len(items), cfg.folds)[cfg.fold] if cfg.folds
             else range(len(items) - cfg.holdout, len(items)))
  return ([x for i, x in enumerate(items) if i not in test],
          [x for i, x in enumerate(items) if i in test])


def base_encoder() -> SentenceEncoder:
  """The encoder of a replay's memories, its embeddings cached on disk across runs."""
  return SentenceEncoder(cache=EmbeddingCache(distributed.host_cache(cache_path())))


def replay_inputs(cfg: Config, encoder=None) -> tuple[Path, list[Conversation], object, object]:
  """(resolved data path, conversations with questions, load report, encoder)."""
  data = Path(cfg.data).resolve()
  conversations, report = load_locomo(data)
  conversations = [c for c in conversations if c.questions]
  if not cfg.folds and len(conversations) <= cfg.holdout:
    raise ValueError(f"{cfg.data} has {len(conversations)} conversations with questions; "
                     f"holdout={cfg.holdout} would leave none to train on")
  heldout_split(conversations, cfg)  # (refuses folds it cannot hold out, before any work)
  if cfg.cross is not None and cfg.cross.reads_observations(cfg):
    conversations = with_observations(data, conversations, cfg)
  encoder = base_encoder() if encoder is None else encoder
  if encoder.dim != cfg.dim:
    raise ValueError(f"dim={cfg.dim} but the encoder embeds into {encoder.dim} dimensions")
  return data, conversations, report, encoder


def training_questions(cfg: Config) -> int:
  """How many questions a replay run's training conversations hold (its data read, nothing
  embedded)."""
  conversations = [c for c in load_locomo(Path(cfg.data).resolve())[0] if c.questions]
  return sum(len(c.questions) for c in heldout_split(conversations, cfg)[0])


def with_observations(data: Path, conversations: list[Conversation], cfg: Config
                      ) -> list[Conversation]:
  """The conversations, the training ones (heldout_split's) with their LoCoMo observations
  after their questions (`load_observations`): more labelled pairs to learn from, in the
  conversations trained on only. Where the training conversations have none, the
  conversations as they are (cross.observations=auto) or refused (true), as is a file giving
  one id to several conversations (no observation can be matched to its own)."""
  try:
    found = load_observations(data, conversations)
  except MalformedData as e:
    if cfg.cross.observations != "auto":
      raise MalformedData(f"cross.observations=true: {e}; cross.observations=auto trains "
                          "without them") from None
    found = {}
  train, _ = heldout_split(list(range(len(conversations))), cfg)
  if not any(found.get(conversations[i].conversation_id) for i in train):
    if cfg.cross.observations == "auto":
      return conversations
    ids = ", ".join(conversations[i].conversation_id for i in train)
    which = ("the training conversations"
             + (f" of fold={cfg.fold} of folds={cfg.folds}" if cfg.folds else "") + f" ({ids})")
    raise ValueError(f"cross.observations=true: {which} in {cfg.data} hold "
                     "no observations (LoCoMo's per-session \"observation\" statements, each "
                     "naming its turn); expected a file with them, or cross.observations=auto "
                     "or false")
  train = set(train)
  return [dataclasses.replace(c, questions=c.questions + found.get(c.conversation_id, ()))
          if i in train else c for i, c in enumerate(conversations)]
