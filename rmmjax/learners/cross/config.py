"""The cross reranker's section of the config (variant=cross)."""

from __future__ import annotations

import dataclasses

from rmmjax.learners.section import EPOCHS, Learning, key

COMPUTE_DTYPES = ("float32", "bfloat16")  # besides auto: bfloat16 on an accelerator, else float32
PRETRAIN_LOSSES = ("softmax", "lambda", "weakest")  # rmmjax.core.losses.PRETRAIN_LOSSES
OBSERVATIONS = ("auto", "true", "false")  # auto: over turns where the training data hold some


@dataclasses.dataclass(frozen=True)
class Cross(Learning):
  """The cross reranker (variant=cross; its keys: docs/command-line.md). The defaults were
  chosen on the dev file's 2-fold cross-validation, so optimistic (Recall@5 by
  experiments/sweep_cross.py --arm NAME): two pretraining epochs (0.658 against 0.634); no
  online steps (60 REINFORCE steps lowered it from 0.575 to 0.555: they repeat the
  pretraining's labels, with noise); observations (+0.008, for 2.2 times the pretraining);
  K = 50 in the locomo_cross config (0.694 against 0.667 at 20); a flat starting prior
  (+0.009); `head_lr_scale` 50 (10: -0.012). Negatives come from base rank
  `negatives_from_rank` down: the top of a tuned retriever's list holds evidence the labels
  missed. `pretrain_loss` weakest takes each question's hardest relevant candidate (Recall@5
  counts a question only when every piece is found). `hard_epochs` more epochs follow the
  pretraining, each question's negatives the candidates it then ranks highest (one random
  epoch and one hard: +0.012 over two random at K = 20; not measured over the defaults).
  `previous_turn` reads each turn followed by the one before it in its session, in training
  and wherever the reranker reads replayed candidates (`eval`): +0.017 at K = 20 for about 1.5
  times a run, so not a default. `second_reading` adds pretraining rows of a question read
  beside one of its evidence turns, the rest its targets: the second reading beside the
  evidence ranked first that they train reads no better than the first (-0.005 at K = 20)."""

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
  previous_turn: bool = False
  # Epochs after the pretraining whose negatives are the ones the pretrained reranker scores
  # highest (mined once, over every training question's K candidates).
  hard_epochs: int = key(0, **EPOCHS)
  # Training rows beside each question: the question read with one of its evidence turns, the
  # rest of its evidence the targets (`pairs.with_second_readings`).
  second_reading: bool = False

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
    pretraining = {"cross.hard_epochs": self.hard_epochs,
                   "cross.second_reading": self.second_reading}
    if any(pretraining.values()) and (cfg.mode == "rl" or not self.pretrain_epochs):
      name, value = next((k, v) for k, v in pretraining.items() if v)
      raise ValueError(f"{name}={str(value).lower()} changes the "
                       f"pretraining: expected cross.pretrain_epochs >= 1 and a mode that "
                       f"pretrains, not mode={cfg.mode} with cross.pretrain_epochs="
                       f"{self.pretrain_epochs}")
    turns = {"observations": "pairs each observation with the turn it names",
             "previous_turn": "reads each turn beside the one before it",
             "second_reading": "reads a question beside an evidence turn it found"}
    for name, what in turns.items():
      if getattr(self, name) in (True, "true") and cfg.units != "turn":
        raise ValueError(f"cross.{name}=true {what}: expected units=turn, not {cfg.units}")

  def reads_observations(self, cfg) -> bool:
    """Whether the run looks for observations in its data (auto or true, over turns)."""
    return self.observations != "false" and cfg.units == "turn"
