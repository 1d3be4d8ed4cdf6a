"""The replay task: a labelled dataset's conversations replayed through a reranker (the linear
and MLP rerankers here; the cross reranker's task, and a new family's, build on it)."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core, distributed
from rmmjax.config import Config
from rmmjax.core import replay as core_replay
from rmmjax.fit import Online
from rmmjax.learners.embedding.model import EMBEDDING
from rmmjax.learners.query_encoder.files import load_query_encoder, query_encoder_record
from rmmjax.io.record import replay_record, with_ancestors
from rmmjax.memory.topic_units import conversation_units
from rmmjax.replay.candidates import (base_recall, build_replay, ceiling_recall, to_questions,
                                     to_sequence, to_streams)
from rmmjax.replay.protocols import (Protocol, heldout_replay, per_question, stream_ids,
                                     train_reranker)
from rmmjax.learners.query_encoder.fit import retrieval_encoders
from rmmjax.replay.inputs import heldout_split, replay_inputs, training_questions
from rmmjax.learners.task import Task


def build_replays(cfg: Config, encoder=None, progress: bool = False):
  """(data file, load report, encoder, tuned query encoder or None, replays) of a replay run."""
  data, conversations, report, encoder = replay_inputs(cfg, encoder)
  # A tuned query encoder (a two-stage run's first stage, or query_encoder=WORKDIR) gives the
  # candidates and the questions' embeddings; the units keep the base encoder's.
  tuned = (load_query_encoder(cfg.query_encoder, encoder, "query_encoder=")
           if cfg.query_encoder else None)
  tune = query_encoder_record(cfg.query_encoder)["tune"] if tuned else "query"
  memory_encoder, query_encoder = retrieval_encoders(encoder, tuned, tune)
  replays = build_replay(conversations, cfg.units, cfg.retriever, memory_encoder, cfg.k,
                         progress=progress, query_encoder=query_encoder,
                         unit_builder=functools.partial(conversation_units, encoder=encoder))
  return data, report, encoder, tuned, replays


class ReplayTask(Task):
  """A labelled dataset's conversations: the last `holdout` (or fold `fold`) are held out, the
  rest pretrained on (when the mode says so) and then replayed as an online stream."""

  stream_on_devices = True  # the online stream lives on the devices (a scan reads it there)
  model = EMBEDDING  # (a family registered with this task subclassed names its own)

  @classmethod
  def init_params(cls, spec: core.CoreSpec):
    """A fresh model's parameters, as its checkpoints hold them (None: the model's own)."""
    return None

  @classmethod
  def check_run(cls, cfg, encoder, workdir) -> None:
    """The training questions fill one batch (a larger one would be padded out of memory)."""
    distributed.check_fills(training_questions(cfg), cfg.batch, "training questions")

  def __init__(self, cfg: Config, encoder=None, progress: bool = False, workdir=None):
    self.cfg, self.hp = cfg, cfg.hparams()
    data, _, encoder, tuned, replays = build_replays(cfg, encoder, progress)
    self.spec = self._core_spec(encoder)
    self.train_convs, self.test_convs = heldout_split(replays, cfg)
    record = replay_record(cfg, data, encoder, self.train_convs, self.test_convs) | {
        "learner": "reranker", "query_encoder": tuned.identity if tuned else None,
        "query_encoder_path": cfg.query_encoder or None}
    # The candidates come from the tuned encoder: what it trained on is this model's too.
    self.record = with_ancestors(record, [(cfg.query_encoder, query_encoder_record(
        cfg.query_encoder))] if tuned else [])
    self.encoder = encoder
    self.train_convs = self._training_rows(self.train_convs)
    train_inputs, test_inputs = self._inputs(self.train_convs), self._inputs(self.test_convs)
    self.train_qs = to_questions(self.train_convs, train_inputs)
    self.train_seq = to_sequence(self.train_convs, cfg.batch, train_inputs)
    self._host_seq = self.train_seq  # the stream as the host built it (numpy)
    self.test_streams = (to_streams(self.test_convs, cfg.batch, inputs=test_inputs)
                         if self.test_convs else None)
    self.test_ids = stream_ids(self.test_convs)
    self.template = core.init_state(self.spec, self.hp, self._initial_params())
    self.eval_queries = sum(len(c.questions) for c in self.test_convs)
    self._data_parallel(cfg.devices, {"batch": cfg.batch})
    if self._parallel and self.stream_on_devices:
      self.train_seq = distributed.shard_leading(self.train_seq, self.mesh, axis=1)
    self._online = Online(core_replay.replay_step)
    self._replay = jax.jit(heldout_replay, static_argnums=3)

  def _core_spec(self, encoder) -> core.CoreSpec:
    """The core's spec (a cross reranker's names its encoder's configuration)."""
    return dataclasses.replace(self.cfg.core_spec(), model=self.model)

  def _training_rows(self, convs) -> list:
    """The training conversations as the learner learns from them (rows it adds: the cross
    reranker's second readings)."""
    return convs

  def _inputs(self, convs) -> list | None:
    """The learner's own inputs of these conversations' candidates (None: the embeddings)."""
    return None

  def _initial_params(self):
    """The parameters training starts from (None: the reranker's identity initialisation)."""
    return self.init_params(self.spec)

  def initial_state(self) -> core.TrainState:
    """Pretrained on the training conversations' labels (mode pretrain+rl), optimizer reset."""
    cfg = self.cfg
    pretrain_hp = self.hp.replace(lr=jnp.asarray(cfg.learning.pretrain_lr, jnp.float32),
                                  tau=jnp.asarray(cfg.learning.pretrain_tau, jnp.float32))
    protocol = Protocol(mode=cfg.mode, pretrain_epochs=cfg.learning.pretrain_epochs)
    # No online steps here: the training loop takes them, in checkpointed segments.
    state, logs = jax.jit(train_reranker, static_argnums=(0, 5, 6, 7))(
        self.spec, self.hp, pretrain_hp, self.train_qs, self.train_seq, protocol, 0,
        distributed.batch_sharding(self.mesh, axis=1), self.template.params)
    if "pretrain_loss" in logs:
      self.pretrain_loss = distributed.gather(logs["pretrain_loss"])
    return state

  def advance(self, state: core.TrainState, n: int, on_step=None):
    state = self._replicated(state)
    if self.stream_on_devices:
      state, metrics = self._online.run(state, self.train_seq, n)
    else:  # each step's batch built on the host (`_step_batch`)
      state, metrics = self._online.run_from_host(state, self._step_batch, n, on_step)
    # Prequential recall of the training stream: each batch scored before its update.
    metrics["recall_prequential"] = metrics.pop("recall_sum_before") / np.maximum(
        metrics.pop("present"), 1.0)
    return state, metrics

  def evaluate(self, state: core.TrainState) -> dict:
    """Held-out Recall@M of the reranker as it stands and prequential (`heldout_replay`: learning
    online as each held-out batch's citations arrive), beside the base order's and all K's."""
    if not self.test_convs:  # holdout=0: every conversation was trained on
      return {}
    state = self._host(state)
    recall = {online: per_question(self._replay(state, self.test_streams, self.test_ids, online)[
        "recall_SxB"], self.test_convs).mean() for online in (False, True)}
    return self._base_metrics() | {"recall_at_m": float(recall[False]),
                                   "recall_at_m_prequential": float(recall[True])}

  def _base_metrics(self) -> dict:
    """Held-out Recall@M of the base order, and of all K candidates (the ceiling)."""
    mean = lambda parts: float(np.mean(np.concatenate(parts)))  # noqa: E731
    return {"recall_at_m_base": mean([base_recall(c, self.spec.m) for c in self.test_convs]),
            "recall_at_k": mean([ceiling_recall(c) for c in self.test_convs])}
