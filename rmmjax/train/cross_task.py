"""The cross reranker's training task (variant=cross): the replay task of the embedding
rerankers, with (question, memory) pair tokens in every batch and the encoder's weights as the
starting point.

The steps are those of every reranker (listwise pretraining on the evidence labels, then online
REINFORCE from simulated citations), but one step of a six-layer encoder over K pairs costs
seconds on a CPU, so the steps run from the host, one compiled step at a time: pretraining shows
a progress bar and draws a fresh subset of candidates each epoch (`cross_pairs.
candidate_subset`), and the online step is compiled ahead, once, which also tells its memory
need before the run starts. The randomness of every step is the one the scanned steps of the
other rerankers draw, so a resumed run ends where an uninterrupted one does.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from rmmjax import core, distributed
from rmmjax.core import replay as core_replay
from rmmjax.encode.bert import load_pooler
from rmmjax.encode.encoder import compiler_options
from rmmjax.encode.protocol import require_bert, tokenizer_identity
from rmmjax.replay.candidates import base_recall, ceiling_recall
from rmmjax.replay.cross_pairs import candidate_subset, replay_pairs
from rmmjax.train.replay_task import ReplayTask


class CrossRerankerTask(ReplayTask):
  """The training loop's task (see task.py) for variant=cross."""

  checkpoint_pretrained = True  # pretraining takes minutes: a resume should not redo it

  def __init__(self, cfg, encoder=None, progress: bool = False):
    self._progress = progress
    self._pair_counts = {"pairs": 0, "truncated": 0}
    super().__init__(cfg, encoder, progress)
    num = int(self.train_qs.mask_BxK.shape[0])
    if cfg.mode != "rl" and cfg.pretrain_epochs > 0 and num < self.spec.batch:
      raise ValueError(f"batch={cfg.batch}: the {num} training questions cannot fill one "
                       f"pretraining batch; expected batch <= {num}")
    self.record = self.record | {"variant": "cross", "cross": {
        "bert": dataclasses.asdict(self.encoder.cfg),
        "tokenizer": tokenizer_identity(self.encoder), "max_length": cfg.cross_max_length,
        "length": int(self.train_qs.tokens_BxKxL.shape[-1]), **self._pair_counts}}
    self.input_notes = {"cross_pairs": self._pair_counts["pairs"],
                        "cross_pairs_truncated": self._pair_counts["truncated"],
                        "cross_pair_length": self.record["cross"]["length"]}
    if progress and self._pair_counts["truncated"]:
      print(f"{self._pair_counts['truncated']} of {self._pair_counts['pairs']} (question, "
            f"memory) pairs are longer than cross_max_length={cfg.cross_max_length} tokens and "
            "were cut to it (the longer side first)", file=sys.stderr)
    self._step = self._compile_online_step()

  def _core_spec(self, encoder) -> core.CoreSpec:
    require_bert(encoder, "variant=cross")
    return self.cfg.core_spec(bert=encoder.cfg)

  def _pairs(self, convs) -> list | None:
    if not convs:
      return []
    pairs = replay_pairs(self.encoder.tokenizer, convs, self.cfg.cross_max_length)
    for p in pairs:
      self._pair_counts["pairs"] += p.pairs
      self._pair_counts["truncated"] += p.truncated
    return pairs

  def _initial_params(self):
    return cross_initial_params(self.encoder, self.cfg.k, self.cfg.prior_scale)

  # -- pretraining ---------------------------------------------------------------------------

  def initial_state(self) -> core.TrainState:
    """Listwise pretraining on the training conversations' labels, each epoch over a fresh
    subset of cross_pretrain_candidates candidates per question; then the optimizer reset for
    the online phase."""
    cfg = self.cfg
    pretrain_hp = self.hp.replace(lr=jnp.asarray(cfg.pretrain_lr, jnp.float32),
                                  tau=jnp.asarray(cfg.pretrain_tau, jnp.float32))
    state = core.init_state(self.spec, pretrain_hp, self.template.params)
    if cfg.mode != "rl" and cfg.pretrain_epochs > 0:
      state, self.pretrain_loss = pretrain_cross(state, self.train_qs, cfg, self.mesh,
                                                 self._replicated, self._progress)
    return core_replay.restart_optimizer(state, self.hp)

  # -- online steps --------------------------------------------------------------------------

  def _one_step_stream(self, index: int) -> core.Batch:
    num_steps = self.train_seq.mask_BxK.shape[0]
    stream = jax.tree.map(lambda x: np.asarray(x)[index % num_steps][None], self._host_seq)
    if self._parallel:
      stream = distributed.shard_leading(stream, self.mesh, axis=1)
    return stream

  def _compile_online_step(self):
    """The online step compiled ahead, and refused before the run starts when it would not fit
    in the device's memory (naming the settings that set its size)."""
    self._host_seq = jax.tree.map(np.asarray, distributed.gather(self.train_seq))
    # The stream stays on the host: one step's batch goes to the devices at a time.
    self.train_seq = self._host_seq
    state = self._replicated(self.template)
    fn = jax.jit(lambda state, stream: core_replay.replay_steps(state, stream, 1),
                 donate_argnums=0, compiler_options=compiler_options())
    compiled = fn.lower(state, self._one_step_stream(0)).compile()
    check_fits(compiled, self.cfg)
    return compiled

  def advance(self, state: core.TrainState, n: int):
    state = self._replicated(state)
    rows = []
    for _ in range(n):
      state, metrics = self._step(state, self._one_step_stream(int(state.step)))
      rows.append(distributed.gather(metrics))
    metrics = {name: np.concatenate([r[name] for r in rows]) for name in rows[0]}
    metrics["recall_prequential"] = metrics.pop("recall_sum_before") / np.maximum(
        metrics.pop("present"), 1.0)
    return state, metrics

  # -- evaluation ----------------------------------------------------------------------------

  def evaluate(self, state: core.TrainState) -> dict:
    """Held-out Recall@M of the reranker as it stands (no prequential replay: each of its
    online steps over a held-out stream costs as much as a training step), the base order's,
    and the K candidates'."""
    if not self.test_convs:
      return {}
    params = self._host(state.params)
    recall = []
    score = jax.jit(core_replay.rerank_recall, static_argnums=2,
                    compiler_options=compiler_options())
    streams = _split_streams(self.test_streams)
    total = sum(s.mask_BxK.shape[0] for s in streams)
    with tqdm(total=total, desc="held-out (cross)", unit="batch",
              disable=not self._progress) as bar:
      for stream in streams:
        for s in range(stream.mask_BxK.shape[0]):
          batch = jax.tree.map(lambda x: x[s], stream)  # noqa: B023
          recall.append(np.asarray(score(params, batch, self.spec)[0]))
          bar.update(1)
    recall_all = np.concatenate(recall)  # conversation, step, question order
    present = np.asarray(self.test_streams.mask_BxK).any(-1).reshape(-1)
    m = self.spec.m
    mean = lambda parts: float(np.mean(np.concatenate(parts)))  # noqa: E731
    return {"recall_at_m_base": mean([base_recall(c, m) for c in self.test_convs]),
            "recall_at_m": float(recall_all[present].mean()),
            "recall_at_k": mean([ceiling_recall(c) for c in self.test_convs])}


def cross_initial_params(encoder, k: int, prior_scale: float) -> dict:
  """A fresh cross reranker's parameters: the encoder's weights (with BERT's pooler where its
  checkpoint has one), the scoring layer at zero, the rank prior decreasing."""
  params = dict(encoder.params)
  pooler = load_pooler(encoder.model_dir)
  if pooler is not None:
    params["pooler"] = pooler
  return core.init_cross_params(params, k, prior_scale)


def pretrain_cross(state: core.TrainState, questions: core.Batch, cfg, mesh, replicated,
                   progress: bool) -> tuple[core.TrainState, np.ndarray]:
  """cfg.pretrain_epochs of listwise pretraining on the questions' labels (a core.Batch of
  every question, with pair tokens), one compiled step at a time from the host, each epoch over
  a fresh subset of cfg.cross_pretrain_candidates candidates per question in a fresh order,
  both drawn from (seed, epoch) alone. `replicated` places the state on the mesh. Returns the
  state and every step's loss."""
  b = state.spec.batch
  questions = jax.tree.map(np.asarray, questions)
  num = questions.mask_BxK.shape[0]
  per_epoch = num // b
  if per_epoch < 1:
    raise ValueError(f"{num} training questions cannot fill one batch of {b}")
  # No donation: the hyperparameters are shared with the task's.
  step = jax.jit(core.supervised_step, compiler_options=compiler_options())
  sharding = distributed.batch_sharding(mesh)
  losses = []
  bar = tqdm(total=cfg.pretrain_epochs * per_epoch, desc="pretrain (cross)", unit="step",
             disable=not progress)
  with bar:
    for epoch in range(cfg.pretrain_epochs):
      seed = np.random.SeedSequence([cfg.seed, epoch]).generate_state(1)[0]
      subset = candidate_subset(questions, cfg.cross_pretrain_candidates, int(seed))
      order = np.random.default_rng(seed).permutation(num)[:per_epoch * b]
      for i in range(per_epoch):
        rows = order[i * b:(i + 1) * b]
        batch = jax.tree.map(lambda x: x[rows], subset)  # noqa: B023
        if sharding is not None:
          batch = distributed.shard_leading(batch, mesh)
        state, metrics = step(replicated(state), batch)
        losses.append(float(metrics["loss"]))
        bar.update(1)
        if i % 10 == 0:
          bar.set_postfix(loss=f"{np.mean(losses[-50:]):.3f}")
  return state, np.asarray(losses, np.float32)


def _split_streams(streams_CxSxB: core.Batch) -> list[core.Batch]:
  num = streams_CxSxB.mask_BxK.shape[0]
  return [jax.tree.map(lambda x: np.asarray(x)[c], streams_CxSxB) for c in range(num)]  # noqa


def device_memory_bytes() -> int | None:
  """What the first device can hold: its allocator's limit on an accelerator, the machine's
  physical memory on a CPU (None where neither is known)."""
  device = jax.devices()[0]
  stats = getattr(device, "memory_stats", lambda: None)()
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  try:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    return None


def check_fits(compiled, cfg) -> None:
  """Refuses a compiled step whose arguments, outputs and temporaries exceed the device."""
  analysis = compiled.memory_analysis()
  limit = device_memory_bytes()
  if analysis is None or limit is None:
    return
  need = (analysis.argument_size_in_bytes + analysis.output_size_in_bytes
          + analysis.temp_size_in_bytes)
  if need > 0.9 * limit:
    raise ValueError(
        f"one online step of the cross reranker needs {need / 2**30:.1f} GiB, and the device "
        f"holds {limit / 2**30:.1f} GiB: lower batch (now {cfg.batch}), k ({cfg.k}) or "
        f"cross_max_length ({cfg.cross_max_length}), or spread the batch over more devices")
