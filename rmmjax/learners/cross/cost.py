"""What a cross reranker's run will take, before it starts: a pretraining step and a held-out
scoring batch, each compiled and timed on pairs of the data file's own texts, times the number
of each that the run takes. A sweep of runs states its time from these (most of a cross run's
time on a CPU is these steps; what is left out is said where the estimate is printed)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from rmmjax import core
from rmmjax.encode.encoder import compiler_options
from rmmjax.learners.cross.model import cross_initial_params
from rmmjax.learners.cross.pairs import bucket, pack_batch, pair_tokens
from rmmjax.learners.cross.spec import cross_spec
from rmmjax.retrieve.units import build_units
from rmmjax.step_timing import compile_and_step

SAMPLE_BATCHES = 6  # each kind of step is timed over this many batches (each length-mix its own)
# Batches packed (not run) to see how their row counts spread: a run compiles once per row
# count its batches take, and a step's time grows with its rows.
SHAPE_BATCHES = 64


@dataclasses.dataclass(frozen=True)
class StepTimes:
  train_s: float  # a pretraining step: batch x cross.pretrain_candidates pairs, with Adam
  score_s: float  # a held-out batch: batch x k pairs, forward only
  compile_s: float  # compiling each kind once per row count its batches take


def time_steps(cfg, encoder, conversations: list) -> StepTimes:
  """The median step of each kind on pairs of `conversations`' questions with random turns of
  their own conversation (LoCoMo's mix of lengths), packed as a run packs them, after their
  compile; scaled to the mean row count of many such batches (a step's time grows with its
  rows), with a compile for each row count they take. (A run's candidates are its retriever's:
  the base retriever's are as long as random turns, a tuned query encoder's longer.)"""
  rng = np.random.default_rng(0)
  spec = cross_spec(cfg, encoder.cfg)
  params = cross_initial_params(encoder, cfg.k, cfg.cross.prior_scale)
  state = core.init_state(spec, cfg.hparams(cfg.cross), params)
  step = jax.jit(core.supervised_step, compiler_options=compiler_options())
  score = jax.jit(core.scores, static_argnums=2, compiler_options=compiler_options())

  def batches(k: int, count: int = SAMPLE_BATCHES) -> list[core.Batch]:
    out = []
    for i in range(count):
      conv = conversations[i % len(conversations)]
      texts = [u.text for u in build_units(conv, "turn")]
      picks = rng.choice(len(conv.questions), cfg.batch, replace=len(conv.questions) < cfg.batch)
      # (at the length a run's pairs all take: the longest of the file's, nearly always the
      # limit's bucket)
      pairs = pair_tokens(encoder.tokenizer, [conv.questions[j].question for j in picks],
                          [list(rng.choice(texts, k)) for _ in picks], cfg.cross.max_length,
                          length=bucket(cfg.cross.max_length, cfg.cross.max_length))
      relevant = np.zeros((cfg.batch, k), bool)
      relevant[:, 0] = True
      out.append(pack_batch(core.Batch(
          q_BxD=np.zeros((cfg.batch, 1), np.float32),
          mem_BxKxD=np.zeros((cfg.batch, k, 1), np.float32),
          mask_BxK=np.ones((cfg.batch, k), bool), relevant_BxK=relevant,
          num_relevant_B=np.ones(cfg.batch, np.int32), inputs=pairs.candidates(),
          positions_BxK=np.tile(np.arange(k, dtype=np.int32), (cfg.batch, 1)))))
    return out

  box = [state]

  def train(batch):
    box[0] = jax.block_until_ready(step(box[0], batch)[0])

  # Every batch at the first one's row count: one compile, and the median step is timed at a
  # typical shape (a run's batches spread a little either side of it).
  def one_shape(bs):
    rows = bs[0].inputs.ids_RxL.shape[0]
    return [b for b in bs if b.inputs.ids_RxL.shape[0] == rows]

  def rows(bs: list) -> list[int]:
    return [b.inputs.ids_RxL.shape[0] for b in bs]

  train_batches = one_shape(batches(cfg.cross.pretrain_candidates))
  score_batches = one_shape(batches(cfg.k))
  train_compile, train_s = compile_and_step(train, train_batches)
  score_compile, score_s = compile_and_step(
      lambda b: jax.block_until_ready(score(state.params, b, spec)), score_batches)
  train_s, train_compile = at_spread(train_s, train_compile, rows(train_batches)[0],
                                     rows(batches(cfg.cross.pretrain_candidates, SHAPE_BATCHES)))
  score_s, score_compile = at_spread(score_s, score_compile, rows(score_batches)[0],
                                     rows(batches(cfg.k, SHAPE_BATCHES)))
  return StepTimes(train_s, score_s, train_compile + score_compile)


def at_spread(step_s: float, compile_s: float, timed_rows: int, rows: list[int]
              ) -> tuple[float, float]:
  """(a step timed at `timed_rows` rows scaled to the mean of a run's `rows`, a step's time
  growing with its rows; its compile once per row count among them)."""
  return step_s * float(np.mean(rows)) / timed_rows, compile_s * len(set(rows))


def run_seconds(cfg, times: StepTimes, train_items: int, heldout_questions: list[int]) -> float:
  """A run's cross reranker steps and held-out scoring: its pretraining over `train_items`
  labelled questions, its online steps (each over all k candidates), and `eval`'s batches of
  each held-out conversation's questions; with their compiles."""
  pretrains = cfg.mode != "rl" and cfg.cross.pretrain_epochs > 0
  steps = cfg.cross.pretrain_epochs * (train_items // cfg.batch) if pretrains else 0
  online = cfg.steps * times.train_s * cfg.k / cfg.cross.pretrain_candidates
  scoring = sum(-(-n // cfg.batch) for n in heldout_questions) * times.score_s
  return steps * times.train_s + online + scoring + times.compile_s
