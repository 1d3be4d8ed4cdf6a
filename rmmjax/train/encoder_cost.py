"""What a query encoder run (learner=query_encoder, or the first stage of learner=both) will
take, before it starts: its setup (every conversation's units and candidates, the embeddings
mostly read from the disk cache), a pretraining step and an online step, each compiled and
timed on the file's own questions, times the run's count of them. A sweep of runs adds this
to the cross reranker's steps (`learners.cross.cost`)."""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np

from rmmjax import core
from rmmjax.config import Config, encoder_stage
from rmmjax.encode.tuned import encoder_state
from rmmjax.replay.candidates import to_sequence
from rmmjax.replay.query_encoder import pretrain_step, question_tokens
from rmmjax.step_timing import compile_and_step
from rmmjax.train.encoder_task import QueryEncoderTask

TIMED_STEPS = 5  # each kind of step is timed over this many after its compile


@dataclasses.dataclass(frozen=True)
class StageTimes:
  setup_s: float  # the run's replay built: units and candidates of every conversation
  pretrain_s: float  # a pretraining step of encoder_tuning.pretrain_batch questions
  online_s: float  # an online step of `batch` questions
  compile_s: float  # compiling each kind of step once


def stage_config(cfg: Config) -> Config:
  """The query encoder run a run trains: itself, or learner=both's first stage."""
  return cfg if cfg.learner == "query_encoder" else encoder_stage(cfg)


def time_stage(cfg: Config, encoder) -> StageTimes:
  """The setup and median steps of `cfg`'s query encoder run (cfg with its fold set), its
  setup as the run makes it."""
  stage = stage_config(cfg)
  start = time.perf_counter()
  task = QueryEncoderTask(stage, encoder)
  setup_s = time.perf_counter() - start
  tuning = stage.encoder_tuning

  pre_spec = dataclasses.replace(task.spec, batch=tuning.pretrain_batch)
  stream = jax.tree.map(np.asarray, to_sequence(task.train_convs, pre_spec.batch))
  ids, mask = question_tokens(encoder, task.train_convs, pre_spec.batch)
  step = jax.jit(pretrain_step(encoder.module), donate_argnums=0)
  box = [encoder_state(encoder, pre_spec, core.HParams.create(
      lr=tuning.pretrain_lr, tau=tuning.pretrain_tau, seed=stage.seed))]

  def pretrain(i: int) -> None:
    i %= len(ids)
    xs = (jax.tree.map(lambda x: x[i], stream), ids[i], mask[i])  # noqa: B023
    box[0] = jax.block_until_ready(step(box[0], xs)[0])

  def online(_) -> None:
    box[0] = jax.block_until_ready(task.advance(box[0], TIMED_STEPS)[0])

  pre_compile, pretrain_s = compile_and_step(pretrain, range(1, TIMED_STEPS + 1))
  box[0] = encoder_state(encoder, task.spec, task.hp)
  online_compile, online_s = compile_and_step(online, range(1, TIMED_STEPS + 1))
  return StageTimes(setup_s, pretrain_s, online_s / TIMED_STEPS, pre_compile + online_compile)


def stage_seconds(cfg: Config, times: StageTimes, train_questions: list[int]) -> float:
  """A query encoder run's setup, pretraining (each training conversation's questions in
  batches of its own, as `to_sequence` lays them), online steps and compiles."""
  stage = stage_config(cfg)
  tuning = stage.encoder_tuning
  pretrains = stage.mode != "rl" and tuning.pretrain_epochs > 0
  steps = (tuning.pretrain_epochs * sum(-(-n // tuning.pretrain_batch) for n in train_questions)
           if pretrains else 0)
  return (times.setup_s + steps * times.pretrain_s + stage.steps * times.online_s
          + times.compile_s)
