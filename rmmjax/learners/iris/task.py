"""learner=iris: IRIS's gap diagnosis learned from a replayed dataset's labels (units lace;
docs/command-line.md). The refinement encoder is the run's state, learning online."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from rmmjax import core, distributed
from rmmjax.config import Config
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.encode.export import save_encoder
from rmmjax.retrieve.iris import SINGLE_PASS_DEPTH, single_pass
from rmmjax.retrieve.metrics import turn_metrics
from rmmjax.io.workdir import atomic_write_json
from rmmjax.memory.lace import LaceMem, LaceSettings
from rmmjax.replay.candidates import conversation_fingerprint
from rmmjax.learners.iris.reranker_task import LoggedConversation
from rmmjax.learners.iris.files import ANCHOR_DIR, JUDGE_FILE, load_judge, save_judge
from rmmjax.learners.iris.fit import (HOP_STATES, IrisFit, fit_iris_encoders, fit_iris_judge,
                                       ranking_examples)
from rmmjax.encode.tuned import TunedQueryEncoder, encoder_state
from rmmjax.fit import Online
from rmmjax.learners.query_encoder.fit import encoder_spec, online_step, pad_tokens
from rmmjax.learners.query_encoder.files import load_query_encoder, query_encoder_record
from rmmjax.io.record import replay_record, with_ancestors
from rmmjax.retrieve.iris import IRIS_PRESETS, iris_retrieve
from rmmjax.retrieve.learned import EmbeddingRefiner, LearnedJudge
from rmmjax.replay.inputs import replay_inputs
from rmmjax.learners.task import Task

EVAL_AT = 10  # held-out Recall@10 over turns, as every IRIS table reports


class IrisLearnedTask(Task):
  """The training loop's task (see task.py) for learner=iris."""

  def __init__(self, cfg: Config, encoder=None, progress: bool = False,
               workdir: Path | None = None):
    self.cfg, self.workdir = cfg, Path(workdir)
    data, conversations, _, encoder = replay_inputs(cfg, encoder)
    self.encoder = encoder
    self.stores = [LaceMem.from_conversation(c, encoder,
                                             settings=LaceSettings(retrieval=cfg.retriever))
                   for c in conversations]
    split = len(conversations) - (cfg.holdout or cfg.iris_models.validation)
    if split < 1:
      raise ValueError(f"{cfg.data} has {len(conversations)} conversations with questions; "
                       f"iris_models.validation={cfg.iris_models.validation} would leave none "
                       "to fit (set iris_models.validation=0)")
    self.train_data, self.test_data = conversations[:split], conversations[split:]
    # With holdout=0 the evaluated conversations are a validation split, not a test.
    self.validating = cfg.holdout == 0 and bool(self.test_data)
    self.train_convs, self.test_convs = (
        [LoggedConversation(c.conversation_id, conversation_fingerprint(c), ()) for c in part]
        for part in (self.train_data, self.test_data))
    record = replay_record(cfg, data, encoder, self.train_convs, self.test_convs) | {
        "learner": "iris", "iris": "learned", "query_encoder_path": cfg.query_encoder or None,
        "validation": self.validating}
    self.record = with_ancestors(record, [(cfg.query_encoder, query_encoder_record(
        Path(cfg.query_encoder)))] if cfg.query_encoder else [])
    tuning = cfg.encoder_tuning
    self.fit = IrisFit(k=cfg.iris_models.k, hard_share=cfg.iris_models.hard_share,
                       epochs=tuning.pretrain_epochs, batch=tuning.pretrain_batch,
                       lr=tuning.pretrain_lr, tau=tuning.pretrain_tau, seed=cfg.seed)
    # The refinement encoder's online phase: iris_models.k candidates per example.
    self.spec = dataclasses.replace(encoder_spec(cfg), k=cfg.iris_models.k)
    self.hp = cfg.hparams(tuning)
    self.template = encoder_state(encoder, self.spec, self.hp)
    self.eval_queries = sum(len(c.questions) for c in self.test_data)
    self._stream = None
    self._data_parallel(cfg.devices, {"batch": cfg.batch,
                                      "encoder_tuning.pretrain_batch": tuning.pretrain_batch,
                                      "the judge's batch": self.fit.judge_batch})
    self._online = Online(online_step(encoder.module))

  def _train_stores(self, anchored: bool = False):
    """The training conversations' stores (searching with the written anchor, if `anchored`)."""
    stores = self.stores[:len(self.train_data)]
    if anchored:
      anchor = self._anchor()
      for store in stores:
        store.query_encoder = anchor
    return stores

  def initial_state(self) -> core.TrainState:
    """Fits the two encoders, writes the anchor, returns the refinement encoder's state."""
    anchor = None
    if self.cfg.query_encoder:
      anchor = load_query_encoder(Path(self.cfg.query_encoder), self.encoder,
                                  "query_encoder=").params
    anchor, refine, losses = fit_iris_encoders(self.encoder, self._train_stores(),
                                               self.train_data, self.fit, anchor, self.mesh)
    if distributed.is_writer():  # the others read it from the workdir after the barrier
      save_encoder(self.encoder, anchor, self.workdir / ANCHOR_DIR,
                   metadata={"record": self.record, "role": "anchor query encoder"})
      # pretrain.json: the refinement encoder's (the state's) supervised loss; all stages here.
      atomic_write_json(self.workdir / "fit_losses.json",
                        {stage: loss.tolist() for stage, loss in losses.items()})
    distributed.barrier("anchor encoder written")
    self.pretrain_loss = losses["refine"]
    return encoder_state(self.encoder, self.spec, self.hp, refine)

  def finish(self, state: core.TrainState) -> None:
    """Fits and writes the judge (a rerun of a finished run keeps the one it wrote)."""
    path = self.workdir / JUDGE_FILE
    if path.exists() and load_judge(path)[1].get("step") == int(state.step):
      return
    judge, loss = fit_iris_judge(self.encoder, self._train_stores(anchored=True),
                                 self.train_data, self._host(state.params), self.fit, self.mesh)
    if distributed.is_writer():
      save_judge(judge, path, {"record": self.record, "step": int(state.step)})
      losses_file = self.workdir / "fit_losses.json"
      atomic_write_json(losses_file, json.loads(losses_file.read_text()) | {
          "judge": loss.tolist()})
    distributed.barrier("judge written")

  def _anchor(self) -> TunedQueryEncoder:
    return TunedQueryEncoder(self.encoder, SentenceEncoder(self.workdir / ANCHOR_DIR).params)

  def _online_stream(self):
    """The refinement examples as a stream of batches (rebuilt alike on a resume)."""
    if self._stream is None:
      examples = ranking_examples(self._train_stores(anchored=True), self.train_data, self.fit.k,
                                  self.fit.max_evidence, self.fit.seed + 1, self.fit.hard_share,
                                  HOP_STATES)
      b = self.cfg.batch
      distributed.check_fills(len(examples), b, "refinement examples")
      n = len(examples) // b * b
      ids, mask = pad_tokens(self.encoder, examples.texts[:n], 128)
      covers = examples.covers_NxKxE[:n]
      shape = lambda x: x.reshape(n // b, b, *x.shape[1:])  # noqa: E731
      mem = examples.mem_NxKxD[:n]
      batch = core.Batch(
          q_BxD=jnp.zeros((n // b, b, mem.shape[-1]), jnp.float32),
          mem_BxKxD=jnp.asarray(shape(mem)), mask_BxK=jnp.asarray(shape(np.any(mem != 0, -1))),
          relevant_BxK=jnp.asarray(shape(covers.any(-1))),
          num_relevant_B=jnp.asarray(shape(covers.any(1).sum(-1)), jnp.int32),
          evidence_BxKxE=jnp.asarray(shape(covers)))
      self._stream = (batch, jnp.asarray(shape(ids)), jnp.asarray(shape(mask)))
      if self._parallel:
        self._stream = distributed.shard_leading(self._stream, self.mesh, axis=1)
    return self._stream

  def advance(self, state: core.TrainState, n: int):
    return self._online.run(self._replicated(state), self._online_stream(), n)

  def evaluate(self, state: core.TrainState) -> dict:
    """Recall@M and @10 over turns of the held-out (or validation) conversations (its keys:
    docs/command-line.md); before the models are fitted every entry is the base single pass."""
    if not self.test_data:
      return {}
    # The models once `finish` wrote the judge; the template is the run before fitting (the
    # loop's first evaluation): the base single pass, whether or not a resumed run's models exist.
    fitted = state is not self.template and (self.workdir / JUDGE_FILE).exists()
    anchor, judge = (self._anchor(), load_judge(self.workdir / JUDGE_FILE)[0]) if fitted else (
        None, None)
    refiner = EmbeddingRefiner(TunedQueryEncoder(self.encoder, self._host(state.params)))
    rows: dict[str, list] = {"base": [], "tuned": [], "iris": []}
    for store, conv in zip(self.stores[len(self.train_data):], self.test_data):
      for q in conv.questions:
        for name, query_encoder in (("base", None), ("tuned", anchor))[:1 + fitted]:
          store.query_encoder = query_encoder
          rows[name].append(self._recall(store, single_pass(store, q.question,
                                                             SINGLE_PASS_DEPTH)[0], q))
        if fitted:
          result = iris_retrieve(store, q.question, category=q.category,
                                 judge=LearnedJudge(judge, store),
                                 settings=IRIS_PRESETS["learned"], refiner=refiner)
          rows["iris"].append(self._recall(store, list(result.turn_ids), q))
    mean = {name: np.mean(r, 0) if r else np.mean(rows["base"], 0) for name, r in rows.items()}
    out = {"recall_at_m_base": float(mean["base"][0]), "recall_at_m": float(mean["iris"][0]),
           "recall_at_k": float(mean["iris"][1]),
           "iris_recall_at_10_single_pass_base": float(mean["base"][1]),
           "iris_recall_at_10_single_pass_tuned": float(mean["tuned"][1]),
           "iris_recall_at_10": float(mean["iris"][1]), "iris_validation": self.validating}
    if fitted and mean["tuned"][1] < mean["base"][1]:
      where = "validation" if self.validating else "held-out"
      out["iris_warning"] = (
          f"the tuned anchor encoder retrieves worse than the base encoder on the {where} "
          f"conversations ({', '.join(c.conversation_id for c in self.test_data)}): single-pass "
          f"Recall@{EVAL_AT} {mean['tuned'][1]:.3f} against {mean['base'][1]:.3f}; the fit did "
          "not generalise (fewer encoder_pretrain_epochs, a lower encoder_pretrain_lr, or more "
          "training conversations)")
      if distributed.is_writer():
        print(f"warning: {out['iris_warning']}", file=sys.stderr)
    return out

  def _recall(self, store, turns, q) -> tuple[float, float]:
    metrics = turn_metrics(store, turns, q.evidence, (self.cfg.m, EVAL_AT), len(set(q.evidence)))
    return metrics[f"recall_all@{self.cfg.m}"], metrics[f"recall_all@{EVAL_AT}"]

