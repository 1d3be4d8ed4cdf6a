"""What every replay task starts from: the dataset's conversations with questions and the
encoder, both checked against the config before anything is embedded."""

from __future__ import annotations

from pathlib import Path

from rmmjax import distributed
from rmmjax.config import Config
from rmmjax.data.locomo import load_locomo
from rmmjax.data.schema import Conversation
from rmmjax.encode.cache import EmbeddingCache, cache_path
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.replay.candidates import folds


def heldout_split(items: list, cfg: Config) -> tuple[list, list]:
  """(trained on, held out) of a file's conversations (or what was built from each, in the
  file's order): fold `fold` of `folds` when folds is set, else the last `holdout`."""
  if cfg.folds:
    test = set(folds(len(items), cfg.folds)[cfg.fold])
  else:
    test = set(range(len(items) - cfg.holdout, len(items)))
  return ([x for i, x in enumerate(items) if i not in test],
          [x for i, x in enumerate(items) if i in test])


def replay_inputs(cfg: Config, encoder=None) -> tuple[Path, list[Conversation], object, object]:
  """(resolved data path, conversations with questions, load report, encoder)."""
  data = Path(cfg.data).resolve()
  conversations, report = load_locomo(data)
  conversations = [c for c in conversations if c.questions]
  if not cfg.folds and len(conversations) <= cfg.holdout:
    raise ValueError(f"{cfg.data} has {len(conversations)} conversations with questions; "
                     f"holdout={cfg.holdout} would leave none to train on")
  if cfg.folds > len(conversations):
    raise ValueError(f"folds={cfg.folds}: {cfg.data} has {len(conversations)} conversations "
                     "with questions; expected at most one fold per conversation")
  if encoder is None:
    encoder = SentenceEncoder(cache=EmbeddingCache(distributed.host_cache(cache_path())))
  if encoder.dim != cfg.dim:
    raise ValueError(f"dim={cfg.dim} but the encoder embeds into {encoder.dim} dimensions")
  return data, conversations, report, encoder
