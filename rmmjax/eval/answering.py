"""Answer-level evaluation (the papers' headline metric), `rmmjax answer`: its rules for failed
answers, judges and stopping are in docs/command-line.md, answer."""

from __future__ import annotations

import abc
import dataclasses
from pathlib import Path

from tqdm import tqdm

from rmmjax.eval.answers import aggregate_answers, answer_row, citation_agreement, judge_answer
from rmmjax.eval.leakage import unseen
from rmmjax.eval.retrieval import DATASETS
from rmmjax.llm.base import LLM, LLMError
from rmmjax.llm.exchange import ask_cited
from rmmjax.llm.parse import LLMOutputError
from rmmjax.retrieve.evidence import turn_prompt_text
from rmmjax.memory.lace import LaceMem
from rmmjax.retrieve.iris import iris_retrieve
from rmmjax.retrieve.judges import HeuristicJudge

MAX_FAILURES_IN_A_ROW = 5


@dataclasses.dataclass(frozen=True)
class Answered:
  """What an answerer handed the generator and got back for one question."""

  answer: str | None  # None when the LLM failed or its reply held no answer
  shown_turns: list[set[str]]  # the turn ids each shown memory (or evidence turn) covers
  cited: tuple[int, ...]  # positions among the shown the answer cited
  shown_ids: list  # what was shown, by id (memory ids, or turn ids)
  failure: str | None = None  # "llm_error" or "malformed"
  error: str = ""
  cut_prompt: bool = False  # the prompt's text was cut to fit the model's context


class Answerer(abc.ABC):
  """Answers one question of a conversation; `check` refuses a dataset it cannot answer."""

  def check(self, conversations: list) -> None:
    """Raises ValueError before the first question when some conversation cannot be answered."""

  @abc.abstractmethod
  def __call__(self, conv, question) -> Answered:
    """The answer to one question of conv."""


class BankAnswerer(Answerer):
  """Answers with the RMM agent serving from a bank built with --user-per-conversation."""

  def __init__(self, agent):
    self.agent = agent

  def check(self, conversations: list) -> None:
    users = set(self.agent.bank.users())
    missing = [c.conversation_id for c in conversations if c.conversation_id not in users]
    if missing:
      raise ValueError(f"{self.agent.bank.where} has no memories of {len(missing)} of the "
                       f"{len(conversations)} conversations ({', '.join(missing[:5])}"
                       f"{'...' if len(missing) > 5 else ''}): build it with rmmjax ingest "
                       f"--user-per-conversation from the same file")

  def __call__(self, conv, question) -> Answered:
    cut_before = self.agent.stats["cut_prompts"]
    response = self.agent.respond(conv.conversation_id, question.question, record=False)
    return Answered(response.answer, [{s.turn_id for s in m.snippets} for m in response.memories],
                    tuple(response.cited), [m.id for m in response.memories], response.failure,
                    response.error, self.agent.stats["cut_prompts"] > cut_before)


class IrisAnswerer(Answerer):
  """Answers from IRIS's final evidence on a LaceMem built per conversation: the first m
  distinct turns, verbatim with their dates, numbered for citation (heuristic judge)."""

  def __init__(self, encoder, llm: LLM, m: int):
    self.encoder, self.llm, self.m = encoder, llm, m
    self._stores: dict[str, LaceMem] = {}

  def __call__(self, conv, question) -> Answered:
    if conv.conversation_id not in self._stores:
      self._stores[conv.conversation_id] = LaceMem.from_conversation(conv, self.encoder)
    store = self._stores[conv.conversation_id]
    result = iris_retrieve(store, question.question, category=question.category,
                           judge=HeuristicJudge())
    turns = list(result.top_turns(self.m))
    raws = [store.raw(t) for t in turns]
    # An abstention (the evidence judged absent) asks for a refusal, not a guess.
    got = ask_cited(self.llm, question.question, [turn_prompt_text(r) for r in raws],
                    evidence_missing=result.abstained)
    return Answered(got.answer, [{t} for t in turns], got.cited, turns, got.failure, got.error,
                    got.cut)


def evaluate_answers(dataset: str, data: Path, answerer: Answerer, llm: LLM,
                     limit: int | None = None, progress: bool = False,
                     config: dict | None = None, models: list[tuple[str, dict]] = (),
                     in_sample: bool = False) -> dict:
  """Answers, judges and scores up to `limit` questions in file order; returns the report.
  Conversations that one of the trained `models` (source, record) or their ancestors trained
  on are left out, as `eval` leaves them out, unless `in_sample`."""
  conversations, report = DATASETS[dataset](data)
  conversations = [c for c in conversations if c.questions]
  config = dict(config or {})
  if models:
    conversations, account = unseen(conversations, list(models), in_sample)
    config |= account
  todo = [(c, q) for c in conversations for q in c.questions][:limit]
  answerer.check(list(dict.fromkeys(c for c, _ in todo)))
  rows, answers, counts = [], [], {"judge_errors": 0, "cut_prompts": 0}
  in_a_row, stopped = 0, None
  for conv, question in tqdm(todo, desc="answering", unit="question", disable=not progress):
    got = answerer(conv, question)
    prediction, failed, verdict = got.answer or "", not got.answer, None
    counts["cut_prompts"] += got.cut_prompt
    llm_failed = got.failure == "llm_error"
    if not failed:  # a failed answer is wrong without asking the judge
      try:
        verdict = judge_answer(llm, question.question, str(question.answer), prediction)
      except (LLMError, LLMOutputError) as err:
        counts["judge_errors"] += 1
        llm_failed, got = True, dataclasses.replace(got, error=f"the judge failed: {err}")
    # Without an answer nothing was used: its citations (if any) count as none.
    citation = citation_agreement(got.shown_turns, [] if failed else list(got.cited),
                                  set(question.evidence))
    row = answer_row(prediction, str(question.answer), verdict=verdict, citation=citation,
                     answer_malformed=got.failure == "malformed", answer_failed=failed)
    rows.append((question.category, row))
    # One rule for the mean and the question: a failed answer is wrong; a malformed verdict or
    # none (the judge failed) leaves the question unjudged (None), counted apart.
    answers.append({"conversation": conv.conversation_id, "question": question.question,
                    "gold": str(question.answer), "answer": prediction,
                    "cited": [] if failed else list(got.cited),
                    "correct": None if row["judge"] is None else row["judge"] == 1.0,
                    "judge_malformed": row["judge_malformed"],
                    "failure": got.failure, "error": got.error, "shown": got.shown_ids})
    in_a_row = in_a_row + 1 if llm_failed else 0
    if in_a_row >= MAX_FAILURES_IN_A_ROW:
      stopped = (f"the LLM failed on {in_a_row} questions in a row (last: {got.error}); "
                 f"stopped after {len(rows)} of {len(todo)} questions")
      break
  return {"config": {"dataset": dataset, "data": str(Path(data).resolve()), "limit": limit}
                    | config,
          "complete": stopped is None, "stopped": stopped, "counts": counts,
          "load_report": {"counts": dict(report.counts)},
          "metrics": aggregate_answers(rows), "answers": answers}
