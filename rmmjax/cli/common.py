"""What several command groups share: the bank and the encoder their flags name, the LLM flags
(their defaults LLMSettings' own) and the client they make, and plurals."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from rmmjax.llm.client import STRUCTURED_OUTPUTS, LLMSettings, OpenAICompatibleLLM


def plural(n: int, noun: str) -> str:
  """"1 conversation", "2 conversations"."""
  return f"{n} {noun}{'' if n == 1 else 's'}"


def bank(path: str, must_exist: bool):
  from rmmjax.memory import MemoryBank, key_from_env  # noqa: PLC0415  (the bank's commands only)
  file = Path(path)
  wrong = ("does not exist" if not file.exists() else
           "is an empty file, not a memory bank" if file.is_file() and file.stat().st_size == 0
           else None)
  if must_exist and wrong:
    raise FileNotFoundError(f"--db {path} {wrong} (build one with rmmjax ingest)")
  return MemoryBank(path, key=key_from_env())


def encoder_for(memory_bank):
  """The sentence encoder, with the embedding cache only where the bank is not encrypted: a
  cache row is a plaintext vector keyed by a hash of its text."""
  from rmmjax.encode.cache import EmbeddingCache, cache_path  # noqa: PLC0415  (loads the weights: only here)
  from rmmjax.encode.encoder import SentenceEncoder  # noqa: PLC0415
  if memory_bank is not None and memory_bank.cipher.encrypted:
    return SentenceEncoder(cache=None)
  return SentenceEncoder(cache=EmbeddingCache(cache_path()))


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(LLMSettings)
             if f.default is not dataclasses.MISSING}


def add_llm_flags(p: argparse.ArgumentParser, *, what: str = "") -> None:
  """--llm-url, --model and how to talk to the server; `what` says what the LLM is for."""
  for_ = f" ({what})" if what else ""
  p.add_argument("--llm-url", default=None,
                 help=f"an OpenAI-compatible server{for_}, e.g. http://127.0.0.1:8080")
  p.add_argument("--model", default=None, help="the model name the server serves")
  p.add_argument("--api-key-env", default=_DEFAULTS["api_key_env"],
                 help="environment variable holding the API key (never logged)")
  p.add_argument("--structured-output", default=_DEFAULTS["structured_output"],
                 choices=STRUCTURED_OUTPUTS,
                 help="json_schema (OpenAI, vLLM), json_object (llama.cpp's server), none")
  p.add_argument("--timeout", type=float, default=_DEFAULTS["timeout_s"],
                 help=f"seconds per request (default {_DEFAULTS['timeout_s']:g})")
  p.add_argument("--context-tokens", type=int, default=_DEFAULTS["context_tokens"],
                 help=f"the server's context window: prompts are cut to fit it (default "
                      f"{_DEFAULTS['context_tokens']})")


def llm_from_flags(args):
  """The LLM backend the flags name, or None without --llm-url."""
  if not args.llm_url:
    return None
  if not args.model:
    raise ValueError("--llm-url needs --model NAME (the model the server serves)")
  return OpenAICompatibleLLM(LLMSettings(base_url=args.llm_url, model=args.model,
                                         api_key_env=args.api_key_env,
                                         structured_output=args.structured_output,
                                         timeout_s=args.timeout,
                                         context_tokens=args.context_tokens))
