"""The pure, jit-compiled core of rmmjax: no file, network, clock, global RNG or print."""

from rmmjax.core.bert import BertConfig
from rmmjax.core.losses import (baseline_values, citation_rewards, listwise_loss, reinforce_loss,
                                set_reward)
from rmmjax.core.model import Model, rank_prior_init
from rmmjax.core.optim import LowRank, adam, adam_init, adam_update, global_norm
from rmmjax.core.selection import (gumbel_top_m, perturbed_top_m, selection_entropy,
                                   selection_log_prob, selection_log_prob_terms, top_m)
from rmmjax.core.simulate import (SimSpec, World, make_world, sample_batch, sample_eval_batch,
                                  simulate_citations)
from rmmjax.core.step import (evaluate, init_state, recall_at_m, reinforce_update,
                              sample_selection, scores, scores_and_pullback, supervised_step,
                              train_step)
from rmmjax.core.sweep import make_run, make_sweep, run_steps, stack_hparams
from rmmjax.core.types import (BASELINE_KINDS, Batch, CoreSpec, HParams, TrainState)

__all__ = [
    "BASELINE_KINDS", "Batch", "BertConfig", "CoreSpec", "HParams", "LowRank", "Model", "SimSpec",
    "TrainState", "World", "adam", "adam_init", "adam_update", "baseline_values",
    "citation_rewards", "evaluate", "global_norm", "gumbel_top_m", "init_state", "listwise_loss",
    "make_run", "make_sweep", "make_world", "perturbed_top_m", "recall_at_m", "rank_prior_init",
    "reinforce_loss", "reinforce_update", "run_steps", "sample_batch", "sample_eval_batch",
    "sample_selection", "scores", "scores_and_pullback", "selection_entropy", "selection_log_prob",
    "selection_log_prob_terms", "set_reward", "simulate_citations", "stack_hparams",
    "supervised_step", "top_m", "train_step"]
