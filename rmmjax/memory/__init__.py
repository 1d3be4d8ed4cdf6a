"""The persistent per-user memory bank (SQLite): raw turns, topic memories, embeddings."""

from __future__ import annotations

from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.crypto import KEY_ENV, BankKeyError, generate_key, key_from_env
from rmmjax.memory.records import (
    BankError, BankFileError, BankTurn, EncoderMismatch, Memory, Merge, NewMemory, SessionInfo,
    Snippet, UnknownRecord)
from rmmjax.memory.schema_sql import LATEST as SCHEMA_VERSION

__all__ = [
    "KEY_ENV", "SCHEMA_VERSION", "BankError", "BankFileError", "BankKeyError", "BankTurn",
    "EncoderMismatch", "Memory", "MemoryBank", "Merge", "NewMemory", "SessionInfo", "Snippet",
    "UnknownRecord", "generate_key", "key_from_env",
]
