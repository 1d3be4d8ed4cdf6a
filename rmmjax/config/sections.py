"""Each learner's section of the configuration: its own keys with its own defaults.

A run's config holds the shared keys and the sections of the learners it trains (`Config.
sections`): a key of another learner's section is unknown to it, and no learner's defaults are
written over by another's. Each section carries the rates of its own learning (its online
temperature, learning rate and step count, its pretraining), since those differ by learner
(an encoder fine-tuned at 1e-5 over scores trained at temperature 1, a linear map at 1e-4 over
scores at 0.05). `check` refuses a value the section cannot run with, naming it.
"""

from __future__ import annotations

import dataclasses

from rmmjax.config.choices import COMPUTE_DTYPES, OBSERVATIONS, PRETRAIN_LOSSES, TUNES
from rmmjax.config.declared import key
from rmmjax.retrieve.iris import IRIS_PRESETS

# Far outside these no run learns anything (a learning rate of 10 sends the listwise loss from
# 1.8 to 768; every rate measured helping is 1e-3 or below, and 1e-2 already collapsed the
# linear reranker; a temperature of 1e-9 turns the sampling into a sort): refused rather than
# run. The temperatures used run from 0.05 to 2.
RATE = {"low": 0.0, "high": 0.1, "low_open": True}
TAU = {"low": 1e-3, "high": 100.0}
STEPS = {"low": 0, "high": 10**7}
EPOCHS = {"low": 0, "high": 1000}


@dataclasses.dataclass(frozen=True)
class Learning:
  """What every learner's training has: online steps (REINFORCE at tau and lr) after a listwise
  pretraining on labelled evidence (pretrain_epochs at pretrain_lr and pretrain_tau)."""

  tau: float = key(0.5, **TAU)
  lr: float = key(1e-3, **RATE)
  steps: int = key(10_000, **STEPS)
  pretrain_epochs: int = key(10, **EPOCHS)
  pretrain_lr: float = key(1e-4, **RATE)
  pretrain_tau: float = key(0.05, **TAU)

  def check(self, cfg) -> None:
    """Refuses a value that does not fit the rest of the run `cfg` (each key's own limits are
    declared with it and checked before this)."""


@dataclasses.dataclass(frozen=True)
class Reranker(Learning):
  """The paper's rerankers over embeddings (variant linear or mlp): `formulation` of the linear
  map's gradient, the MLP's `hidden` width, and a learnt bias per base position (`rank_prior`)."""

  NAME = "reranker"
  formulation: str = key("fast", choices=("fast", "naive"))
  hidden: int = key(256, low=1)
  rank_prior: bool = False


@dataclasses.dataclass(frozen=True)
class Cross(Learning):
  """The cross reranker (variant=cross, rmmjax.learners.cross), at the rates of fine-tuning an
  encoder: 2e-5 and tau 1 for the listwise pretraining over `pretrain_candidates` of each
  question's K candidates (the relevant ones, at most half, then others at random: that share of
  a pass over all K), near the recipe of a trial made before this learner existed, not tuned.
  Two epochs, the one value searched (on the dev file's 2-fold cross-validation, so optimistic):
  Recall@5 over the tuned encoder's candidates 0.634 after one epoch, 0.658 after two (+0.024
  [+0.010, +0.039]). No online steps by default: on the same folds (experiments/
  cross_reranker.py) 60 REINFORCE steps from simulated citations at lr 1e-5 lowered Recall@5
  from 0.575 to 0.555 (-0.019 [-0.037, -0.003]): replayed citations repeat the labels the
  pretraining used, with noise. The agent still learns online from an LLM's real citations.

  `observations`: the training conversations' LoCoMo observations (the annotators' statements
  of what each session established, each naming its turn) join their questions, as more
  labelled (text, turn) pairs; the held-out conversations keep their questions alone. On the
  dev file's 2-fold cross-validation +0.008 [+0.001, +0.014] Recall@5 (0.666 against 0.658,
  experiments/sweep_cross.py --arm observations) for 2.2 times the pretraining, and +0.017 at
  K = 50 (0.711 against 0.694, --arm k50-observations-prior0 against --arm k50-prior0). auto
  (the default) reads them in a run over turns of a LoCoMo file whose training conversations
  hold some, and trains without them otherwise (the summary counts them); true refuses a file
  without them; false never reads them.

  K over turns: naming variant=cross on the locomo config sets k=50 unless k is named too
  (`CANDIDATES_OVER_TURNS`; other units keep the config's 20): with the flat prior, 0.694
  against 0.667 at K = 20 on the same folds (--arm k50-prior0 against --arm prior0): 50
  candidates hold more of the evidence, for 2.5 times the scoring. Together the defaults are --arm
  k50-observations-prior0's settings: 0.711 (folds 0.702, 0.718) against the recipe's 0.658,
  +0.053 [+0.037, +0.067], chosen on those same folds, so optimistic.

  Pretraining draws each question's irrelevant candidates from base rank `negatives_from_rank`
  down (those above only where too few others exist: the top of a tuned retriever's list holds
  evidence the labels missed). Each (question, memory) pair is cut to `max_length` tokens;
  `compute_dtype` is the encoder's computation dtype (auto: bfloat16 on an accelerator,
  float32 on a CPU, which has no fast
  bfloat16 matmul; parameters and optimizer state stay float32 either way); `prior_scale`
  spreads the base positions' starting prior (-prior_scale * log(1 + position)): flat by
  default, as reading every candidate's text did better without the retriever's order to
  start from (0.667 against 0.658 at 1, +0.010 [+0.000, +0.017] on the dev file's 2 folds,
  experiments/sweep_cross.py --arm prior0, over turns; the prior still learns, from zero);
  the scoring layer starts at zero and passes the encoder no gradient until it grows, so it
  and the prior learn at `head_lr_scale` times the rate (10 instead of 50: -0.012 [-0.023,
  -0.003] on the same folds, experiments/sweep_cross.py --arm head10). `pretrain_loss`: softmax, the
  cross-entropy of the softmax over each question's candidates; lambda, LambdaLoss (pairs of a
  relevant and an irrelevant candidate, each weighted by the NDCG its swap would change: the
  top of the list weighs most; -0.007 [-0.020, +0.002] against softmax, --arm lambda).
  """

  NAME = "cross"
  CANDIDATES_OVER_TURNS = 50  # the k of variant=cross over turns, unless named (see above)
  tau: float = 1.0
  lr: float = 1e-5
  steps: int = 0  # its pretraining alone (the checkpoint is step 0)
  pretrain_epochs: int = 2
  pretrain_lr: float = 2e-5
  pretrain_tau: float = 1.0
  max_length: int = key(128, low=16, high=512)  # (tokens: the encoder's window)
  pretrain_candidates: int = 8
  negatives_from_rank: int = 1
  compute_dtype: str = key("auto", choices=("auto", *COMPUTE_DTYPES))
  prior_scale: float = key(0.0, low=0.0, high=100.0)
  # (at 1e9 the loss went from 1.8 to 37,125)
  head_lr_scale: float = key(50.0, low=0.0, high=1e4, low_open=True)
  observations: str = key("auto", choices=OBSERVATIONS)
  pretrain_loss: str = key("softmax", choices=PRETRAIN_LOSSES)

  def check(self, cfg) -> None:
    if not 2 <= self.pretrain_candidates <= cfg.k:
      raise ValueError(f"cross.pretrain_candidates={self.pretrain_candidates}: expected 2 to "
                       f"k={cfg.k}")
    if not 1 <= self.negatives_from_rank <= cfg.k:
      raise ValueError(f"cross.negatives_from_rank={self.negatives_from_rank}: expected 1 to "
                       f"k={cfg.k} (the base rank from which pretraining draws negatives)")
    if self.observations == "true" and cfg.units != "turn":
      raise ValueError(f"cross.observations=true pairs each observation with the turn it names: "
                       f"expected units=turn, not {cfg.units}")

  def reads_observations(self, cfg) -> bool:
    """Whether the run looks for observations in its data (auto or true, over turns; auto goes
    without where the training conversations hold none)."""
    return self.observations != "false" and cfg.units == "turn"


@dataclasses.dataclass(frozen=True)
class EncoderTuning(Learning):
  """The retriever's query encoder (learner query_encoder, the first stage of learner=both, and
  IRIS's anchor under learner=iris): supervised listwise pretraining on labelled evidence in
  batches of `pretrain_batch` questions, then online REINFORCE. `tune`: query, the tuned encoder
  embeds the questions and the memories keep the base encoder's embeddings (no re-embedding);
  both, it embeds the memories too, so the bank is re-embedded after training (training
  back-propagates through the questions in both cases; through the K candidates as well would
  cost about K times as much per step). The rates come from the cross-validated ablation's
  exploratory runs (experiments/replay_ablation.py)."""

  NAME = "encoder_tuning"
  tau: float = 0.05
  lr: float = 1e-5
  steps: int = 600
  pretrain_epochs: int = 2
  pretrain_lr: float = 2e-5
  pretrain_tau: float = 0.05
  pretrain_batch: int = key(16, low=1)
  tune: str = key("query", choices=TUNES)


@dataclasses.dataclass(frozen=True)
class IrisEvidence:
  """A reranker over IRIS's evidence (units=lace, learner=reranker): IRIS gathers the candidates
  from a LaceMem with `preset` (rmmjax.retrieve.iris.IRIS_PRESETS); the reranker learns online
  from simulated citations (weight citation_reward) plus the offline heuristic judge's verdict
  on the facts it selected (weight verdict_reward, which needs no labels)."""

  NAME = "iris_evidence"
  preset: str = key("default", choices=tuple(IRIS_PRESETS))
  citation_reward: float = key(1.0, low=0.0)
  verdict_reward: float = key(0.0, low=0.0)

  def check(self, cfg) -> None:
    if not (self.citation_reward or self.verdict_reward):
      raise ValueError(f"iris_evidence.citation_reward={self.citation_reward}, "
                       f"verdict_reward={self.verdict_reward}: expected weights >= 0, not both 0")


@dataclasses.dataclass(frozen=True)
class IrisModels:
  """IRIS's own models (learner=iris, rmmjax.replay.iris_models): each fitting and online example
  ranks `k` candidate facts, up to a quarter of them evidence; of the rest, `hard_share` are the
  search's own top hits and the others are drawn at random from the conversation (a fit against
  the nearest hits alone, K = 20, drove the anchor below the base encoder: Recall@10 0.51 ->
  0.13 on a conversation it trained on). 64 and 0.5 were chosen on one split of the dev file
  (six conversations fitted, two held out: held-out Recall@10 of the anchor 0.704, against
  0.666 with hard negatives only and 0.595 for the base encoder). With holdout=0 the last
  `validation` training conversations are kept out of the fits, so the summary can compare the
  tuned anchor with the base encoder on conversations it did not fit (and warn when worse)."""

  NAME = "iris_models"
  k: int = 64
  hard_share: float = key(0.5, low=0.0, high=1.0)
  validation: int = key(1, low=0)  # (0: no check)

  def check(self, cfg) -> None:
    if self.k < max(4, cfg.m):
      raise ValueError(f"iris_models.k={self.k}: expected at least 4 candidate facts per "
                       f"example (a quarter of them evidence) and at least m={cfg.m}")
    if cfg.holdout and self.validation != IrisModels.validation:
      raise ValueError(f"iris_models.validation={self.validation} applies with holdout=0; with "
                       f"holdout={cfg.holdout} the held-out conversations check the fit")


SECTIONS = {s.NAME: s for s in (Reranker, Cross, EncoderTuning, IrisEvidence, IrisModels)}


def section_names(learner: str, variant: str, units: str, latent: bool) -> tuple[str, ...]:
  """The sections of a run that trains `learner` (the reranker's family `variant`), in the order
  it trains them; the last is the one whose online steps the training loop runs."""
  family = "cross" if variant == "cross" else "reranker"
  if latent:
    return (family,)
  if learner == "query_encoder":
    return ("encoder_tuning",)
  if learner == "iris":
    return ("iris_models", "encoder_tuning")
  stages = ("encoder_tuning",) if learner == "both" else ()
  return stages + (("iris_evidence",) if units == "lace" else ()) + (family,)
