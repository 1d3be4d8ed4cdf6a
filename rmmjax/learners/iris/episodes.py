"""The RMM reranker inside IRIS: it ranks the evidence of an episode (one question's IRIS run,
logged). reward = citation * (+1 cited, -1 not) + verdict * verdict_reward(M facts)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, final

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core, distributed
from rmmjax.core import replay as core_replay
from rmmjax.learners.cross.pairs import pack_batch
from rmmjax.learners.embedding.model import batch_scores
from rmmjax.retrieve.evidence import EvidenceStore, Fact, RawTurn
from rmmjax.retrieve.iris import IrisSettings, iris_retrieve
from rmmjax.retrieve.fusion import rrf_scores
from rmmjax.retrieve.refine import QueryRefiner
from rmmjax.retrieve.judges import SufficiencyJudge, verdict_reward

_EPISODE_STREAM = 6  # key stream, after core.replay's pretraining, replay and held-out (3-5)


class EmbeddedStore(EvidenceStore, Protocol):
  """An evidence store that exposes the embeddings its dense search compares (LaceMem does)."""

  def query_vector(self, query: str) -> np.ndarray: ...  # (D,)

  def fact_vectors(self, fact_ids: list[int]) -> np.ndarray: ...  # (len(fact_ids), D)


@final
@dataclasses.dataclass(frozen=True)
class IrisEpisode:
  question: str
  category: str
  facts: tuple[Fact, ...]  # the first K facts of the final order (fewer when fewer were found)
  raws: Mapping[str, RawTurn]  # the turns of those facts, for a judge
  q_D: np.ndarray
  mem_KxD: np.ndarray  # padded with zero rows to K
  evidence_KxE: np.ndarray  # fact k comes from evidence turn e (padded with False)
  num_evidence: int
  inputs: Any = None  # a learner's own inputs, leading axis K (cross_facts.with_pair_tokens)


def collect_episodes(store: EmbeddedStore, questions: Sequence, judge_for: Callable,
                     settings: IrisSettings, k: int, max_evidence: int,
                     refiner: QueryRefiner | None = None) -> list[IrisEpisode]:
  """Runs IRIS without a reranker on every question, judged by `judge_for(question)`, and logs
  its first k facts (`refiner` writes the refinement queries; default: the rule-based one)."""
  episodes = []
  for q in questions:
    evidence = list(dict.fromkeys(q.evidence))
    if len(evidence) > max_evidence:
      raise ValueError(f"question {q.question!r:.80} has {len(evidence)} evidence turns; "
                       f"max_evidence={max_evidence} would undercount its recall")
    result = iris_retrieve(store, q.question, category=q.category, judge=judge_for(q),
                           settings=settings, refiner=refiner)
    facts = result.facts[:k]
    query = np.asarray(store.query_vector(q.question), np.float32)
    mem = np.zeros((k, query.shape[0]), np.float32)
    if facts:
      mem[:len(facts)] = store.fact_vectors([f.fact_id for f in facts])
    labels = np.zeros((k, max_evidence), bool)
    for i, fact in enumerate(facts):
      labels[i, :len(evidence)] = [fact.turn_id == turn for turn in evidence]
    episodes.append(IrisEpisode(
        q.question, q.category, tuple(facts), {f.turn_id: store.raw(f.turn_id) for f in facts},
        query, mem, labels, len(evidence)))
  return episodes


def episodes_batch(episodes: Sequence[IrisEpisode]) -> core.Batch:
  """The episodes in the core's Batch layout; relevant = from an evidence turn."""
  k = episodes[0].mem_KxD.shape[0]
  mask = np.arange(k)[None, :] < np.array([len(e.facts) for e in episodes])[:, None]
  evidence = np.stack([e.evidence_KxE for e in episodes])
  inputs = jax.tree.map(lambda *xs: np.stack(xs), *[e.inputs for e in episodes])
  return core.Batch(inputs=inputs,  # (the host packs a cross reranker's tokens)
      q_BxD=jnp.asarray(np.stack([e.q_D for e in episodes])),
      mem_BxKxD=jnp.asarray(np.stack([e.mem_KxD for e in episodes])),
      mask_BxK=jnp.asarray(mask), relevant_BxK=jnp.asarray(evidence.any(-1)),
      num_relevant_B=jnp.asarray([e.num_evidence for e in episodes], jnp.int32),
      evidence_BxKxE=jnp.asarray(evidence))


_pretrain = jax.jit(core_replay.pretrain, static_argnums=(2, 3))


def pretrain_on_episodes(state: core.TrainState, episodes: Sequence[IrisEpisode], epochs: int,
                         lr: float, tau: float,
                         mesh=None) -> tuple[core.TrainState, np.ndarray]:
  """Listwise pretraining at (lr, tau): the state, its optimizer reset, and each step's loss."""
  hp = state.hparams
  state = state.replace(hparams=hp.replace(lr=jnp.asarray(lr, jnp.float32),
                                           tau=jnp.asarray(tau, jnp.float32)))
  sharding = None if mesh is None else distributed.batch_sharding(mesh, axis=1)
  state, loss = _pretrain(state, episodes_batch(episodes), epochs, sharding)
  return core_replay.restart_optimizer(state, hp), distributed.gather(loss)


@final
@dataclasses.dataclass(frozen=True)
class RewardMix:
  """Weights of the two rewards a selected fact earns."""

  citation: float = 1.0  # simulated citations from the evidence labels: +1 cited, -1 not
  verdict: float = 0.0  # the judge's verdict_reward on the selected facts (label-free)
  # (both >= 0 and not both 0: the iris_evidence section's keys check that)


def mixed_rewards(cited_BxM: jax.Array, selected_BxM: jax.Array, verdict_B: jax.Array,
                  mix: RewardMix) -> jax.Array:
  """rewards_BxM (see the module's docstring); 0 where nothing was selected."""
  return (mix.citation * core.citation_rewards(cited_BxM, selected_BxM)
          + mix.verdict * jnp.where(selected_BxM >= 0, verdict_B[:, None], 0.0))


@jax.jit
def _sample(state: core.TrainState, batch: core.Batch, key: jax.Array):
  """Gumbel top-M of the reranker's scores, its simulated citations and its recall."""
  spec, hp = state.spec, state.hparams
  b, k = batch.mask_BxK.shape
  u = jax.random.uniform(key, (b, k + spec.m), minval=jnp.finfo(jnp.float32).tiny)
  scores = core.scores(state.params, batch, spec)
  selected = core.sample_selection(scores, batch.mask_BxK, -jnp.log(-jnp.log(u[:, :k])), spec,
                                   hp.tau)
  relevant = jnp.take_along_axis(batch.relevant_BxK, jnp.maximum(selected, 0), -1)
  cited = core.simulate_citations(u[:, k:], relevant, selected, hp.p_rel, hp.p_irr)
  return selected, cited, core.recall_at_m(selected, batch)


_update = jax.jit(core.reinforce_update)


def judge_selection(judge: SufficiencyJudge, episode: IrisEpisode,
                    selected_M: np.ndarray) -> float:
  """The verdict reward of the selected facts alone (0 for a malformed verdict)."""
  shown = [episode.facts[i] for i in selected_M if i >= 0]
  verdict = judge.judge(episode.question, shown, {f.turn_id: episode.raws[f.turn_id]
                                                  for f in shown}, category=episode.category)
  return 0.0 if verdict.malformed else verdict_reward(verdict.label, verdict.confidence)


def step_episodes(episodes: Sequence[IrisEpisode], batch: int, seed: int,
                  step: int) -> list[IrisEpisode]:
  """The episodes of update `step` (0-based): passes over the episodes in batches (the last
  partial batch of a pass dropped), each pass in its own order drawn from (seed, pass), so a
  resumed run replays exactly the batches an uninterrupted one would."""
  distributed.check_fills(len(episodes), batch, "episodes")
  per_pass = len(episodes) // batch
  order = np.random.default_rng([seed, step // per_pass]).permutation(len(episodes))
  at = (step % per_pass) * batch
  return [episodes[i] for i in order[at:at + batch]]


def reinforce_steps(state: core.TrainState, episodes: Sequence[IrisEpisode],
                    judge_for: Callable, mix: RewardMix, num_steps: int,
                    mesh=None) -> tuple[core.TrainState, dict]:
  """num_steps REINFORCE updates, update t on `step_episodes(..., state.step)` (`judge_for(
  episode)` judges its selected facts when mix.verdict > 0): the state and per-step metrics, the
  core's plus the mean verdict reward, the citation rate and the sampled selection's recall."""
  parallel = mesh is not None and mesh.devices.size > 1
  if parallel:
    state = distributed.replicate(state, mesh)
  root = jax.random.fold_in(state.key, _EPISODE_STREAM)
  seed = int(state.hparams.seed)
  logs: dict[str, list[float]] = {}
  for _ in range(num_steps):
    chunk = step_episodes(episodes, state.spec.batch, seed, int(state.step))
    batch = episodes_batch(chunk)
    if batch.inputs is not None:  # a cross reranker reads the pairs, packed
      batch = pack_batch(batch, mesh.devices.size if parallel else 1)
    if parallel:
      batch = distributed.shard_leading(batch, mesh)
    selected, cited, recall = _sample(state, batch, jax.random.fold_in(root, state.step))
    selected_np = distributed.gather(selected)
    verdicts = np.array([judge_selection(judge_for(e), e, s) if mix.verdict > 0 else 0.0
                         for e, s in zip(chunk, selected_np)], np.float32)
    verdicts_B = distributed.shard_leading(verdicts, mesh) if parallel else jnp.asarray(verdicts)
    state, metrics = _update(state, batch, selected, mixed_rewards(cited, selected, verdicts_B,
                                                                   mix))
    taken = max(int(np.sum(selected_np >= 0)), 1)
    metrics = {name: float(v) for name, v in distributed.gather(metrics).items()} | {
        "verdict_reward": float(verdicts.mean()), "recall_at_m": float(distributed.gather(recall)),
        "citation_rate": float(np.sum(distributed.gather(cited))) / taken}
    for name, value in metrics.items():
      logs.setdefault(name, []).append(value)
  return state, {name: np.array(values) for name, values in logs.items()}


RERANK_MODES = ("fused", "alone")


def fuse_with_order(scores_K: np.ndarray, fusion_c: float = 60.0) -> np.ndarray:
  """Reciprocal-rank fusion of the order the scores give and the candidates' own order:
  1 / (c + 1 + rank by score) + 1 / (c + 1 + position), ties in score kept in position order."""
  by_score = np.argsort(-np.asarray(scores_K, np.float64), kind="stable")
  return rrf_scores([by_score, np.arange(len(by_score))], len(by_score), fusion_c)


@functools.partial(jax.jit, static_argnums=3)
def _score_one(params, q_D: jax.Array, m_KxD: jax.Array, spec: core.CoreSpec) -> jax.Array:
  return batch_scores(params, q_D[None], m_KxD[None], spec)[0]


class FactReranker:
  """A trained reranker as IRIS's `reranker(question, facts) -> scores` of the first spec.k facts
  (later ones rank after them). mode "fused" fuses its order with the order given, so it lifts
  facts without discarding what IRIS's searches knew (alone, it starts from dense similarity,
  below IRIS's hybrid order: experiments/results/iris_reranker.md)."""

  def __init__(self, params, spec: core.CoreSpec, store: EmbeddedStore, mode: str = "fused"):
    self.params, self.spec, self.store, self.mode = params, spec, store, mode

  def _head_scores(self, question: str, head: list[Fact]) -> np.ndarray:
    mem = np.zeros((self.spec.k, self.spec.dim), np.float32)
    mem[:len(head)] = self.store.fact_vectors([f.fact_id for f in head])
    query = np.asarray(self.store.query_vector(question), np.float32)
    return np.asarray(_score_one(self.params, query, mem, self.spec), np.float64)[:len(head)]

  def __call__(self, question: str, facts: Sequence[Fact]) -> list[float]:
    head = list(facts[:self.spec.k])
    if not head:
      return []
    scores = self._head_scores(question, head)
    if self.mode == "fused":
      scores = fuse_with_order(scores)
    low = float(scores.min())
    return [float(s) for s in scores] + [low - 1.0 - i for i in range(len(facts) - len(head))]
