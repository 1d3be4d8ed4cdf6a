"""Sweeps over replayed conversations whose configurations cannot share one compiled program:
the query encoder, the cross reranker (learner=both or over a tuned encoder), or a grid over
keys that change shapes (k, epochs, candidates). Every configuration x fold is a training run
of its own (`train --set folds=N --set fold=I`, in `runs/<configuration>/fold_<I>`) and is
measured by `eval` on the conversations its fold holds out, one after another. A run killed
midway resumes from its checkpoints; a finished run's held-out metrics (`heldout.json`) are
not computed again. A run's own summary holds no held-out scores: `eval`'s are its measure.
Before the first run, a sweep of query encoder or cross reranker runs states their time from
each kind of step timed once (`estimate`); every run then reports the time left.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import time
from pathlib import Path

import jax
import numpy as np

from rmmjax.config import Config, encoder_stage, sections, with_values
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.encoder import model_identity
from rmmjax.eval.retrieval import evaluate_retrieval
from rmmjax.io.checkpoint import saved_steps
from rmmjax.io.trained import RECORD_FILE
from rmmjax.io.workdir import LOCK_FILE, atomic_write_json
from rmmjax.memory.topic_units import conversation_units
from rmmjax.replay.candidates import folds, unit_pools
from rmmjax.retrieve.units import build_units
from rmmjax.train.inputs import base_encoder, observations_found
from rmmjax.train.loop import train
from rmmjax.train.sweep_table import FoldResult

HELDOUT_FILE = "heldout.json"
METRICS = ("recall_all@{m}", "recall_any@{m}", "ndcg@10", "mrr")


def fold_tests(cfg: Config, num_folds: int) -> tuple[list, list[list[int]]]:
  """The file's conversations with questions and each fold's held-out indices, refused
  before any work when the folds cannot be made."""
  conversations, _ = load_locomo(Path(cfg.data))
  conversations = [c for c in conversations if c.questions]
  if not 2 <= num_folds <= len(conversations):
    raise ValueError(f"--folds {num_folds}: expected 2 to the {len(conversations)} "
                     f"conversations with questions in {cfg.data}")
  return conversations, folds(len(conversations), num_folds)


def check_units(cfg: Config, conversations: list, ks: set[int]) -> None:
  """Refuses a k above a conversation's units before any run. Topic units are built here as
  each run builds them, from the replay's base encoder (its disk cache then serves the runs)."""
  build = (build_units if cfg.units != "topic" else
           functools.partial(conversation_units, encoder=base_encoder()))
  units = {c.conversation_id: build(c, cfg.units) for c in conversations}
  for k in sorted(ks):
    unit_pools(conversations, cfg.units, k, unit_builder=lambda c, _: units[c.conversation_id])


def _cutoffs(cfg: Config) -> tuple[int, ...]:
  return tuple(dict.fromkeys((cfg.m, 10)))  # (the table's Recall@M, and NDCG@10)


def run_dir(workdir: Path, index: int, fold: int) -> Path:
  return Path(workdir) / "runs" / f"{index:03d}" / f"fold_{fold}"


def _evaluate(cfg: Config, model: Path, encoder) -> dict:
  """eval of a trained workdir on the conversations it did not train on, per question."""
  model_args = ({"query_encoder": model} if cfg.learner == "query_encoder" else
                {"reranker": model})
  return evaluate_retrieval(cfg.dataset, Path(cfg.data), cfg.units, cfg.retriever,
                            _cutoffs(cfg), encoder=encoder, per_question=True, **model_args)


def run_all(cfg: Config, configs: list[Config], conversations: list, tests: list[list[int]],
            workdir: Path, progress: bool, report, todo: list[tuple[int, int]], encoder=None
            ) -> list[FoldResult]:
  """Trains and measures the runs `todo` (`unfinished`'s, checked before anything was
  written); every fold's results."""
  started = time.perf_counter()
  for n, (i, f) in enumerate(todo):
    one = _with_fold(configs[i], len(tests), f)
    where = run_dir(workdir, i, f)
    share_stage(one, where, [run_dir(workdir, j, f) for j in range(len(configs)) if j != i])
    # Measured once, by eval below: the run's own held-out scores would be the same numbers.
    train(one, where, progress=progress, encoder=encoder, measure_heldout=False)
    atomic_write_json(where / HELDOUT_FILE, {"settings": _settings(one),
                                             "per_question": _evaluate(one, where,
                                                                       encoder)["per_question"]})
    spent = time.perf_counter() - started
    report(f"run {n + 1}/{len(todo)} done (configuration {i}, fold {f}) after "
           f"{spent / 60:.1f} min; about {spent / (n + 1) * (len(todo) - n - 1) / 60:.1f} min "
           "left")
  base = _evaluate_base(cfg, encoder)
  results = []
  names = [name.format(m=cfg.m) for name in METRICS]
  for f in range(len(tests)):
    per_run = [json.loads((run_dir(workdir, i, f) / HELDOUT_FILE).read_text())["per_question"]
               for i in range(len(configs))]
    convs = [q["conversation"] for q in per_run[0]]
    held = set(convs)
    base_rows = [q for q in base if q["conversation"] in held]
    expected = [conversations[i].conversation_id for i in tests[f]]
    if (list(dict.fromkeys(convs)) != expected or any(
        [q["conversation"] for q in rows] != convs for rows in per_run + [base_rows])):
      raise ValueError(f"fold {f}'s runs were not measured on its held-out conversations "
                       f"({', '.join(expected)}) alone and whole; use a fresh workdir")
    results.append(FoldResult(convs, [q["category"] for q in per_run[0]],
                              np.array([q[f"recall_all@{cfg.m}"] for q in base_rows]), None,
                              {name: np.array([[q[name] for q in rows] for rows in per_run])
                               for name in names}))
  return results


def announce(configs: list[Config], conversations: list, tests: list[list[int]],
             todo: list[tuple[int, int]], workdir: Path, best: bool, report) -> None:
  """What the sweep will run and, for query encoder and cross reranker runs, the time it will
  take."""
  done = len(configs) * len(tests) - len(todo)
  report(f"sweep: {len(configs)} configurations x {len(tests)} folds = "
         f"{len(configs) * len(tests)} runs, each a training of its own (its own compiles); "
         f"{len(todo)} to run ({done} done)")
  seconds = estimate(configs, conversations, tests, todo, workdir, best)
  runs = [configs[i] for i, _ in todo]
  if seconds is not None:
    took = f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
    timed = ([] if all(c.learner == "reranker" for c in runs) else
             ["the query encoder's setup and steps"])
    costed = runs + ([configs[0]] if best else [])  # (best/ is trained as configuration 0)
    cross = [c for c in costed if c.variant == "cross"]
    if cross:
      observed = any(c.cross.reads_observations(c) for c in cross)
      timed.append("the cross reranker's pretraining over the questions"
                   + (" and the training conversations' LoCoMo observations, if any"
                      if observed else "")
                   + ", its online steps and held-out scoring over K = "
                   + " or ".join(sorted({str(c.k) for c in cross}, key=int)) + " candidates")
    left = (["each cross run's candidate retrieval"] if any(c.learner == "reranker" for c in runs)
            else []) + (["the query encoder's held-out eval"]
                        if any(c.learner == "query_encoder" for c in runs) else []) + (
        # (measured on the dev file: 72 tokens a pair against the base retriever's 61 and the
        # random turns' 62, 22 packed rows a pretraining batch against 18)
        ["the tuned query encoder's longer candidate turns (random turns are timed)"]
        if any(c.variant == "cross" and (c.learner == "both" or c.query_encoder) for c in runs)
        else [])
    report(f"estimated time: {took}" + (", best/ included" if best else "") + " ("
           + " and ".join(timed) + ", each kind of step compiled and timed here on the file's "
           "own texts)" + (f"; not in it: {', '.join(left)}" if left else ""))
  elif todo:  # (said, so that no estimate is not read as no cost)
    report("no time estimate before the first run: " + (
        f"it times a step on one device, and these runs spread over {len(jax.devices())}"
        if all(map(_costed, runs)) else
        "it is made for the query encoder's and the cross reranker's runs, not the "
        "embedding rerankers'"))
  report("the time left is reported after each run")


def _costed(c: Config) -> bool:
  """A run the estimate times: a query encoder's, or a cross reranker's (with its stage)."""
  return c.learner == "query_encoder" or c.variant == "cross"


def estimate(configs: list[Config], conversations: list, tests: list[list[int]],
             todo: list[tuple[int, int]], workdir: Path, best: bool, encoder=None
             ) -> float | None:
  """Seconds the runs `todo` (and best/, costed as configuration 0 on every conversation) will
  take in their query encoder's setup and steps (`encoder_cost`; a learner=both run's cross
  candidates costed as its stage's setup) and their cross reranker's steps and held-out
  scoring (`learners.cross.cost`), each kind of step timed once per shape; a stage already
  trained, or a cross run already pretrained, is not costed again. None unless every run is
  one of those on one device (a step timed whole on one device would say little of one split
  over several, or not fit)."""
  if not todo or not all(_costed(configs[i]) for i, _ in todo) or len(jax.devices()) > 1:
    return None
  from rmmjax.learners.cross.cost import run_seconds, time_steps  # noqa: PLC0415
  from rmmjax.train.encoder_cost import stage_seconds, time_stage  # noqa: PLC0415
  encoder = encoder or base_encoder()
  timed, staged = {}, {}

  def times(c: Config):
    shape = (c.k, c.batch, c.cross.pretrain_candidates, c.cross.max_length,
             c.cross.compute_dtype, c.cross.prior_scale)
    if shape not in timed:
      timed[shape] = time_steps(c, encoder, conversations)
    return timed[shape]

  def stage_key(c: Config) -> tuple:
    return (c.k, c.batch, c.units, c.retriever, c.mode, c.encoder_tuning, c.seed)

  def stage_times(c: Config, fold: int):
    key = stage_key(c)[:-1]  # (the seed changes no step's time)
    if key not in staged:
      staged[key] = time_stage(with_values(c, {"folds": len(tests), "fold": fold}), encoder)
    return staged[key]

  trained = set()  # (fold, stage) of the stages costed: a learner=both run shares its fold's

  def cost(c: Config, where: Path, fold, train: list, heldout: list[int]) -> float:
    seconds = 0.0
    stage = where if c.learner == "query_encoder" else where / "query_encoder"
    if c.learner != "reranker":
      st = stage_times(c, fold if fold != "best" else 0)
      if (stage / "summary.json").exists() or (
          c.learner == "both" and (fold, stage_key(c)) in trained):
        seconds += st.setup_s  # (resumed finished: its task is built again)
      else:
        seconds += stage_seconds(c, st, [len(x.questions) for x in train])
        trained.add((fold, stage_key(c)))
      seconds += st.setup_s if c.learner == "both" else 0.0  # (its cross run's candidates)
    if c.learner != "query_encoder":
      pretrained = bool(saved_steps(where / "checkpoints"))
      seconds += run_seconds(c, times(c), 0 if pretrained else _items(c, conversations, train),
                             heldout)
    return seconds

  total = 0.0
  for i, f in todo:
    held = set(tests[f])
    total += cost(configs[i], run_dir(workdir, i, f), f,
                  [x for j, x in enumerate(conversations) if j not in held],
                  [len(conversations[j].questions) for j in tests[f]])
  if best:
    total += cost(configs[0], Path(workdir) / "best", "best", conversations, [])
  return total


def _items(cfg: Config, conversations: list, train: list) -> int:
  """The labelled questions a cross run pretrains on: the training conversations' questions,
  and their observations where the run reads them."""
  items = sum(len(x.questions) for x in train)
  if cfg.cross.reads_observations(cfg):
    found = observations_found(Path(cfg.data), conversations, cfg)
    items += sum(len(found.get(x.conversation_id, ())) for x in train)
  return items


def unfinished(configs: list[Config], num_folds: int, workdir: Path, encoder=None
               ) -> list[tuple[int, int]]:
  """(configuration, fold) of every run without its held-out measurement, fold by fold. A
  finished run of other settings, or trained with another encoder than the one the sweep would
  use now, is refused (its row would mix two sweeps), as is a measurement that cannot be read."""
  ours = encoder.identity if encoder is not None else model_identity()
  todo = []
  for f in range(num_folds):
    for i, c in enumerate(configs):
      where = run_dir(workdir, i, f)
      path = where / HELDOUT_FILE
      if not path.is_file():
        todo.append((i, f))
        continue
      try:
        settings = json.loads(path.read_text())["settings"]
        theirs = json.loads((where / RECORD_FILE).read_text())["encoder"]
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} or the {RECORD_FILE} beside it cannot be read ({e}); delete "
                         f"{path} to measure that run again") from None
      if _with_added(settings) != _settings(_with_fold(c, num_folds, f)):
        raise ValueError(f"{path} holds a run of other settings than this sweep's configuration "
                         f"{i}; use a fresh workdir")
      if theirs != ours:
        raise ValueError(f"{where} was trained with the encoder {theirs}, and this sweep's is "
                         f"{ours} (RMMJAX_ENCODER): its row would mix two encoders; use that "
                         "encoder again or a fresh workdir")
  return todo


def _settings(cfg: Config) -> dict:
  """A run's settings as its heldout.json records them (the data file is its content: moved
  elsewhere, it is the same run)."""
  return json.loads(json.dumps({k: v for k, v in cfg.values().items() if k != "data"},
                               default=str))


def _with_added(settings: dict) -> dict:
  """A run's recorded settings as a config.json written then reads today: each value in its
  key's present type (sections.RETYPED), and the keys added since at the value such a run had
  (sections.ABSENT), else at the defaults of the run's named config and learner: a finished
  run still counts, and one of other settings does not."""
  settings = {k: sections.retyped_setting(k, v) for k, v in settings.items()}
  fields = {f.name for f in dataclasses.fields(Config)}
  defaults = _settings(Config(**{k: v for k, v in settings.items() if k in fields}))
  absent = {f"{s}.{k}": v for (s, k), v in sections.ABSENT.items()}
  return settings | {k: absent.get(k, v) for k, v in defaults.items() if k not in settings}


def share_stage(cfg: Config, where: Path, others: list[Path]) -> None:
  """A learner=both run's query encoder stage, copied from another configuration's run of the
  same fold whose stage is the same run, finished (a grid over the cross reranker's keys then
  trains one stage per fold, not one per configuration); the run resumes it as finished, with
  the outputs it would have trained to (training is deterministic)."""
  stage = where / "query_encoder"
  if cfg.learner != "both" or stage.exists():
    return
  ours = json.loads(encoder_stage(cfg).validate().resolved().to_json())
  for other in others:
    source = other / "query_encoder"
    try:
      same = ((source / "summary.json").is_file()
              and json.loads((source / "config.json").read_text()) == ours)
    except (OSError, ValueError):  # (a stage being written, or unreadable: trained here)
      same = False
    if same:
      partial = where / ".query_encoder.partial"  # (a copy killed midway is made again)
      shutil.rmtree(partial, ignore_errors=True)
      shutil.copytree(source, partial, ignore=shutil.ignore_patterns(LOCK_FILE))
      partial.rename(stage)
      return


def _with_fold(cfg: Config, num_folds: int, fold: int) -> Config:
  return with_values(cfg, {"folds": num_folds, "fold": fold}).validate()


def _evaluate_base(cfg: Config, encoder) -> list[dict]:
  """The base retriever's metrics of every question (no model: nothing is left out)."""
  return evaluate_retrieval(cfg.dataset, Path(cfg.data), cfg.units, cfg.retriever,
                            _cutoffs(cfg), encoder=encoder, per_question=True)["per_question"]
