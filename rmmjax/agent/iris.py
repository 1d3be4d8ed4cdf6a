"""The agent answering through IRIS over a user's LaceMem in the bank (`chat --iris` and
`recall --iris` in docs/command-line.md); nothing learns here: IRIS's models train offline."""

from __future__ import annotations

import dataclasses

from rmmjax.agent.base import STATS, ChatAgent, Reply
from rmmjax.llm.base import LLM
from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.lace import LaceMem, add_missing_turns, synced_lace
from rmmjax.retrieve.evidence import RawTurn, turn_prompt_text
from rmmjax.retrieve.iris import IrisResult, IrisSettings, iris_retrieve
from rmmjax.retrieve.judges import HeuristicJudge
from rmmjax.retrieve.learned import EmbeddingRefiner, LearnedJudge


@dataclasses.dataclass(frozen=True)
class IrisResponse(Reply):
  answer: str | None  # None without an LLM, or when the LLM failed
  turns: tuple[RawTurn, ...]  # the M turns shown, in the order they were numbered
  cited: tuple[int, ...]  # positions in `turns` the answer cited
  result: IrisResult | None  # None when the user had no turns to search
  failure: str | None = None  # "llm_error" or "malformed"
  error: str = ""
  session_id: str | None = None

  @property
  def abstained(self) -> bool:
    return self.result is not None and self.result.abstained

  @property
  def shown_texts(self) -> list[str]:
    return [turn_prompt_text(t) for t in self.turns]


class IrisAgent(ChatAgent):
  """Serves questions of any user of one bank through IRIS over the user's LaceMem."""

  def __init__(self, bank: MemoryBank, encoder, *, m: int = 5, llm: LLM | None = None,
               settings: IrisSettings = IrisSettings(), model=None, progress: bool = True,
               rebuild: bool = False):
    self.bank, self.encoder, self.m, self.llm = bank, encoder, m, llm
    self.settings, self.model, self.progress = settings, model, progress
    self._rebuild = rebuild
    self._stores: dict[str, LaceMem] = {}
    self.stats = dict.fromkeys(STATS, 0) | {"abstained": 0, "lace_turns_added": 0}

  def store(self, user: str) -> LaceMem:
    """The user's LaceMem with every turn of theirs in the bank (built or extended here)."""
    if (lace := self._stores.get(user)) is None:
      lace, added = synced_lace(self.bank, user, self.encoder, progress=self.progress,
                                rebuild=self._rebuild)
      self._stores[user] = lace
    else:
      added = add_missing_turns(lace, self.bank, user)
    self.stats["lace_turns_added"] += added
    # Questions are embedded afresh (never cached): by the model's anchor when there is one.
    lace.query_encoder = (self.model.anchor if self.model is not None
                          else self.encoder.with_cache(None))
    return lace

  def recall(self, user: str, query: str) -> tuple[IrisResult | None, LaceMem]:
    """IRIS's result for the query over the user's LaceMem (None when it holds no facts)."""
    store = self.store(user)
    if not len(store):
      return None, store
    if self.model is not None:
      judge, refiner = LearnedJudge(self.model.judge, store), EmbeddingRefiner(self.model.refine)
    else:
      judge, refiner = HeuristicJudge(), None
    return iris_retrieve(store, query, judge=judge, settings=self.settings, refiner=refiner), store

  def respond(self, user: str, query: str) -> IrisResponse:
    result, store = self.recall(user, query)
    turns = tuple(store.raw(t) for t in result.top_turns(self.m)) if result else ()
    self.stats["queries"] += 1
    self.stats["abstained"] += bool(result is not None and result.abstained)
    answer, cited, failure, error = self._ask(query, [turn_prompt_text(t) for t in turns],
                                              result is not None and result.abstained)
    session_id = self._record_exchange(user, query, answer)
    self.stats["lace_turns_added"] += add_missing_turns(store, self.bank, user)
    return IrisResponse(answer, turns, cited, result, failure, error, session_id)

  def tell(self, user: str, text: str) -> str:
    """Records a statement and adds it to the LaceMem at once, as evidence for later questions."""
    store = self.store(user)
    session_id = self._record(user, [("user", text, "statement")])
    self.stats["lace_turns_added"] += add_missing_turns(store, self.bank, user)
    return session_id

  def kept(self) -> str:
    return "IRIS serves: its models learn offline (rmmjax train --set learner=iris)"
