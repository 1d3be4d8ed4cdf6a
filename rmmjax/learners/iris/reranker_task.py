"""A reranker learning to rank the evidence IRIS gathers (units `lace`; docs/command-line.md):
an embedding reranker, or the cross reranker (cross_facts.py), over logged episodes."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from rmmjax import core, distributed
from rmmjax.config import Config
from rmmjax.learners.cross.config import Cross
from rmmjax.memory.lace import LaceMem, LaceSettings
from rmmjax.encode.protocol import require_bert
from rmmjax.replay.candidates import conversation_fingerprint
from rmmjax.learners.iris.cross_facts import episode_scores, with_pair_tokens
from rmmjax.learners.iris.episodes import (IrisEpisode, RewardMix, collect_episodes,
                                         episodes_batch, fuse_with_order, pretrain_on_episodes,
                                         reinforce_steps)
from rmmjax.replay.protocols import Protocol
from rmmjax.io.record import replay_record
from rmmjax.learners.cross.spec import cross_spec
from rmmjax.retrieve.iris import IRIS_PRESETS
from rmmjax.retrieve.judges import HeuristicJudge
from rmmjax.learners.cross.task import (check_cross_workdir, cross_initial_params,
                                        pretrain_cross, with_pairs_read)
from rmmjax.learners.embedding.model import EMBEDDING, batch_scores
from rmmjax.replay.inputs import replay_inputs
from rmmjax.learners.task import Task


@dataclasses.dataclass(frozen=True)
class LoggedConversation:
  conversation_id: str
  fingerprint: str
  episodes: tuple[IrisEpisode, ...]  # (empty where only the record names the conversation)


class IrisTask(Task):
  """The training loop's task (see task.py) for units `lace`."""

  @classmethod
  def check_run(cls, cfg, encoder, workdir) -> None:
    if isinstance(cfg.learning, Cross):  # the cross reranker's checks, as on turns
      check_cross_workdir(cfg, encoder, workdir)

  def __init__(self, cfg: Config, encoder=None, progress: bool = False, workdir=None):
    self.cfg, self.hp, self._progress = cfg, cfg.hparams(), progress
    data, conversations, _, encoder = replay_inputs(cfg, encoder)
    self.cross = isinstance(cfg.learning, Cross)
    if self.cross:
      require_bert(encoder, "variant=cross")
    self.spec = (cross_spec(cfg, encoder.cfg) if self.cross
                 else dataclasses.replace(cfg.core_spec(), model=EMBEDDING))
    # A cross reranker's pretraining takes minutes: a resume should not redo it.
    self.checkpoint_pretrained = self.cross
    settings, judge = IRIS_PRESETS[cfg.iris_evidence.preset], HeuristicJudge()
    max_evidence = max(len(set(q.evidence)) for c in conversations for q in c.questions)
    logged = []
    for conv in tqdm(conversations, desc="IRIS episodes", unit="conversation",
                     disable=not progress):
      store = LaceMem.from_conversation(conv, encoder,
                                        settings=LaceSettings(retrieval=cfg.retriever))
      episodes = collect_episodes(store, conv.questions, lambda q: judge, settings, cfg.k,
                                  max_evidence)
      logged.append(LoggedConversation(conv.conversation_id, conversation_fingerprint(conv),
                                       tuple(episodes)))
    split = len(logged) - cfg.holdout
    self.train_convs, self.test_convs = logged[:split], logged[split:]
    self.train_episodes = [e for c in self.train_convs for e in c.episodes]
    self.test_episodes = [e for c in self.test_convs for e in c.episodes]
    self.record = replay_record(cfg, data, encoder, self.train_convs, self.test_convs) | {
        "learner": "reranker", "query_encoder": None, "query_encoder_path": None,
        "iris": cfg.iris_evidence.preset,
        "citation_reward": cfg.iris_evidence.citation_reward,
        "verdict_reward": cfg.iris_evidence.verdict_reward}
    params = None
    if self.cross:  # every episode's (question, fact) pairs tokenised and counted
      (self.train_episodes, train), (self.test_episodes, test) = (
          with_pair_tokens(e, encoder.tokenizer, cfg.cross.max_length)
          for e in (self.train_episodes, self.test_episodes))
      counts = {key: train[key] + test[key] for key in ("pairs", "truncated")}
      self.record, self.input_notes = with_pairs_read(self.record, cfg, encoder, train["length"],
                                                      counts)
      params = cross_initial_params(encoder, cfg.k, cfg.cross.prior_scale)
    self.mix = RewardMix(cfg.iris_evidence.citation_reward, cfg.iris_evidence.verdict_reward)
    self.judge = judge
    self.template = core.init_state(self.spec, self.hp, params)
    self.eval_queries = len(self.test_episodes)
    self._scores = jax.jit(batch_scores, static_argnums=3)
    self._data_parallel(cfg.devices, {"batch": cfg.batch})  # each update's batch split over it

  def initial_state(self) -> core.TrainState:
    """Pretrained on the training episodes' labels (mode pretrain+rl), optimizer reset."""
    cfg, state, learning = self.cfg, self.template, self.cfg.learning
    pretrains = Protocol(mode=cfg.mode, pretrain_epochs=learning.pretrain_epochs).pretrains
    if self.cross and pretrains:
      # From the host over a few candidates per episode: one step over all K pairs of every
      # episode would not fit in one program.
      return pretrain_cross(self, episodes_batch(self.train_episodes))
    if pretrains:
      state, self.pretrain_loss = pretrain_on_episodes(
          state, self.train_episodes, learning.pretrain_epochs, learning.pretrain_lr,
          learning.pretrain_tau, self.mesh)
    return state

  def advance(self, state: core.TrainState, n: int):
    return reinforce_steps(state, self.train_episodes, lambda e: self.judge, self.mix, n,
                           self.mesh)

  def evaluate(self, state: core.TrainState) -> dict:
    """Held-out Recall@M over the episodes' candidates: IRIS's order, the reranker's fused with
    it (recall_at_m: `eval --iris --reranker`'s default), the reranker's alone, all K."""
    if not self.test_episodes:
      return {}
    batch = episodes_batch(self.test_episodes)
    params = distributed.gather(state.params)
    return self._metrics(batch, episode_scores(params, self.spec, self.test_episodes,
                                               self._progress) if self.cross else
                         np.asarray(self._scores(params, batch.q_BxD, batch.mem_BxKxD,
                                                 self.spec)))

  def evaluate_first(self) -> dict:
    """A fresh cross reranker keeps IRIS's order: known without reading a pair."""
    if not (self.cross and self.test_episodes):
      return super().evaluate_first()
    batch = episodes_batch(self.test_episodes)
    prior = np.asarray(self.template.params["rank_bias"], np.float32)
    return self._metrics(batch, np.broadcast_to(prior, np.asarray(batch.mask_BxK).shape))

  def _metrics(self, batch, scores) -> dict:
    m, mask = self.spec.m, np.asarray(batch.mask_BxK)
    fused = np.full(scores.shape, -np.inf)
    for i, row in enumerate(mask):  # the valid candidates are a prefix of each row
      fused[i, :row.sum()] = fuse_with_order(scores[i, :row.sum()])
    top = lambda s: jax.vmap(core.top_m, in_axes=(0, None, 0))(jnp.asarray(s), m, mask)  # noqa: E731
    recall = lambda order: float(core.recall_at_m(order, batch))  # noqa: E731
    in_order = jnp.asarray(np.where(mask, np.arange(mask.shape[1]), -1))
    return {"recall_at_m_base": recall(in_order[:, :m]), "recall_at_m": recall(top(fused)),
            "recall_at_m_alone": recall(top(scores)), "recall_at_k": recall(in_order)}
