"""What the replay experiments share: the data location and the LoCoMo candidates."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from rmmjax import core

from rmmjax.data.locomo import load_locomo
from rmmjax.encode.cache import EmbeddingCache
from rmmjax.encode.encoder import DEFAULT_CACHE, SentenceEncoder
from rmmjax.replay.candidates import build_replay

ROOT = Path(__file__).resolve().parents[1]
DATA_DIR = Path(os.environ.get("RMMJAX_DATA", ROOT.parent / "shared" / "data"))
DEFAULT_DATA = DATA_DIR / "locomo" / "locomo_dev8.json"
RESULTS = Path(__file__).parent / "results"


def seed_hparams(cfg, seeds: int, **changes) -> core.HParams:
  """The config's hyperparameters with `changes`, for seeds 0..seeds-1 (a leading axis)."""
  return core.stack_hparams([dataclasses.replace(cfg, seed=s, **changes).hparams()
                             for s in range(seeds)])


def locomo_replays(data: Path, retriever: str, k: int, units: str = "turn"):
  conversations, _ = load_locomo(Path(data))
  encoder = SentenceEncoder(cache=EmbeddingCache(DEFAULT_CACHE))
  return build_replay(conversations, units, retriever, encoder, k)
