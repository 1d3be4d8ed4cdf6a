"""The cross reranker's training task: ReplayTask with (question, memory) pair tokens in every
batch. A step costs seconds on a CPU, so steps run from the host one at a time, drawing the
randomness the scanned steps draw, so a resumed run ends where an uninterrupted one does."""

from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from rmmjax import core, distributed
from rmmjax.fit import Fit, Online, fit
from rmmjax.core import replay as core_replay
from rmmjax.config import effective_dtype
from rmmjax.io.checkpoint import saved_steps
from rmmjax.encode.encoder import compiler_options
from rmmjax.encode.protocol import require_bert, tokenizer_identity
from rmmjax.encode.bert import load_pooler
from rmmjax.learners.cross.model import init_cross_params
from rmmjax.learners.cross.spec import cross_spec
from rmmjax.learners.cross.pairs import (candidate_subset, pack_batch, replay_pairs, step_bytes,
                                         with_second_readings)
from rmmjax.replay.inputs import heldout_split, replay_inputs
from rmmjax.learners.embedding.task import ReplayTask


class CrossRerankerTask(ReplayTask):
  """The training loop's task (see task.py) for variant=cross."""

  checkpoint_pretrained = True  # pretraining takes minutes: a resume should not redo it
  steps_from_host = True  # one compiled step at a time (each costs seconds on a CPU)
  stream_on_devices = False  # each step's batch is packed on the host and sent alone
  model = None  # (its encoder's configuration fixes it: cross_spec)

  @classmethod
  def check_run(cls, cfg, encoder, workdir) -> None:
    check_cross_workdir(cfg, encoder, workdir)

  def __init__(self, cfg, encoder=None, progress: bool = False, workdir=None):
    self._progress = progress
    self._pair_counts = {"pairs": 0, "truncated": 0}
    super().__init__(cfg, encoder, progress)
    self.record, self.input_notes = with_pairs_read(
        self.record, cfg, self.encoder, int(self.train_qs.inputs.ids_BxKxL.shape[-1]),
        self._pair_counts)
    if cfg.cross.reads_observations(cfg):  # (auto reads them only where the data holds them)
      self.input_notes["cross_observations"] = sum(c == "observation" for r in self.train_convs
                                                   for c in r.categories)
    if cfg.cross.second_reading:
      self.input_notes["cross_second_readings"] = sum(c == "found evidence" for r in
                                                      self.train_convs for c in r.categories)
    if progress and self._pair_counts["truncated"]:
      print(f"{self._pair_counts['truncated']} of {self._pair_counts['pairs']} (question, "
            f"memory) pairs are longer than cross.max_length={cfg.cross.max_length} tokens and "
            "were cut to it (the longer side first)", file=sys.stderr)
    self._online = Online(core_replay.replay_step, compiler_options())

  def _core_spec(self, encoder) -> core.CoreSpec:
    return cross_spec(self.cfg, encoder.cfg)  # (a BERT: check_cross_workdir saw to it)

  def _training_rows(self, convs) -> list:
    return [with_second_readings(c) for c in convs] if self.cfg.cross.second_reading else convs

  def _inputs(self, convs) -> list | None:
    if not convs:
      return []
    pairs = replay_pairs(self.encoder.tokenizer, convs, self.cfg.cross.max_length,
                         self.cfg.cross.previous_turn)
    for key in self._pair_counts:
      self._pair_counts[key] += sum(getattr(p, key) for p in pairs)
    return [p.candidates() for p in pairs]

  def _initial_params(self):
    return cross_initial_params(self.encoder, self.cfg.k, self.cfg.cross.prior_scale)

  def initial_state(self) -> core.TrainState:
    """Listwise pretraining on the training labels (`pretrain_cross`), the optimizer reset."""
    if self.cfg.mode != "rl" and self.cfg.cross.pretrain_epochs > 0:
      return pretrain_cross(self, self.train_qs)
    return core_replay.restart_optimizer(self.template, self.hp)

  def _step_batch(self, index: int) -> core.Batch:
    """The packed batch of step `index` (modulo the stream's length), placed on the mesh."""
    num_steps = self._host_seq.mask_BxK.shape[0]
    batch = pack_batch(jax.tree.map(lambda x: np.asarray(x)[index % num_steps], self._host_seq),
                       self.mesh.devices.size)
    return distributed.shard_leading(batch, self.mesh) if self._parallel else batch

  def evaluate_first(self) -> dict:
    """A fresh cross reranker keeps the base order (its head is zero, its prior flat or
    decreasing), so its held-out recall is known without reading every held-out pair."""
    if not self.test_convs:
      return {}
    base = self._base_metrics()
    return base | {"recall_at_m": base["recall_at_m_base"]}

  def evaluate(self, state: core.TrainState) -> dict:
    """ReplayTask's, without the prequential replay (each step costs as much as training's)."""
    if not self.test_convs:
      return {}
    # The parameters on this process's first device, once: not copied in at every batch.
    params = jax.device_put(self._host(state.params))
    score = jax.jit(core_replay.rerank_recall, static_argnums=2,
                    compiler_options=compiler_options())
    # Batches of questions only: the padding that evens the streams' lengths is not scored.
    streams = jax.tree.map(np.asarray, self.test_streams)
    batches = [jax.tree.map(lambda x: x[c, s], streams)  # noqa: B023
               for c, s in zip(*np.nonzero(streams.mask_BxK.any((-2, -1))))]
    recall, present = [], []
    for i, batch in enumerate(tqdm(batches, desc="held-out (cross)", unit="batch",
                                   disable=not self._progress)):
      recall.append(score(params, pack_batch(batch), self.spec)[0])
      present.append(batch.mask_BxK.any(-1))
      if i % 10 == 0:  # the bar follows the computation, not its dispatch
        recall[-1].block_until_ready()
    recall_all = np.concatenate(jax.device_get(recall))
    return self._base_metrics() | {
        "recall_at_m": float(recall_all[np.concatenate(present)].mean())}


def with_pairs_read(record: dict, cfg, encoder, length: int, counts: dict) -> tuple[dict, dict]:
  """The record with how a cross reranker reads its pairs, and the summary's notes of them."""
  dtype = effective_dtype(cfg.cross.compute_dtype)
  record = record | {"variant": "cross", "cross": {
      "bert": dataclasses.asdict(encoder.cfg), "tokenizer": tokenizer_identity(encoder),
      "max_length": cfg.cross.max_length, "compute_dtype": dtype, "length": length,
      "previous_turn": cfg.cross.previous_turn, "second_reading": cfg.cross.second_reading,
      **counts}}
  return record, {"cross_compute_dtype": dtype, "cross_pairs": counts["pairs"],
                  "cross_pairs_truncated": counts["truncated"], "cross_pair_length": length}


def cross_initial_params(encoder, k: int, prior_scale: float) -> dict:
  """A fresh cross reranker's parameters from a loaded encoder's (with its pooler, if any)."""
  pooler = load_pooler(encoder.model_dir)
  weights = dict(encoder.params) | ({"pooler": pooler} if pooler is not None else {})
  return init_cross_params(weights, k, prior_scale)


def pretrain_cross(task, questions: core.Batch) -> core.TrainState:
  """`task`'s template pretrained listwise at the cross section's rates, one compiled step at a
  time (packed shapes vary), each epoch over a subset of candidates in an order drawn from (seed,
  epoch) alone, then `hard_epochs` more over the negatives the pretrained reranker scores
  highest; the optimizer reset, the task's pretraining loss and notes set."""
  cfg, mesh = task.cfg, task.mesh
  state = task.template.replace(hparams=task.template.hparams.replace(
      lr=jnp.asarray(cfg.cross.pretrain_lr, jnp.float32),
      tau=jnp.asarray(cfg.cross.pretrain_tau, jnp.float32)))
  b = state.spec.batch
  questions = jax.tree.map(np.asarray, questions)
  num = questions.mask_BxK.shape[0]
  per_epoch = num // b  # at least 1: check_cross_workdir refused a batch too large
  positions = {"real": 0, "computed": 0}

  def epoch_batches(epoch: int, hardness_NxK=None) -> list[core.Batch]:
    seed = np.random.SeedSequence([cfg.seed, epoch]).generate_state(1)[0]
    subset = candidate_subset(questions, cfg.cross.pretrain_candidates, int(seed),
                              cfg.cross.negatives_from_rank - 1, hardness_NxK)
    order = np.random.default_rng(seed).permutation(num)[:per_epoch * b]
    batches = [pack_batch(jax.tree.map(lambda x: x[order[i * b:(i + 1) * b]], subset),  # noqa: B023
                          mesh.devices.size) for i in range(per_epoch)]
    positions["real"] += sum(int((x.inputs.slots_RxL > 0).sum()) for x in batches)
    positions["computed"] += sum(x.inputs.slots_RxL.size for x in batches)
    return batches

  # No donation: the hyperparameters are shared with the task's.
  step = functools.partial(core.supervised_step,
                           loss_fn=core.losses.PRETRAIN_LOSSES[cfg.cross.pretrain_loss])
  state, task.pretrain_loss = fit(state, step, epoch_batches,
                                  Fit(cfg.cross.pretrain_epochs, desc="cross"), mesh,
                                  task._progress, compiler_options())
  if cfg.cross.hard_epochs:
    hardness_NxK = reranker_scores(task, state, questions)
    state, hard_loss = fit(
        state, step, lambda e: epoch_batches(cfg.cross.pretrain_epochs + e, hardness_NxK),
        Fit(cfg.cross.hard_epochs, desc="cross, hard negatives"), mesh, task._progress,
        compiler_options())
    task.pretrain_loss = np.concatenate([task.pretrain_loss, hard_loss])
  task.pretrain_notes = {"cross_real_positions": positions["real"] / max(positions["computed"], 1)}
  return core_replay.restart_optimizer(state, task.hp)


def reranker_scores(task, state: core.TrainState, questions: core.Batch) -> np.ndarray:
  """The scores_NxK of `state`'s reranker over every question's K candidates (batch by batch,
  on one device)."""
  params = jax.device_put(task._host(state.params))
  score = jax.jit(core_replay.rerank_recall, static_argnums=2,
                  compiler_options=compiler_options())
  b, num = state.spec.batch, questions.mask_BxK.shape[0]
  scores = [score(params, pack_batch(jax.tree.map(lambda x: x[i:i + b], questions)),  # noqa: B023
                  state.spec)[1] for i in tqdm(range(0, num, b), desc="hard negatives (cross)",
                                                unit="batch", disable=not task._progress)]
  return np.concatenate(jax.device_get(scores))


def check_cross_workdir(cfg, encoder, workdir) -> None:
  """A cross run's checks before anything is written (before a two-stage run tunes its query
  encoder): a BERT encoder, training questions that fill a pretraining batch, and each kind of
  step the run will still take fitting the device (`pairs.step_bytes`)."""
  _, conversations, _, encoder = replay_inputs(cfg, encoder)
  done = saved_steps(Path(workdir) / "checkpoints")
  devices = distributed.data_mesh(cfg.devices).devices.size
  require_bert(encoder, "variant=cross")
  pretrains = cfg.mode != "rl" and cfg.cross.pretrain_epochs > 0 and not done
  if pretrains and cfg.units != "lace":  # (IRIS's episodes are counted where they are made)
    distributed.check_fills(sum(len(c.questions) for c in heldout_split(conversations, cfg)[0]),
                            cfg.batch, "training questions")
  phases = {}
  if pretrains:
    phases["a pretraining step"] = ("cross.pretrain_candidates", cfg.cross.pretrain_candidates)
  if cfg.steps > (done[-1] if done else 0):
    phases["an online step"] = ("k", cfg.k)
  batch = max(1, cfg.batch // devices)
  for what, (key, candidates) in phases.items():
    need, limit = step_bytes(encoder.cfg, cfg.k, batch, candidates, cfg.cross.max_length,
                             effective_dtype(cfg.cross.compute_dtype))
    if limit is not None and need > 0.9 * limit:
      raise ValueError(
          f"{what} of the cross reranker needs {need / 2**30:.1f} GiB at the longest pairs it may "
          f"read, and the device holds {limit / 2**30:.1f} GiB: lower batch (now {cfg.batch}), "
          f"{key} ({candidates}) or cross.max_length ({cfg.cross.max_length}), or spread the batch "
          "over more devices")
