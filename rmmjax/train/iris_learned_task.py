"""learner=iris: IRIS's gap diagnosis learned from a replayed dataset's labels (units lace).

Each conversation becomes a LaceMem; the last `holdout` conversations are held out. Before the
online steps (`initial_state`) the anchor query encoder (or `query_encoder=WORKDIR`'s), the
refinement encoder and the sufficiency judge are fitted on the training conversations'
labels (`rmmjax.replay.iris_models`); the anchor and the judge are written to the workdir
then, and the refinement encoder is the run's state: online REINFORCE from simulated citations
over its training examples (the K candidate facts of each), checkpointed and resumed by the
training loop like every run. Held-out evaluation runs IRIS with the learned models.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rmmjax import core, distributed
from rmmjax.config import Config
from rmmjax.encode.encoder import SentenceEncoder
from rmmjax.encode.export import save_encoder
from rmmjax.eval.iris_eval import SINGLE_PASS_DEPTH, single_pass, turn_metrics
from rmmjax.io.workdir import atomic_write_json
from rmmjax.memory.lace import LaceMem, LaceSettings
from rmmjax.replay.candidates import conversation_fingerprint
from rmmjax.replay.iris_model_io import ANCHOR_DIR, JUDGE_FILE, load_judge, save_judge
from rmmjax.replay.iris_models import (IrisFit, fit_iris_models, pad_tokens,
                                       refinement_examples)
from rmmjax.replay.query_encoder import (TunedQueryEncoder, encoder_replay_steps, encoder_spec,
                                         encoder_state, load_query_encoder)
from rmmjax.replay.record import replay_record
from rmmjax.retrieve.iris import IRIS_PRESETS, iris_retrieve
from rmmjax.retrieve.learned import EmbeddingRefiner, LearnedJudge
from rmmjax.train.inputs import replay_inputs

EVAL_AT = 10  # held-out Recall@10 over turns, as every IRIS table reports


@dataclasses.dataclass(frozen=True)
class _Conv:
  conversation_id: str
  fingerprint: str


class IrisLearnedTask:
  """The training loop's task (see tasks.py) for learner=iris."""

  def __init__(self, cfg: Config, encoder=None, progress: bool = False,
               workdir: Path | None = None):
    if workdir is None:
      raise ValueError("learner=iris writes its models beside the checkpoints: give a workdir")
    self.cfg, self.workdir = cfg, Path(workdir)
    data, conversations, self.load_report, encoder = replay_inputs(cfg, encoder)
    self.encoder = encoder
    self.stores = [LaceMem.from_conversation(c, encoder,
                                             settings=LaceSettings(retrieval=cfg.retriever))
                   for c in conversations]
    split = len(conversations) - cfg.holdout
    self.train_data, self.test_data = conversations[:split], conversations[split:]
    self.train_convs = [_Conv(c.conversation_id, conversation_fingerprint(c))
                        for c in self.train_data]
    self.test_convs = [_Conv(c.conversation_id, conversation_fingerprint(c))
                       for c in self.test_data]
    self.record = replay_record(cfg, data, encoder, self.train_convs, self.test_convs) | {
        "learner": "iris", "iris": "learned", "query_encoder_path": cfg.query_encoder or None}
    self.fit = IrisFit(k=cfg.k, epochs=cfg.encoder_pretrain_epochs,
                       batch=cfg.encoder_pretrain_batch, lr=cfg.encoder_pretrain_lr,
                       tau=cfg.encoder_pretrain_tau, seed=cfg.seed)
    self.spec = encoder_spec(cfg)
    self.hp = dataclasses.replace(cfg, lr=cfg.encoder_lr).hparams()
    self.template = encoder_state(encoder, self.spec, self.hp)
    self.eval_queries = sum(len(c.questions) for c in self.test_data)
    self.pretrain_loss: np.ndarray | None = None
    self._stream = None
    # Data parallel over the mesh: each step's refinement queries split over its devices.
    self.mesh = distributed.data_mesh(cfg.devices)
    self._parallel = self.mesh.devices.size > 1
    if self._parallel:
      distributed.check_divisible(cfg.batch, self.mesh, "batch")
    self._advance = jax.jit(functools.partial(encoder_replay_steps, encoder.module),
                            static_argnums=4, donate_argnums=0)

  def _train_stores(self):
    return self.stores[:len(self.train_data)]

  def initial_state(self) -> core.TrainState:
    """Fits the three models, writes the anchor and the judge, returns the refinement state."""
    anchor = None
    if self.cfg.query_encoder:
      anchor = load_query_encoder(Path(self.cfg.query_encoder), self.encoder).params
    fitted = fit_iris_models(self.encoder, self._train_stores(), self.train_data, self.fit,
                             anchor, self.mesh)
    if distributed.is_writer():  # the others read them from the workdir after the barrier
      save_encoder(self.encoder, fitted.anchor, self.workdir / ANCHOR_DIR,
                   metadata={"record": self.record, "role": "anchor query encoder"})
      save_judge(fitted.judge, self.workdir / JUDGE_FILE, {"record": self.record})
      # pretrain.json: the refinement encoder's (the state's) supervised loss; all stages here.
      atomic_write_json(self.workdir / "fit_losses.json",
                        {stage: loss.tolist() for stage, loss in fitted.losses.items()})
    distributed.barrier("learned IRIS models written")
    self.pretrain_loss = fitted.losses["refine"]
    return encoder_state(self.encoder, self.spec, self.hp, fitted.refine)

  def _models(self):
    """(anchor encoder, judge params) as written by initial_state, or None before."""
    if not (self.workdir / JUDGE_FILE).exists():
      return None
    anchor = TunedQueryEncoder(self.encoder,
                               SentenceEncoder(self.workdir / ANCHOR_DIR).params)
    return anchor, load_judge(self.workdir / JUDGE_FILE)[0]

  def _online_stream(self):
    """The refinement examples as a stream of batches (rebuilt alike on a resume)."""
    if self._stream is None:
      anchor, _ = self._models()
      for store in self._train_stores():
        store.query_encoder = anchor
      examples = refinement_examples(self._train_stores(), self.train_data, self.fit.k,
                                     self.fit.max_evidence, self.fit.seed + 1)
      b = self.cfg.batch
      n = len(examples) // b * b
      if n == 0:
        raise ValueError(f"{len(examples)} refinement examples do not fill a batch of {b}")
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
    stream, ids, mask = self._online_stream()
    if self._parallel:
      state = distributed.replicate(state, self.mesh)
    state, metrics = self._advance(state, stream, ids, mask, n)
    return state, distributed.gather(metrics)

  def evaluate(self, state: core.TrainState) -> dict:
    """Held-out Recall@M (and @10, `iris_*` keys) over turns: single-pass with the base encoder
    (recall_at_m_base), IRIS with the learned models (recall_at_m), single-pass with the
    anchor encoder; before the models are fitted every entry is the base single pass."""
    if not self.test_data:
      return {}
    # The template is the run before fitting (the loop's first evaluation): the base single
    # pass, whether or not a resumed run's models exist already.
    models = None if state is self.template else self._models()
    params = distributed.gather(state.params) if self._parallel else state.params
    rows: dict[str, list] = {"base": [], "tuned": [], "iris": []}
    for store, conv in zip(self.stores[len(self.train_data):], self.test_data):
      for q in conv.questions:
        store.query_encoder = None
        rows["base"].append(self._recall(store, single_pass(store, q.question,
                                                             SINGLE_PASS_DEPTH)[0], q))
        if models is None:
          continue
        store.query_encoder = models[0]
        rows["tuned"].append(self._recall(store, single_pass(store, q.question,
                                                              SINGLE_PASS_DEPTH)[0], q))
        refiner = EmbeddingRefiner(TunedQueryEncoder(self.encoder, params))
        result = iris_retrieve(store, q.question, category=q.category,
                               judge=LearnedJudge(models[1], store),
                               settings=IRIS_PRESETS["learned"], refiner=refiner)
        rows["iris"].append(self._recall(store, list(result.turn_ids), q))
    mean = {name: np.mean(r, 0) if r else np.mean(rows["base"], 0) for name, r in rows.items()}
    return {"recall_at_m_base": float(mean["base"][0]), "recall_at_m": float(mean["iris"][0]),
            "recall_at_k": float(mean["iris"][1]),
            "iris_recall_at_10_single_pass_base": float(mean["base"][1]),
            "iris_recall_at_10_single_pass_tuned": float(mean["tuned"][1]),
            "iris_recall_at_10": float(mean["iris"][1])}

  def _recall(self, store, turns, q) -> tuple[float, float]:
    cut = (self.cfg.m, EVAL_AT)
    metrics = turn_metrics(store, turns, q.evidence, cut, len(set(q.evidence)))
    return metrics[f"recall_all@{cut[0]}"], metrics[f"recall_all@{cut[1]}"]
