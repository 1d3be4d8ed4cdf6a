"""The persistent per-user memory bank (SQLite): raw turns, topic memories, embeddings."""

from __future__ import annotations

from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.crypto import KEY_ENV, BankKeyError, generate_key, key_from_env
from rmmjax.memory.records import (
    BankFileError, EncoderMismatch, Merge, NewMemory, SessionEnded, UnknownRecord)

__all__ = [
    "KEY_ENV", "BankFileError", "BankKeyError", "EncoderMismatch", "MemoryBank", "Merge",
    "NewMemory", "SessionEnded", "UnknownRecord", "generate_key", "key_from_env"]
