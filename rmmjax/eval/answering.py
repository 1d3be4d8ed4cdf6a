"""Answer-level evaluation (the papers' headline metric): every question of a labelled dataset
answered by the agent from the asker's memory bank, then judged by the LLM, scored by token F1
and ROUGE-L, and its citations compared with the evidence labels.

The agent is used as a server (no learning) through its `ask`, which records nothing in the
bank; a bank built with `rmmjax ingest --user-per-conversation` holds one user per
conversation, named by the conversation's id. With IRIS the answer comes from the final
evidence of iterative retrieval over a LaceMem built per conversation instead.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tqdm import tqdm

from rmmjax.data.locomo import load_locomo
from rmmjax.eval.answers import aggregate_answers, answer_row, citation_agreement, judge_answer
from rmmjax.llm.base import LLM, LLMError
from rmmjax.llm.parse import parse_answer
from rmmjax.llm.prompts import answer_with_citations
from rmmjax.memory.lace import LaceMem
from rmmjax.retrieve.iris import IrisSettings, iris_retrieve
from rmmjax.retrieve.judges import HeuristicJudge

LOADERS = {"locomo": load_locomo}


@dataclasses.dataclass(frozen=True)
class Answered:
  """What an answerer handed the generator and got back for one question."""

  answer: str | None  # None when the LLM failed or its reply was malformed
  shown_turns: list[set[str]]  # the turn ids each shown memory (or evidence turn) covers
  cited: tuple[int, ...]  # positions among the shown the answer cited
  shown_ids: list  # what was shown, by id (memory ids, or turn ids)


def agent_answerer(agent):
  """Answers with the RMM agent serving from a bank built with --user-per-conversation."""

  def answer(conv, question) -> Answered:
    if not agent.bank.has_user(conv.conversation_id):
      raise ValueError(f"the bank has no memories of {conv.conversation_id}: build it with "
                       "rmmjax ingest --user-per-conversation from the same file")
    response = agent.ask(conv.conversation_id, question.question)
    return Answered(response.answer, [{s.turn_id for s in m.snippets} for m in response.memories],
                    tuple(response.cited), [m.id for m in response.memories])

  return answer


def iris_answerer(encoder, llm: LLM, m: int, settings=None):
  """Answers from IRIS's final evidence on a LaceMem built per conversation: the first m
  distinct turns, verbatim with their dates, numbered for citation (heuristic judge)."""
  stores: dict[str, LaceMem] = {}

  def answer(conv, question) -> Answered:
    if conv.conversation_id not in stores:
      stores[conv.conversation_id] = LaceMem.from_conversation(conv, encoder)
    store = stores[conv.conversation_id]
    result = iris_retrieve(store, question.question, category=question.category,
                           judge=HeuristicJudge(), settings=settings or IrisSettings())
    turns = list(result.top_turns(m))
    raws = [store.raw(t) for t in turns]
    prompt = answer_with_citations(question.question,
                                   [f"[{r.date}] {r.speaker}: {r.text}" for r in raws])
    try:
      parsed = parse_answer(llm.chat_structured(prompt.messages, prompt.schema), len(raws))
    except LLMError:
      return Answered(None, [{t} for t in turns], (), turns)
    return Answered(None if parsed.malformed else parsed.answer, [{t} for t in turns],
                    parsed.cited, turns)

  return answer


def evaluate_answers(dataset: str, data: Path, answerer, llm: LLM, limit: int | None = None,
                     progress: bool = False, config: dict | None = None) -> dict:
  """Answers (with `answerer(conversation, question) -> Answered`), judges and scores up to
  `limit` questions in file order; returns the report."""
  if dataset not in LOADERS:
    raise ValueError(f"--dataset {dataset!r} is not one of {', '.join(LOADERS)}")
  conversations, report = LOADERS[dataset](data)
  conversations = [c for c in conversations if c.questions]
  todo = [(c, q) for c in conversations for q in c.questions][:limit]
  rows, answers = [], []
  for conv, question in tqdm(todo, desc="answering", unit="question", disable=not progress):
    got = answerer(conv, question)
    prediction = got.answer or ""
    verdict = judge_answer(llm, question.question, str(question.answer), prediction)
    citation = citation_agreement(got.shown_turns, list(got.cited), set(question.evidence))
    rows.append((question.category, answer_row(prediction, str(question.answer), verdict=verdict,
                                               citation=citation,
                                               answer_malformed=got.answer is None)))
    answers.append({"conversation": conv.conversation_id, "question": question.question,
                    "gold": str(question.answer), "answer": prediction,
                    "cited": list(got.cited), "correct": verdict.correct,
                    "shown": got.shown_ids})
  return {"config": {"dataset": dataset, "data": str(Path(data).resolve()), "limit": limit}
                    | (config or {}),
          "load_report": {"counts": dict(report.counts)},
          "metrics": aggregate_answers(rows), "answers": answers}
