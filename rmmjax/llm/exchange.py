"""The cited-answer exchange: a question and the numbered texts shown to the LLM, its answer
and which of them it cited, or why there is none. Both agents and `rmmjax answer` ask through
here, so a failure is classified the same way everywhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import final

from rmmjax.llm.base import LLM, LLMError
from rmmjax.llm.parse import LLMOutputError, parse_answer
from rmmjax.llm.prompts import answer_with_citations

# The exchange's counters in an agent's stats (Exchange.count says what each one counts).
COUNTERS = ("answered", "shown", "cited", "malformed", "invalid_citations", "llm_errors",
            "cut_prompts")


@final
@dataclasses.dataclass(frozen=True)
class Exchange:
  """What the LLM gave for one question."""

  answer: str | None  # None when the LLM failed or its reply held no answer
  cited: tuple[int, ...]  # 0-based positions among the shown texts (well-formed answers only)
  shown: int  # texts shown
  failure: str | None = None  # "llm_error" (no reply) or "malformed" (no cited answer)
  error: str = ""  # what the failure was
  cut: bool = False  # the prompt's texts were cut to fit the model's context
  invalid_citations: int = 0  # numbers the reply cited that name no shown text

  def count(self, stats: dict) -> None:
    """Adds this exchange to an agent's COUNTERS."""
    stats["shown"] += self.shown
    stats["cut_prompts"] += self.cut
    stats["llm_errors"] += self.failure == "llm_error"
    stats["answered"] += self.failure != "llm_error"
    stats["malformed"] += self.failure == "malformed"
    stats["invalid_citations"] += self.invalid_citations
    stats["cited"] += len(self.cited)


def ask_cited(llm: LLM, question: str, texts: Sequence[str], *,
              evidence_missing: bool = False) -> Exchange:
  """Asks the LLM to answer `question` from the numbered `texts`, citing the ones it used
  (`evidence_missing`: the retriever found the evidence absent, so a refusal is asked for
  rather than a guess). A failed request and a reply that is not a cited answer come back as
  failures, never as exceptions."""
  prompt = answer_with_citations(question, list(texts), max_chars=llm.prompt_chars(),
                                 evidence_missing=evidence_missing)
  cut, shown = bool(prompt.cut), len(texts)
  try:
    reply = llm.chat_structured(prompt.messages, prompt.schema)
  except (LLMError, LLMOutputError) as err:  # failed, or a reply with no text at all
    return Exchange(None, (), shown, "llm_error", str(err), cut)
  parsed = parse_answer(reply, shown)
  if parsed.malformed or not parsed.answer:  # an empty answer cites nothing it used
    return Exchange(parsed.answer or None, (), shown, "malformed",
                       f"not a cited answer: {reply[:120]!r}", cut, parsed.invalid_citations)
  return Exchange(parsed.answer, tuple(parsed.cited), shown, None, "", cut,
                     parsed.invalid_citations)
