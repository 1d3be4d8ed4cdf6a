"""Encryption at rest of the memory bank's personal data, with a Fernet key (docs/memory.md).

Texts and embeddings (vectors can be inverted back to text) are sealed; ids, dates and timestamps
stay plain so rows can still be found and ordered. The key is never written or shown.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import final

KEY_ENV = "RMMJAX_BANK_KEY"
_KEY_FORMAT = "a Fernet key: 32 url-safe base64-encoded bytes, 44 characters"
# Sealed at creation and opened on every open, so that a wrong key fails at once, with a message,
# instead of as garbage (or as an error) at the first read of a row.
KEY_CHECK = b"rmmjax memory bank key check"


class BankKeyError(ValueError):
  """A key that does not fit the bank: missing, wrong, malformed, or given to a plain bank."""


def generate_key() -> bytes:
  """A fresh random key, to keep in RMMJAX_BANK_KEY (or a secret store)."""
  from cryptography.fernet import Fernet  # noqa: PLC0415  (only encrypted banks need it)
  return Fernet.generate_key()


def key_from_env(environ: Mapping[str, str] = os.environ) -> bytes | None:
  """The key in RMMJAX_BANK_KEY, or None where it is unset or empty (a plain bank)."""
  value = environ.get(KEY_ENV, "").strip()
  return value.encode("ascii", "replace") if value else None


class Cipher:
  """Seals and opens the bank's personal fields; this base, the plain cipher, stores them as
  they are."""

  encrypted = False

  def seal_text(self, text: str) -> str:
    return text

  def open_text(self, stored: str) -> str:
    return stored

  def seal_bytes(self, data: bytes) -> bytes:
    return data

  def open_bytes(self, stored: bytes) -> bytes:
    return bytes(stored)


@final
class FernetCipher(Cipher):
  """Fernet tokens: random IV per field, authenticated, so tampering or a wrong key is caught."""

  encrypted = True

  def __init__(self, key: bytes, where: str):
    try:
      from cryptography.fernet import Fernet  # noqa: PLC0415
    except ImportError:
      raise BankKeyError(f"{where} needs the cryptography package for its key: "
                         f"pip install 'cryptography>=42'") from None
    try:
      self._fernet = Fernet(key)
    except ValueError:
      # The key itself is never shown: only its length.
      raise BankKeyError(f"{where}: the key is not {_KEY_FORMAT} (it has {len(key)} bytes); "
                         f"make one with rmmjax.memory.generate_key() and keep it in "
                         f"{KEY_ENV}") from None

  def seal_text(self, text: str) -> str:
    return self._fernet.encrypt(text.encode("utf-8")).decode("ascii")

  def open_text(self, stored: str) -> str:
    return self.open_bytes(stored.encode("ascii")).decode("utf-8")

  def seal_bytes(self, data: bytes) -> bytes:
    return self._fernet.encrypt(data)

  def open_bytes(self, stored: bytes) -> bytes:
    from cryptography.fernet import InvalidToken  # noqa: PLC0415
    try:
      return self._fernet.decrypt(bytes(stored))
    except InvalidToken:
      raise BankKeyError("a stored field does not open with this key (tampered with, or "
                         "written with another key)") from None
