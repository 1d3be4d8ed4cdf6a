"""Training data and supervised fits of IRIS's learned parts, from labelled questions: the
anchor and refinement query encoders and the sufficiency judge (docs/command-line.md,
learner=iris)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import final

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rmmjax import distributed
from rmmjax.fit import Fit, fit
from rmmjax.core.judge import judge_init, judge_loss
from rmmjax.core.losses import grouped_listwise_loss
from rmmjax.encode.tuned import TunedQueryEncoder
from rmmjax.learners.query_encoder.fit import pad_tokens
from rmmjax.retrieve.iris import IRIS_PRESETS, iris_retrieve
from rmmjax.retrieve.judges import SufficiencyJudge, Verdict
from rmmjax.retrieve.learned import EmbeddingRefiner, refinement_text

HOP_STATES = (5, 10, 20)  # anchor hits a refinement example assumes found
HARD_DEPTH = 100  # search depth the hard negatives come from
JUDGED_FACTS = 64  # facts a judge example keeps (the first shown)


@final
@dataclasses.dataclass(frozen=True)
class RankingExamples:
  """N queries with K candidate facts each; covers_NxKxE: candidate k covers evidence item e."""

  texts: tuple[str, ...]
  mem_NxKxD: np.ndarray
  covers_NxKxE: np.ndarray

  def __len__(self) -> int:
    return len(self.texts)


def ranking_example(store, text: str, evidence: Sequence[str], found: set[str],
                    hard: Sequence[int], k: int, e: int, rng: np.random.Generator,
                    hard_share: float = 0.5):
  """(text, mem_KxD, covers_KxE), or None when every evidence turn is found already. The K
  candidates: up to K/4 facts of the evidence turns not yet found, `hard_share` of the rest from
  `hard` (facts of other turns the search placed high), then random facts of the store: against
  its nearest neighbours alone a query may learn to rank the thousands of others above the
  evidence (K = 20, hard negatives only: a tuned anchor fell from Recall@10 0.51 to 0.13)."""
  items = [t for t in dict.fromkeys(evidence) if t not in found][:e]
  if not items:
    return None
  facts = store.facts
  positives = [f.fact_id for f in facts if f.turn_id in items][:k // 4]
  excluded = set(evidence) | found
  negatives = [f for f in hard if facts[f].turn_id not in excluded]
  chosen = list(dict.fromkeys(positives + negatives[:round((k - len(positives)) * hard_share)]))
  taken = set(chosen)
  pool = (int(i) for i in rng.permutation(len(facts))
          if facts[i].turn_id not in excluded and int(i) not in taken)
  candidates = chosen + [f for _, f in zip(range(k - len(chosen)), pool)]
  candidates = [candidates[i] for i in rng.permutation(len(candidates))]
  covers = np.zeros((k, e), bool)
  for row, fact_id in enumerate(candidates):
    if facts[fact_id].turn_id in items:
      covers[row, items.index(facts[fact_id].turn_id)] = True
  mem = np.zeros((k, store.fact_vectors([0]).shape[1]), np.float32)
  mem[:len(candidates)] = store.fact_vectors(candidates)
  return text, mem, covers


def ranking_examples(stores, conversations, k: int, e: int, seed: int, hard_share: float = 0.5,
                     hops: Sequence[int] = (0,)) -> RankingExamples:
  """Per labelled question and budget b of `hops`: the question with the best facts among the
  store's first b hits (b = 0: the question alone, an anchor example; the stores' query encoder
  is the anchor's for the others), against the evidence not found."""
  rng = np.random.default_rng(seed)
  rows = []
  for store, conv in zip(stores, conversations):
    facts = store.facts
    for q in (x for x in conv.questions if x.evidence):
      deep = [f for f, _ in store.search(q.question, HARD_DEPTH)]
      for b in hops:
        found = deep[:b]
        text = (refinement_text(q.question, [facts[f].text.split("] ", 1)[-1] for f in found])
                if b else q.question)
        rows.append(ranking_example(store, text, q.evidence, {facts[f].turn_id for f in found},
                                    deep[b:], k, e, rng, hard_share))
  rows = [r for r in rows if r is not None]
  if not rows:
    raise ValueError("no training example: no question has evidence in its conversation")
  return RankingExamples(tuple(r[0] for r in rows), np.stack([r[1] for r in rows]),
                         np.stack([r[2] for r in rows]))


def _adam_fit(loss_fn, params, lr: float, epoch_batches, plan: Fit, mesh):
  """`params` fitted by Adam at `lr` on loss_fn(params, *batch), and every step's loss."""
  adam = optax.adam(lr)

  def step(state, xs):
    params, opt = state
    loss, grads = jax.value_and_grad(loss_fn)(params, *xs)
    # optax's bias correction raises the float decay to the integer step count, which JAX's
    # strict dtype promotion (the test suite's) refuses; standard promotion gives float32.
    with jax.numpy_dtype_promotion("standard"):
      updates, opt = adam.update(grads, opt, params)
    return (optax.apply_updates(params, updates), opt), {"loss": loss}

  state, losses = fit((params, adam.init(params)), step, epoch_batches, plan, mesh)
  return distributed.gather(state[0]), losses


def fit_ranking_encoder(encoder, examples: RankingExamples, params, *, epochs: int, batch: int,
                        lr: float, tau: float, seed: int, mesh=None) -> tuple[dict, np.ndarray]:
  """(parameters, every step's loss) of a query encoder fine-tuned from `params` by the grouped
  listwise loss, each epoch's batches in a new order (the tail that fills no batch left out)."""
  if epochs:
    distributed.check_fills(len(examples), batch, "training examples")
  ids_NxT, mask_NxT = pad_tokens(encoder, examples.texts, 128)
  module = encoder.module

  def loss_fn(p, ids_BxT, mask_BxT, mem_BxKxD, covers_BxKxE):
    q_BxD = module.apply({"params": p}, ids_BxT, mask_BxT)
    scores_BxK = jnp.einsum("bkd,bd->bk", mem_BxKxD, q_BxD)
    return grouped_listwise_loss(scores_BxK, covers_BxKxE, jnp.any(mem_BxKxD != 0, -1), tau)

  rng = np.random.default_rng(seed)
  usable = len(examples) // batch * batch

  def epoch_batches(epoch: int) -> list:
    batches = []
    for rows in rng.permutation(len(examples))[:usable].reshape(-1, batch):
      # Each batch padded to its own longest text's bucket: a few compiles, far less padding.
      length = encoder.bucket_length(int(mask_NxT[rows].sum(1).max()))
      batches.append((ids_NxT[rows, :length], mask_NxT[rows, :length],
                      examples.mem_NxKxD[rows], examples.covers_NxKxE[rows]))
    return batches

  return _adam_fit(loss_fn, jax.tree.map(jnp.copy, params), lr, epoch_batches,
                   Fit(epochs, desc="ranking encoder"), mesh)


@final
class NeverSure(SufficiencyJudge):
  """Keeps IRIS searching to the last iteration, so every iteration is logged."""

  def judge(self, question, facts, raws, *, category=None) -> Verdict:
    return Verdict("PARTIAL", 0.5, "")


@final
@dataclasses.dataclass(frozen=True)
class JudgeExamples:
  q_NxD: np.ndarray
  facts_NxFxD: np.ndarray
  mask_NxF: np.ndarray
  label_N: np.ndarray  # every evidence turn is among the shown facts' turns


def judge_examples(stores, conversations, refiner_encoder) -> JudgeExamples:
  """What the judge would see at every iteration of IRIS on every labelled question."""
  q, facts, mask, labels = [], [], [], []
  refiner = EmbeddingRefiner(refiner_encoder)
  for store, conv in zip(stores, conversations):
    for question in (x for x in conv.questions if x.evidence):
      result = iris_retrieve(store, question.question, category=question.category,
                             judge=NeverSure(), settings=IRIS_PRESETS["learned"], refiner=refiner)
      q_D = np.asarray(store.query_vector(question.question), np.float32)
      for trace in result.trace:
        shown = list(trace.shown[:JUDGED_FACTS])
        f = np.zeros((JUDGED_FACTS, q_D.shape[0]), np.float32)
        m = np.zeros(JUDGED_FACTS, bool)
        if shown:
          f[:len(shown)], m[:len(shown)] = store.fact_vectors(shown), True
        q.append(q_D), facts.append(f), mask.append(m)
        labels.append(set(question.evidence) <= {store.fact(i).turn_id for i in shown})
  return JudgeExamples(np.stack(q), np.stack(facts), np.stack(mask), np.array(labels))


def fit_judge(examples: JudgeExamples, *, epochs: int, batch: int, lr: float, seed: int,
              hidden: int = 64, mesh=None) -> tuple[dict, np.ndarray]:
  """The judge fitted by Adam on binary cross-entropy: parameters and every step's loss."""
  n, dim = examples.q_NxD.shape
  rng = np.random.default_rng(seed)

  def epoch_batches(epoch: int) -> list:
    pad = -n % batch  # the last batch is padded with weight-0 rows: one compile
    rows = np.concatenate([rng.permutation(n), np.zeros(pad, int)]).reshape(-1, batch)
    weights = np.concatenate([np.ones(n), np.zeros(pad)]).astype(np.float32).reshape(-1, batch)
    return [(examples.q_NxD[r], examples.facts_NxFxD[r], examples.mask_NxF[r], examples.label_N[r],
             w) for r, w in zip(rows, weights)]

  return _adam_fit(judge_loss, judge_init(jax.random.PRNGKey(seed), dim, hidden), lr,
                   epoch_batches, Fit(epochs, desc="judge"), mesh)


@final
@dataclasses.dataclass(frozen=True)
class IrisFit:
  """How the three models are fitted (the anchor skipped when given)."""

  k: int = 64  # candidate facts per example
  hard_share: float = 0.5  # of an example's negatives, the search's own top hits (the rest random)
  max_evidence: int = 8  # evidence turns an example scores (LoCoMo questions have at most 8)
  epochs: int = 2
  batch: int = 16
  lr: float = 2e-5
  tau: float = 0.05
  judge_epochs: int = 20
  judge_batch: int = 64
  judge_lr: float = 1e-3
  seed: int = 0


def fit_iris_encoders(encoder, stores, conversations, fit: IrisFit = IrisFit(),
                      anchor=None, mesh=None) -> tuple[dict, dict, dict]:
  """(anchor, refine, losses), the anchor fitted unless given; the stores then search with it."""
  def fit_from(params, query_encoder, seed: int, hops):
    for store in stores:
      store.query_encoder = query_encoder
    examples = ranking_examples(stores, conversations, fit.k, fit.max_evidence, seed,
                                fit.hard_share, hops)
    return fit_ranking_encoder(encoder, examples, params, epochs=fit.epochs, batch=fit.batch,
                               lr=fit.lr, tau=fit.tau, seed=seed, mesh=mesh)

  losses = {}
  if anchor is None:
    anchor, losses["anchor"] = fit_from(encoder.params, None, fit.seed, (0,))
  refine, losses["refine"] = fit_from(anchor, TunedQueryEncoder(encoder, anchor), fit.seed + 1,
                                      HOP_STATES)
  return anchor, refine, losses


def fit_iris_judge(encoder, stores, conversations, refine, fit: IrisFit = IrisFit(),
                   mesh=None) -> tuple[dict, np.ndarray]:
  """The judge fitted on IRIS runs with `refine` (the stores searching with the anchor)."""
  logged = judge_examples(stores, conversations, TunedQueryEncoder(encoder, refine))
  return fit_judge(logged, epochs=fit.judge_epochs, batch=fit.judge_batch, lr=fit.judge_lr,
                   seed=fit.seed + 2, mesh=mesh)
