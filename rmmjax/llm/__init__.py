"""The LLM backend (any OpenAI-compatible HTTP server), prompts, and parsing of replies."""

from __future__ import annotations

from rmmjax.llm.base import LLMError
from rmmjax.llm.client import LLMSettings, OpenAICompatibleLLM
from rmmjax.llm.parse import (
    LLMOutputError, Verdict, extract_json, parse_answer, parse_merge, parse_sufficiency,
    parse_topics, parse_verdict)
from rmmjax.llm.prompts import (
    add_or_merge, answer_judge, answer_with_citations, sufficiency_judge, topic_extraction)

__all__ = [
    "LLMError", "LLMOutputError", "LLMSettings", "OpenAICompatibleLLM", "Verdict", "add_or_merge",
    "answer_judge", "answer_with_citations", "extract_json", "parse_answer", "parse_merge",
    "parse_sufficiency", "parse_topics", "parse_verdict", "sufficiency_judge",
    "topic_extraction"]
