"""The persistent per-user memory bank (SQLite): raw turns, topic memories, embeddings."""

from __future__ import annotations

from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.crypto import KEY_ENV, generate_key, key_from_env
from rmmjax.memory.records import EncoderMismatch, NewMemory, UnknownRecord

__all__ = ["KEY_ENV", "EncoderMismatch", "MemoryBank", "NewMemory", "UnknownRecord",
           "generate_key", "key_from_env"]
