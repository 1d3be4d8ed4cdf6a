"""What the memory commands share: the bank, the encoder and the LLM their flags name."""

from __future__ import annotations

from pathlib import Path


def llm_from_flags(args):
  """The LLM backend the flags name, or None without --llm-url."""
  if not args.llm_url:
    return None
  if not args.model:
    raise ValueError("--llm-url needs --model NAME (the model the server serves)")
  from rmmjax.llm.client import LLMSettings, OpenAICompatibleLLM
  return OpenAICompatibleLLM(LLMSettings(base_url=args.llm_url, model=args.model,
                                         api_key_env=args.api_key_env,
                                         structured_output=args.structured_output,
                                         timeout_s=args.timeout,
                                         context_tokens=args.context_tokens))


def bank(path: str, must_exist: bool):
  from rmmjax.memory import MemoryBank, key_from_env
  if must_exist and not Path(path).exists():
    raise FileNotFoundError(f"--db {path} does not exist (build one with rmmjax ingest)")
  if must_exist and Path(path).is_file() and Path(path).stat().st_size == 0:
    raise ValueError(f"--db {path} is an empty file, not a memory bank (build one with rmmjax "
                     f"ingest)")
  return MemoryBank(path, key=key_from_env())


def encoder_for(memory_bank):
  """The sentence encoder, with the embedding cache only where the bank is not encrypted: a
  cache row is a plaintext vector keyed by a hash of its text."""
  from rmmjax.encode.cache import EmbeddingCache
  from rmmjax.encode.encoder import DEFAULT_CACHE, SentenceEncoder
  if memory_bank is not None and memory_bank.cipher.encrypted:
    return SentenceEncoder(cache=None)
  return SentenceEncoder(cache=EmbeddingCache(DEFAULT_CACHE))
