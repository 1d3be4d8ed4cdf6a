"""The LLM flags of every command that talks to an LLM (ingest, chat, answer, eval --judge llm)
and the client they make: one definition, its defaults LLMSettings' own."""

from __future__ import annotations

import argparse
import dataclasses

from rmmjax.llm.client import STRUCTURED_OUTPUTS, LLMSettings, OpenAICompatibleLLM

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
