"""Training the retriever's query encoder on a replayed dataset (learner=query_encoder), with
the reranker's protocol; held-out evaluation retrieves with the tuned encoder."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

from rmmjax import core, distributed
from rmmjax.config import Config
from rmmjax.io.checkpoint import saved_steps
from rmmjax.memory.topic_units import conversation_units
from rmmjax.replay.candidates import build_replay, to_sequence
from rmmjax.encode.tuned import TunedQueryEncoder, encoder_state
from rmmjax.fit import Online
from rmmjax.learners.query_encoder.fit import (encoder_spec, online_step, pretrain_query_encoder,
                                               question_tokens, retrieval_encoders,
                                               retrieval_recall)
from rmmjax.io.record import replay_record
from rmmjax.replay.inputs import heldout_split, replay_inputs, training_questions
from rmmjax.learners.task import Task


class QueryEncoderTask(Task):
  """Pretraining then online REINFORCE of the query encoder; held-out retrieval recall."""

  def __init__(self, cfg: Config, encoder=None, progress: bool = False, workdir=None):
    self.cfg, self._progress = cfg, progress
    data, conversations, _, encoder = replay_inputs(cfg, encoder)
    self.encoder = encoder
    self.unit_builder = functools.partial(conversation_units, encoder=encoder)
    replays = build_replay(conversations, cfg.units, cfg.retriever, encoder, cfg.k,
                           progress=progress, unit_builder=self.unit_builder)
    self.train_convs, self.test_convs = heldout_split(replays, cfg)
    self.test_conversations = heldout_split(conversations, cfg)[1]
    self.record = replay_record(cfg, data, encoder, self.train_convs, self.test_convs) | {
        "learner": "query_encoder", "tune": cfg.encoder_tuning.tune}
    self.spec = encoder_spec(cfg)
    self.hp = cfg.hparams(cfg.encoder_tuning)
    # The online stream: (batches, question ids_SxBxT, mask_SxBxT).
    self._stream = (to_sequence(self.train_convs, cfg.batch),
                    *question_tokens(encoder, self.train_convs, cfg.batch))
    self.template = encoder_state(encoder, self.spec, self.hp)
    self.eval_queries = sum(len(c.questions) for c in self.test_convs)
    self._base: dict | None = None
    batches = {"batch": cfg.batch}
    if cfg.mode != "rl" and cfg.encoder_tuning.pretrain_epochs:
      batches["encoder_tuning.pretrain_batch"] = cfg.encoder_tuning.pretrain_batch
    self._data_parallel(cfg.devices, batches)
    if self._parallel:
      self._stream = distributed.shard_leading(self._stream, self.mesh, axis=1)
    self._online = Online(online_step(encoder.module))

  @classmethod
  def check_run(cls, cfg, encoder, workdir) -> None:
    """The training questions fill a batch of online steps and one of pretraining."""
    num = training_questions(cfg)
    pretrained = bool(saved_steps(Path(workdir) / "checkpoints"))  # (a resume skips it)
    batches = {"batch": cfg.batch} if cfg.steps else {}
    if cfg.mode != "rl" and cfg.encoder_tuning.pretrain_epochs and not pretrained:
      batches["encoder_tuning.pretrain_batch"] = cfg.encoder_tuning.pretrain_batch
    for key, size in batches.items():
      distributed.check_fills(num, size, "training questions", key)

  def initial_state(self) -> core.TrainState:
    """Pretrained on the training conversations' labels (mode pretrain+rl), optimizer fresh."""
    cfg, tuning = self.cfg, self.cfg.encoder_tuning
    params = None
    if cfg.mode != "rl" and tuning.pretrain_epochs:
      spec = dataclasses.replace(self.spec, batch=tuning.pretrain_batch)
      hp = core.HParams.create(lr=tuning.pretrain_lr, tau=tuning.pretrain_tau, seed=cfg.seed)
      params, self.pretrain_loss = pretrain_query_encoder(
          self.encoder, self.train_convs, spec, hp, tuning.pretrain_epochs, mesh=self.mesh,
          progress=self._progress)
    return encoder_state(self.encoder, self.spec, self.hp, params)

  def advance(self, state: core.TrainState, n: int):
    return self._online.run(self._replicated(state), self._stream, n)

  def _recall(self, tuned, m: int) -> float:
    encoders = retrieval_encoders(self.encoder, tuned, self.cfg.encoder_tuning.tune)
    return float(np.mean(np.concatenate([
        retrieval_recall(c, self.cfg.units, self.cfg.retriever, *encoders, m, self.unit_builder)
        for c in self.test_conversations])))

  def evaluate(self, state: core.TrainState) -> dict:
    """Held-out Recall@M of retrieval with the untuned and the tuned encoder, and tuned @K."""
    if not self.test_conversations:
      return {}
    if self._base is None:
      self._base = {"recall_at_m_base": self._recall(None, self.cfg.m)}
    tuned = TunedQueryEncoder(self.encoder, self._host(state.params))
    return self._base | {"recall_at_m": self._recall(tuned, self.cfg.m),
                         "recall_at_k": self._recall(tuned, self.cfg.k)}
