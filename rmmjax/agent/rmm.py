"""The online RMM agent: retrieve, rerank, answer with citations, learn from them, reflect
(**chat** in docs/command-line.md). The exchange is written before its reward counts, so an
update never learns from an answer the bank lost."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core
from rmmjax.agent.base import STATS, ChatAgent, Reply
from rmmjax.agent.workdir import AgentWorkdir
from rmmjax.learners.loaded import LoadedReranker
from rmmjax.llm.base import LLM
from rmmjax.memory.bank import MemoryBank
from rmmjax.memory.records import Memory, UnknownRecord
from rmmjax.memory.search import BankSearch
from rmmjax.memory.topic_units import topic_text
from rmmjax.learners.embedding.reader import EmbeddingReader
from rmmjax.learners.registry import reader, with_model
from rmmjax.encode.protocol import encoder_identity
from rmmjax.io.record import mismatches

# What the agent's memories are, for the fit check of a trained reranker.
UNITS = "topic"


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
  # The rank prior's start, -prior_scale * log(1 + position): at 1 a fresh reranker keeps its
  # candidates' order instead of the embeddings' own (learning from citations alone from there
  # ends above the hybrid order, +0.004; from the flat start 0.051 below it, on LoCoMo's dev
  # file: experiments/results/sweep_linear_rl_prior.md).
  prior_scale: float = 1.0
  seed: int = 0

  def __post_init__(self):
    # The command line refuses a retriever, K, M or batch size first; --tau and --lr come as
    # given (or from a reranker's run).
    for name, expected, ok in (
        ("tau", "a positive finite number", lambda v: math.isfinite(v) and v > 0),
        ("prior_scale", "a finite number >= 0", lambda v: math.isfinite(v) and v >= 0),
        ("lr", "a positive finite number", lambda v: math.isfinite(v) and v > 0)):
      if not ok(getattr(self, name)):
        raise ValueError(f"{name}={getattr(self, name)!r}: expected {expected}")


@dataclasses.dataclass(frozen=True)
class Response(Reply):
  answer: str | None  # None without an LLM, or when the LLM failed
  memories: tuple[Memory, ...]  # the M memories shown, in the order they were numbered
  scores: tuple[float, ...]  # the reranker's score of each shown memory
  cited: tuple[int, ...]  # positions in `memories` the answer cited
  rewarded: bool  # the citations became rewards (an LLM answered, well-formed)
  updated: bool  # this response completed a batch and the reranker was updated
  failure: str | None = None  # "llm_error" or "malformed" when the LLM gave no usable answer
  error: str = ""  # what the failure was
  session_id: str | None = None  # where respond recorded the exchange

  @property
  def shown_texts(self) -> list[str]:
    return [memory.summary for memory in self.memories]


def memory_prompt_text(memory: Memory) -> str:
  """A memory as the generator sees it: its summary, then the dated turns it came from."""
  snippets = "\n".join(f"  [{s.date}] {s.text}" for s in memory.snippets)
  return f"{memory.summary}\n{snippets}" if snippets else memory.summary


class Agent(ChatAgent):
  """The RMM loop over one memory bank (every call names the user it serves)."""

  def __init__(self, bank: MemoryBank, encoder, settings: AgentSettings = AgentSettings(), *,
               llm: LLM | None = None, workdir: Path | None = None, query_encoder=None,
               reranker: LoadedReranker | None = None, allow_mismatch: bool = False):
    self.bank, self.encoder, self.settings, self.llm = bank, encoder, settings, llm
    self.query_encoder = query_encoder or encoder
    # A tuned query encoder's identity; None when queries are embedded by the memories' encoder
    # (an uncached copy of it included).
    tuned = encoder_identity(self.query_encoder)
    self.tuned_query_encoder = None if tuned == encoder_identity(encoder) else tuned
    self.search = BankSearch(bank, encoder_identity(encoder), settings.retriever)
    self.learning = settings.learn and llm is not None
    hp = core.HParams.create(tau=settings.tau, lr=settings.lr, baseline=settings.baseline,
                             baseline_kind=settings.baseline_kind, seed=settings.seed)
    spec = with_model(core.CoreSpec(dim=encoder.dim, k=settings.k, m=settings.m,
                                    batch=settings.batch, rank_prior=True,
                                    prior_scale=settings.prior_scale))
    # How the reranker reads its candidates: the embeddings (the agent's own reranker, the
    # linear and MLP ones), or the query beside each candidate's text (a cross reranker).
    self._reader = (reader(reranker, encoder) if reranker is not None
                    else EmbeddingReader(encoder.dim, "the agent's reranker"))
    self.mismatches = [] if reranker is None else self._check_reranker(reranker, allow_mismatch)
    if reranker is not None:
      spec = dataclasses.replace(reranker.spec, m=settings.m, batch=settings.batch)
    self.state = core.init_state(spec, hp, reranker.params if reranker is not None else None)
    self.stats = dict.fromkeys(STATS, 0)
    self._pending: list[tuple] = []
    options = self._reader.compiler_options()
    self._scores = jax.jit(core.scores, static_argnums=2, compiler_options=options)
    self._update = jax.jit(core.reinforce_update, compiler_options=options)
    self.workdir = None
    if workdir is not None:
      fixed = dataclasses.asdict(settings) | {
          "reranker": reranker.source if reranker else None,
          "query_encoder": self.tuned_query_encoder, "encrypted": bank.cipher.encrypted}
      self.workdir = AgentWorkdir(Path(workdir), fixed, learning=self.learning, cipher=bank.cipher)
      self._restore()

  def _check_reranker(self, reranker: LoadedReranker, allow_mismatch: bool) -> list[str]:
    if reranker.spec.dim != self.encoder.dim or reranker.spec.k != self.settings.k:
      # Weights of other shapes cannot score these candidates at all, mismatch allowed or not.
      raise ValueError(f"the reranker {reranker.source} scores {reranker.spec.k} candidates "
                       f"of dimension {reranker.spec.dim}; here {self.settings.k} are "
                       f"retrieved (--candidates) with embeddings of dimension "
                       f"{self.encoder.dim}")
    wanted = {"units": UNITS, "retriever": self.settings.retriever,
              "encoder": encoder_identity(self.encoder), "dim": self.encoder.dim,
              "k": self.settings.k, "query_encoder": self.tuned_query_encoder}
    found = mismatches(reranker.record, wanted, "served")
    if found and not allow_mismatch:
      units = ("; a bank's memories are topics (what Prospective Reflection keeps of each "
               "session, scored by their summary): train a reranker for a bank with --set "
               "units=topic," if reranker.record.get("units") != UNITS else ":")
      raise ValueError(f"the reranker {reranker.source} does not fit this agent's memories ("
                       + "; ".join(found) + f"){units} use it with the settings it was trained "
                       "with, or pass --allow-mismatch to use it anyway")
    return found

  # Persistence ------------------------------------------------------------------------------

  def _restore(self) -> None:
    state, pending, stats = self.workdir.restore(self.state)
    self.state, self._pending = state, pending
    self.stats.update({k: v for k, v in stats.items() if k in self.stats})
    if len(self._pending) >= self.state.spec.batch and self.learning:
      self._learn()  # killed after the batch's last answer was kept, before its update
      self.save()
    self.stats["updates"] = int(self.state.step)

  def save(self, pending: bool = True) -> None:
    """Writes the pending answers (unless `pending` is False), then the counters (updates are
    checkpointed when they happen)."""
    if self.workdir is not None and self.learning:
      if pending:
        self.workdir.save_pending(int(self.state.step), self._pending)
      self.workdir.save_stats(self.stats, int(self.state.step))

  def kept(self) -> str:
    if not self.learning:
      return "serving: the reranker was not updated"
    if self.workdir is None:
      return "the reranker's updates of this run are not kept (no --workdir)"
    return (f"the reranker at update {self.stats['updates']} (checkpointed in "
            f"{self.workdir.path}) and {self.pending} rewarded answers waiting for the next "
            f"update")

  def close(self) -> None:
    """Saves and releases the workdir (another process may then learn in it)."""
    if self.workdir is not None:
      self.save()
      self.workdir.close()

  @property
  def pending(self) -> int:
    """Rewarded answers waiting for the next update."""
    return len(self._pending)

  # The loop ---------------------------------------------------------------------------------

  def _require_user(self, user: str) -> None:
    if not self.bank.has_user(user):
      known = self.bank.users()
      raise UnknownRecord(f"user {user!r} is not in {self.bank.where} (it has "
                          f"{len(known)} users{': ' + ', '.join(known[:5]) if known else ''}"
                          f"{'...' if len(known) > 5 else ''}); add the user first")

  def _batch(self, q_BxD, mem_BxKxD, mask_BxK, arrays) -> core.Batch:
    """Queries' candidates as a batch, with the reranker's own inputs if any (no labels:
    citations teach)."""
    inputs = self._reader.inputs(tuple(arrays)) if arrays else None
    return self._reader.pack(core.Batch(q_BxD, mem_BxKxD, mask_BxK, inputs=inputs))

  def _select(self, q_D: np.ndarray, mem_KxD: np.ndarray, mask_K: np.ndarray, tokens,
              sample: bool) -> tuple:
    """(the candidates' scores, the M positions selected: Gumbel-sampled or the top M)."""
    spec = self.state.spec
    batch = self._batch(q_D[None], mem_KxD[None], mask_K[None],
                        None if tokens is None else [x[None] for x in tokens])
    scores_K = np.asarray(self._scores(self.state.params, batch, spec))[0]
    if sample:
      key = jax.random.fold_in(jax.random.PRNGKey(self.settings.seed), self.stats["queries"])
      selected = core.gumbel_top_m(key, jnp.asarray(scores_K), spec.m, self.state.hparams.tau,
                                   jnp.asarray(mask_K))
    else:
      selected = core.top_m(jnp.asarray(scores_K), spec.m, jnp.asarray(mask_K))
    return scores_K, np.asarray(selected)

  def _candidates(self, user: str, query: str) -> tuple:
    """The query's embedding, its K candidates (padded, masked), their memories, and (for a
    cross reranker) the pair tokens of the query with each memory's text."""
    self._require_user(user)
    spec = self.state.spec
    index = self.search.index(user)
    q_D = self.query_encoder.encode([query])[0]
    rows = index.rank(query, q_D, self.settings.retriever, spec.k)
    mem_KxD = np.zeros((spec.k, spec.dim), np.float32)  # a bank may hold fewer than K
    mask_K = np.arange(spec.k) < len(rows)
    if len(rows):
      mem_KxD[:len(rows)] = index.emb_NxD[rows]
    memories = [index.memories[r] for r in rows]
    # The text a topic unit holds, which a reranker reading text trained on (not the prompt's).
    texts = [topic_text(m) for m in memories] + [None] * (spec.k - len(memories))
    tokens = self._reader.candidate_arrays(query, texts)
    return q_D, mem_KxD, mask_K, memories, tokens

  def recall(self, user: str, query: str) -> tuple[list[Memory], list[float]]:
    """The M memories that would be handed to the LLM and their scores (top M, no learning)."""
    q_D, mem_KxD, mask_K, candidates, tokens = self._candidates(user, query)
    scores_K, selected_M = self._select(q_D, mem_KxD, mask_K, tokens, sample=False)
    top = [int(s) for s in selected_M if s >= 0]
    return [candidates[s] for s in top], [float(scores_K[s]) for s in top]

  def tell(self, user: str, text: str) -> str:
    """Records a statement, which reflection takes into the topic memories."""
    self._require_user(user)
    session_id = self._record(user, [("user", text, "statement")])
    self.save()
    return session_id

  def respond(self, user: str, query: str, *, record: bool = True) -> Response:
    """Answers one query, records the exchange (unless `record` is False), then learns."""
    q_D, mem_KxD, mask_K, candidates, tokens = self._candidates(user, query)
    scores_K, selected_M = self._select(q_D, mem_KxD, mask_K, tokens, sample=self.learning)
    taken = [int(s) for s in selected_M if s >= 0]
    shown = tuple(candidates[s] for s in taken)
    self.stats["queries"] += 1
    answer, cited, failure, error = self._ask(query, [memory_prompt_text(m) for m in shown])
    session_id = self._record_exchange(user, query, answer) if record else None
    rewarded = self.llm is not None and failure is None and bool(shown)
    updated = False
    if rewarded and self.learning:
      # Shown memory i is selected position i (empty positions come last): +1 cited, -1 not.
      rewards_M = np.where(selected_M >= 0, -1.0, 0.0).astype(np.float32)
      rewards_M[list(cited)] = 1.0
      self._pending.append((q_D, mem_KxD, mask_K.astype(bool), selected_M.astype(np.int32),
                            rewards_M) + (tokens if tokens is not None else ()))
      if len(self._pending) >= self.state.spec.batch:
        # The counters first: a kill between the update's checkpoint and save() must not leave
        # a restored agent with fewer queries than its updates learnt from (the next query's
        # Gumbel noise is keyed by that count).
        self.save(pending=False)
        self._learn()
        updated = True
    self.save()
    return Response(answer, shown, tuple(float(scores_K[s]) for s in taken), cited, rewarded,
                    updated, failure, error, session_id)

  def _learn(self) -> None:
    batch_size = self.state.spec.batch
    q, mem, mask, selected, rewards, *tokens = (np.stack(x)
                                                for x in zip(*self._pending[:batch_size]))
    state, _ = self._update(self.state, self._batch(q, mem, mask, tokens), selected, rewards)
    if self.workdir is not None:  # the pending answers left follow in save()
      self.workdir.save_checkpoint(state)
    # Only now is the batch dropped: an interrupt before this line (the first update compiles,
    # which takes a while) leaves it pending on the old state, to be applied on restore.
    self.state, self._pending = state, self._pending[batch_size:]
    self.stats["updates"] = int(self.state.step)

  def end_session(self, user: str):
    self._require_user(user)
    report = super().end_session(user)
    self.save()
    return report
