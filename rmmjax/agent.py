"""The online RMM agent: retrieve, rerank, answer with citations, learn from them, reflect.

`respond(user, query)` retrieves the top K of the user's memories (BM25, dense over the stored
embeddings, or their fusion), selects M with the reranker (Gumbel sampling while learning, the
top M when serving), asks the LLM for an answer that cites the numbered memories it used, turns
the citations into rewards (+1 cited, -1 shown but not cited), and after every `batch` rewarded
responses applies one REINFORCE update through the core's `reinforce_update`. Malformed replies
and citations of memories that were not shown earn nothing and are counted; an LLM that fails
after its retries is counted too, and the agent keeps serving. `end_session(user)` runs
Prospective Reflection on the session's turns. With a workdir the reranker is checkpointed
(Orbax) every `checkpoint_every` updates and restored on the next start.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core
from rmmjax.io.checkpoint import Checkpointer
from rmmjax.io.reranker_load import LoadedReranker
from rmmjax.io.workdir import atomic_write_json
from rmmjax.llm.base import LLM, LLMError
from rmmjax.llm.parse import parse_answer
from rmmjax.llm.prompts import answer_with_citations
from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.records import Memory
from rmmjax.memory.reflection import OfflineReflector, Reflector, reflect_session
from rmmjax.memory.search import BankSearch
from rmmjax.replay.record import encoder_identity

STATS = ("queries", "answered", "updates", "shown", "cited", "malformed", "invalid_citations",
         "llm_errors")


@dataclasses.dataclass(frozen=True)
class AgentSettings:
  """How the agent retrieves and learns (the paper's K, M, batch; the replay config's lr)."""

  retriever: str = "hybrid"
  k: int = 20
  m: int = 5
  batch: int = 4  # rewarded responses per REINFORCE update
  tau: float = 0.5
  lr: float = 1e-4
  baseline: float = 0.0
  baseline_kind: str = "running"
  learn: bool = True  # False: serve with deterministic top M and never update
  checkpoint_every: int = 10  # updates between checkpoints (with a workdir)
  seed: int = 0

  def __post_init__(self):
    if not 1 <= self.m <= self.k:
      raise ValueError(f"m={self.m}, k={self.k}: expected 1 <= m <= k")
    if self.batch < 1 or self.checkpoint_every < 1:
      raise ValueError(f"batch={self.batch}, checkpoint_every={self.checkpoint_every}: expected "
                       "positive integers")


@dataclasses.dataclass(frozen=True)
class Response:
  answer: str | None  # None without an LLM, or when the LLM failed
  memories: tuple[Memory, ...]  # the M memories shown, in the order they were numbered
  scores: tuple[float, ...]  # the reranker's score of each shown memory
  cited: tuple[int, ...]  # positions in `memories` the answer cited
  rewarded: bool  # the citations became rewards (an LLM answered, well-formed)
  updated: bool  # this response completed a batch and the reranker was updated


def _check_query(query) -> None:
  if not isinstance(query, str) or not query.strip():
    raise ValueError(f"query must be a non-empty string, got {query!r:.100}")


def memory_prompt_text(memory: Memory) -> str:
  """A memory as the generator sees it: its summary, then the dated turns it came from."""
  snippets = "\n".join(f"  [{s.date}] {s.text}" for s in memory.snippets)
  return f"{memory.summary}\n{snippets}" if snippets else memory.summary


class Agent:
  """The RMM loop over one memory bank (every call names the user it serves)."""

  def __init__(self, bank: MemoryBank, encoder, settings: AgentSettings = AgentSettings(), *,
               llm: LLM | None = None, reflector: Reflector | None = None,
               workdir: Path | None = None, reranker: LoadedReranker | None = None,
               query_encoder=None):
    self.bank, self.encoder, self.settings, self.llm = bank, encoder, settings, llm
    self.query_encoder = query_encoder or encoder
    self.reflector = reflector or OfflineReflector(encoder)
    self.search = BankSearch(bank, encoder_identity(encoder), settings.retriever)
    self.learning = settings.learn and llm is not None
    hp = core.HParams.create(tau=settings.tau, lr=settings.lr, baseline=settings.baseline,
                             baseline_kind=settings.baseline_kind, seed=settings.seed)
    spec = core.CoreSpec(dim=encoder.dim, k=settings.k, m=settings.m, batch=settings.batch,
                         rank_prior=True)
    if reranker is not None:
      if (reranker.spec.dim, reranker.spec.k, reranker.spec.m) != (spec.dim, spec.k, spec.m):
        raise ValueError(f"the reranker {reranker.source} scores k={reranker.spec.k}, "
                         f"m={reranker.spec.m} candidates of dimension {reranker.spec.dim}; the "
                         f"agent retrieves k={spec.k}, m={spec.m} of dimension {spec.dim}")
      spec = dataclasses.replace(reranker.spec, batch=settings.batch)
    self.state = core.init_state(spec, hp)
    if reranker is not None:
      self.state = self.state.replace(params=reranker.params,
                                      opt_state=core.adam_init(reranker.params))
    self.stats = dict.fromkeys(STATS, 0)
    self.workdir = Path(workdir) if workdir else None
    if self.workdir is not None:
      self._restore()
    self._pending: list[tuple] = []
    self._scores = jax.jit(core.batch_scores, static_argnums=3)
    self._update = jax.jit(core.reinforce_update)

  # Persistence ------------------------------------------------------------------------------

  def _restore(self) -> None:
    checkpointer = Checkpointer(self.workdir / "checkpoints", read_only=True)
    try:
      _, state, _ = checkpointer.restore_latest(self.state)
    finally:
      checkpointer.close()
    if state is not None:
      self.state = state
    stats = self.workdir / "agent.json"
    if stats.exists():
      self.stats.update(json.loads(stats.read_text())["stats"])

  def save(self) -> None:
    """Checkpoints the reranker and the counters (with a workdir)."""
    if self.workdir is None:
      return
    checkpointer = Checkpointer(self.workdir / "checkpoints")
    try:
      step = int(self.state.step)
      if step not in checkpointer.all_steps():
        checkpointer.save(step, self.state)
    finally:
      checkpointer.close()
    atomic_write_json(self.workdir / "agent.json",
                      {"stats": self.stats, "settings": dataclasses.asdict(self.settings)})

  # The loop ---------------------------------------------------------------------------------

  def _open_session(self, user: str) -> str:
    if not self.bank.has_user(user):
      self.bank.add_user(user)
    sessions = self.bank.sessions(user)
    if sessions and not sessions[-1].ended:
      return sessions[-1].session_id
    session_id = f"session-{len(sessions) + 1}"
    self.bank.start_session(user, session_id, datetime.date.today().isoformat())
    return session_id

  def _select(self, q_D: np.ndarray, mem_KxD: np.ndarray, mask_K: np.ndarray) -> tuple:
    spec = self.state.spec
    scores_K = np.asarray(self._scores(self.state.params, q_D[None], mem_KxD[None], spec))[0]
    if self.learning:
      key = jax.random.fold_in(jax.random.PRNGKey(self.settings.seed), self.stats["queries"])
      selected = core.gumbel_top_m(key, jnp.asarray(scores_K), spec.m, self.state.hparams.tau,
                                   jnp.asarray(mask_K))
    else:
      selected = core.top_m(jnp.asarray(scores_K), spec.m, jnp.asarray(mask_K))
    return scores_K, np.asarray(selected)

  def _candidates(self, user: str, query: str) -> tuple:
    """The query's embedding, its K candidates (padded, masked) and their memories."""
    spec = self.state.spec
    index = self.search.index(user)
    q_D = self.query_encoder.encode([query])[0]
    rows = index.rank(query, q_D, self.settings.retriever, spec.k)
    mem_KxD = np.zeros((spec.k, spec.dim), np.float32)  # a bank may hold fewer than K
    mask_K = np.arange(spec.k) < len(rows)
    if len(rows):
      mem_KxD[:len(rows)] = index.emb_NxD[rows]
    return q_D, mem_KxD, mask_K, [index.memories[r] for r in rows]

  def recall(self, user: str, query: str) -> tuple[list[Memory], list[float]]:
    """The M memories that would be handed to the LLM and their scores (top M, no learning)."""
    _check_query(query)
    if not self.bank.has_user(user):
      raise ValueError(f"user {user!r} is not in the bank")
    q_D, mem_KxD, mask_K, candidates = self._candidates(user, query)
    scores_K = np.asarray(self._scores(self.state.params, q_D[None], mem_KxD[None],
                                       self.state.spec))[0]
    top = [int(s) for s in np.asarray(core.top_m(jnp.asarray(scores_K), self.state.spec.m,
                                                 jnp.asarray(mask_K))) if s >= 0]
    return [candidates[s] for s in top], [float(scores_K[s]) for s in top]

  def ask(self, user: str, query: str) -> Response:
    """Retrieve, select, answer and learn, without recording the exchange in the bank."""
    _check_query(query)
    spec = self.state.spec
    q_D, mem_KxD, mask_K, candidates = self._candidates(user, query)
    scores_K, selected_M = self._select(q_D, mem_KxD, mask_K)
    taken = [int(s) for s in selected_M if s >= 0]
    shown = tuple(candidates[s] for s in taken)
    answer, cited, rewarded, updated = None, (), False, False
    self.stats["queries"] += 1
    if self.llm is not None:
      answer, cited, rewarded = self._answer(query, shown)
    if rewarded and self.learning:
      # Shown memory i is selected position i (empty positions come last): +1 cited, -1 not.
      rewards_M = np.where(selected_M >= 0, -1.0, 0.0).astype(np.float32)
      rewards_M[list(cited)] = 1.0
      self._pending.append((q_D, mem_KxD, mask_K, selected_M.astype(np.int32), rewards_M))
      if len(self._pending) == spec.batch:
        self._learn()
        updated = True
    return Response(answer, shown, tuple(float(scores_K[s]) for s in taken), cited, rewarded,
                    updated)

  def respond(self, user: str, query: str) -> Response:
    """Answers one query in the user's current session and appends the exchange to it."""
    _check_query(query)
    session_id = self._open_session(user)
    response = self.ask(user, query)
    n = len(self.bank.turns(user))
    self.bank.add_turns(user, session_id, [(f"{session_id}:{n + 1}", "user", query)] + (
        [(f"{session_id}:{n + 2}", "assistant", response.answer)] if response.answer else []))
    return response

  def _answer(self, query: str, shown: tuple[Memory, ...]) -> tuple:
    prompt = answer_with_citations(query, [memory_prompt_text(m) for m in shown])
    try:
      reply = self.llm.chat_structured(prompt.messages, prompt.schema)
    except LLMError:
      self.stats["llm_errors"] += 1
      return None, (), False
    parsed = parse_answer(reply, len(shown))
    self.stats["answered"] += 1
    self.stats["invalid_citations"] += parsed.invalid_citations
    if parsed.malformed:
      self.stats["malformed"] += 1
      return parsed.answer or None, (), False
    self.stats["shown"] += len(shown)
    self.stats["cited"] += len(parsed.cited)
    return parsed.answer, parsed.cited, bool(shown)

  def _learn(self) -> None:
    q, mem, mask, selected, rewards = (np.stack(x) for x in zip(*self._pending))
    self._pending.clear()
    batch = core.Batch(q_BxD=q, mem_BxKxD=mem, mask_BxK=mask,
                       relevant_BxK=np.zeros_like(mask), num_relevant_B=np.ones(len(q), np.int32))
    self.state, _ = self._update(self.state, batch, selected, rewards)
    self.stats["updates"] += 1
    if self.stats["updates"] % self.settings.checkpoint_every == 0:
      self.save()

  def end_session(self, user: str):
    """Prospective Reflection over the user's open session; returns its report."""
    sessions = self.bank.sessions(user) if self.bank.has_user(user) else []
    if not sessions or sessions[-1].ended:
      raise ValueError(f"user {user!r} has no open session to end")
    report = reflect_session(self.bank, user, sessions[-1].session_id, self.reflector,
                             self.encoder)
    self.save()
    return report
