"""A reranker learning to rank the evidence IRIS gathers (units `lace`).

Each conversation becomes a LaceMem (its retriever as the config's), every question's IRIS run
with the offline heuristic judge is logged as an episode (`rmmjax.replay.iris_reranker`), the
last `holdout` conversations are held out, and the reranker pretrains on the training episodes'
labels (mode pretrain+rl) and then learns online from simulated citations plus, with
verdict_reward > 0, the judge's verdict on the facts it selected.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from rmmjax import core, distributed
from rmmjax.config import Config
from rmmjax.memory.lace import LaceMem, LaceSettings
from rmmjax.replay.candidates import conversation_fingerprint
from rmmjax.replay.iris_reranker import (IrisEpisode, RewardMix, collect_episodes,
                                         episodes_batch, fuse_with_order, pretrain_on_episodes,
                                         reinforce_steps)
from rmmjax.replay.protocols import Protocol
from rmmjax.io.record import replay_record
from rmmjax.retrieve.iris import IRIS_PRESETS
from rmmjax.retrieve.judges import HeuristicJudge
from rmmjax.train.inputs import replay_inputs
from rmmjax.train.task import Task


@dataclasses.dataclass(frozen=True)
class LoggedConversation:
  conversation_id: str
  fingerprint: str
  episodes: tuple[IrisEpisode, ...]


class IrisTask(Task):
  """The training loop's task (see task.py) for units `lace`."""

  def __init__(self, cfg: Config, encoder=None, progress: bool = False):
    self.cfg, self.spec, self.hp = cfg, cfg.core_spec(), cfg.hparams()
    data, conversations, self.load_report, encoder = replay_inputs(cfg, encoder)
    settings, judge = IRIS_PRESETS[cfg.iris], HeuristicJudge()
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
        "iris": cfg.iris, "citation_reward": cfg.citation_reward,
        "verdict_reward": cfg.verdict_reward}
    self.mix = RewardMix(cfg.citation_reward, cfg.verdict_reward)
    self.judge = judge
    self.template = core.init_state(self.spec, self.hp)
    self.eval_queries = len(self.test_episodes)
    self._scores = jax.jit(core.batch_scores, static_argnums=3)
    self._data_parallel(cfg.devices, {"batch": cfg.batch})  # each update's batch split over it

  def initial_state(self) -> core.TrainState:
    """Pretrained on the training episodes' labels (mode pretrain+rl), optimizer reset."""
    cfg, state = self.cfg, self.template
    if Protocol(mode=cfg.mode, pretrain_epochs=cfg.pretrain_epochs).pretrains:
      state, self.pretrain_loss = pretrain_on_episodes(
          state, self.train_episodes, cfg.pretrain_epochs, cfg.pretrain_lr, cfg.pretrain_tau,
          self.mesh)
    return state

  def advance(self, state: core.TrainState, n: int):
    return reinforce_steps(state, self.train_episodes, lambda e: self.judge, self.mix, n,
                           self.mesh)

  def evaluate(self, state: core.TrainState) -> dict:
    """Held-out Recall@M over the episodes' candidates: in IRIS's order, the reranker's order
    fused with IRIS's (recall_at_m: what `eval --iris --reranker` uses by default), the
    reranker's alone, and all K candidates (the ceiling)."""
    if not self.test_episodes:
      return {}
    batch = episodes_batch(self.test_episodes)
    m, mask = self.spec.m, np.asarray(batch.mask_BxK)
    scores = np.asarray(self._scores(distributed.gather(state.params), batch.q_BxD,
                                     batch.mem_BxKxD, self.spec))
    fused = np.full(scores.shape, -np.inf)
    for i, row in enumerate(mask):  # the valid candidates are a prefix of each row
      fused[i, :row.sum()] = fuse_with_order(scores[i, :row.sum()])
    top = jax.vmap(core.top_m, in_axes=(0, None, 0))
    positions = np.broadcast_to(np.arange(mask.shape[1]), mask.shape)
    in_order = jnp.asarray(np.where(mask, positions, -1))
    return {"recall_at_m_base": float(core.recall_at_m(in_order[:, :m], batch)),
            "recall_at_m": float(core.recall_at_m(top(jnp.asarray(fused), m, mask), batch)),
            "recall_at_m_alone": float(core.recall_at_m(top(jnp.asarray(scores), m, mask),
                                                        batch)),
            "recall_at_k": float(core.recall_at_m(in_order, batch))}
