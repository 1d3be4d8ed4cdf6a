"""The persistent per-user memory bank (SQLite): raw turns, topic memories, embeddings."""

from __future__ import annotations

from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.crypto import KEY_ENV, BankKeyError, generate_key, key_from_env
from rmmjax.memory.records import (
    ORIGINS, BankError, BankFileError, BankTurn, EncoderMismatch, Memory, Merge, NewMemory,
    SessionEnded, SessionInfo, Snippet, StaleRead, UnknownRecord)
from rmmjax.memory._schema import VERSION as SCHEMA_VERSION

__all__ = [
    "KEY_ENV", "ORIGINS", "SCHEMA_VERSION", "BankError", "BankFileError", "BankKeyError",
    "BankTurn", "EncoderMismatch", "Memory", "MemoryBank", "Merge", "NewMemory", "SessionEnded",
    "SessionInfo", "Snippet", "StaleRead", "UnknownRecord", "generate_key", "key_from_env",
]
