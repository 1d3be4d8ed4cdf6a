"""Answer-level evaluation (the papers' headline metric): every question of a labelled dataset
answered by the agent from the asker's memory bank, then judged by the LLM, scored by token F1
and ROUGE-L, and its citations compared with the evidence labels.

The agent is used as a server (no learning) through its `ask`, which records nothing in the
bank; a bank built with `rmmjax ingest --user-per-conversation` holds one user per
conversation, named by the conversation's id.
"""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from rmmjax.data.locomo import load_locomo
from rmmjax.eval.answers import aggregate_answers, answer_row, citation_agreement, judge_answer
from rmmjax.llm.base import LLM

LOADERS = {"locomo": load_locomo}


def evaluate_answers(dataset: str, data: Path, agent, llm: LLM, limit: int | None = None,
                     progress: bool = False) -> dict:
  """Answers, judges and scores up to `limit` questions (in file order); returns the report."""
  if dataset not in LOADERS:
    raise ValueError(f"--dataset {dataset!r} is not one of {', '.join(LOADERS)}")
  conversations, report = LOADERS[dataset](data)
  conversations = [c for c in conversations if c.questions]
  missing = [c.conversation_id for c in conversations
             if not agent.bank.has_user(c.conversation_id)]
  if missing:
    raise ValueError(f"the bank has no memories of {', '.join(missing[:5])}"
                     f"{' ...' if len(missing) > 5 else ''}: build it with rmmjax ingest "
                     "--user-per-conversation from the same file")
  todo = [(c, q) for c in conversations for q in c.questions][:limit]
  rows, answers = [], []
  for conv, question in tqdm(todo, desc="answering", unit="question", disable=not progress):
    response = agent.ask(conv.conversation_id, question.question)
    prediction = response.answer or ""
    verdict = judge_answer(llm, question.question, str(question.answer), prediction)
    shown = [{s.turn_id for s in m.snippets} for m in response.memories]
    citation = citation_agreement(shown, list(response.cited), set(question.evidence))
    rows.append((question.category, answer_row(prediction, str(question.answer), verdict=verdict,
                                               citation=citation,
                                               answer_malformed=response.answer is None)))
    answers.append({"conversation": conv.conversation_id, "question": question.question,
                    "gold": str(question.answer), "answer": prediction,
                    "cited": list(response.cited), "correct": verdict.correct,
                    "memories": [m.id for m in response.memories]})
  return {"config": {"dataset": dataset, "data": str(Path(data).resolve()), "limit": limit,
                     "retriever": agent.settings.retriever, "k": agent.settings.k,
                     "m": agent.settings.m},
          "load_report": {"counts": dict(report.counts)},
          "agent": dict(agent.stats), "metrics": aggregate_answers(rows), "answers": answers}
