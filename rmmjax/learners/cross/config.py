"""The cross reranker's section of the config (variant=cross)."""

from __future__ import annotations

import dataclasses

from rmmjax.learners.section import Learning, key

# The encoder's computation dtypes (besides auto: see Cross.compute_dtype).
COMPUTE_DTYPES = ("float32", "bfloat16")
# The losses the pretraining may take (rmmjax.core.losses.PRETRAIN_LOSSES).
PRETRAIN_LOSSES = ("softmax", "lambda", "weakest")
# Whether it also pretrains on LoCoMo's observations (Cross.observations): auto reads them where
# the data holds them.
OBSERVATIONS = ("auto", "true", "false")


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

  K = 50 over turns, the locomo_cross config's k (the locomo config's is 20): with the flat
  prior, 0.694 against 0.667 at K = 20 on the same folds (--arm k50-prior0 against --arm
  prior0): 50 candidates hold more of the evidence, for 2.5 times the scoring. Together the
  defaults are --arm k50-observations-prior0's settings: 0.711 (folds 0.702, 0.718) against the recipe's 0.658,
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
  top of the list weighs most; -0.007 [-0.020, +0.002] against softmax, --arm lambda);
  weakest, each relevant candidate's cross-entropy against the irrelevant ones alone, the
  largest of a question's (Recall@5 counts a question whose evidence is several turns only
  when every piece is found: its hardest piece takes the gradient; --arm weakest).
  """

  NAME = "cross"
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
    if cfg.config == "latent":
      raise ValueError(f"learner={cfg.learner} reads the text of questions and memories; the "
                       "latent simulator has embeddings only (use --config locomo)")
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
