"""Sweeps over replayed conversations whose configurations cannot share one compiled program:
the query encoder, the cross reranker (learner=both or over a tuned encoder), or a grid over
keys that change shapes (k, epochs, candidates). Every configuration x fold is a training run
of its own (`train --set folds=N --set fold=I`, in `runs/<configuration>/fold_<I>`) and is
measured by `eval` on the conversations its fold holds out, one after another. A run killed
midway resumes from its checkpoints; a finished run's held-out metrics (`heldout.json`) are
not computed again. A run's own summary holds no held-out scores: `eval`'s are its measure.
Every run reports the time it took and the time left, measured from the runs so far.
"""

from __future__ import annotations

import functools
import json
import shutil
import time
from pathlib import Path

import numpy as np

from rmmjax.config import Config, encoder_stage, with_values
from rmmjax.data.locomo import load_locomo
from rmmjax.encode.encoder import model_identity
from rmmjax.eval.retrieval import evaluate_retrieval
from rmmjax.io.trained import RECORD_FILE
from rmmjax.io.workdir import LOCK_FILE, atomic_write_json
from rmmjax.memory.topic_units import conversation_units
from rmmjax.replay.candidates import folds, unit_pools
from rmmjax.retrieve.units import build_units
from rmmjax.replay.inputs import base_encoder
from rmmjax.train.loop import train
from rmmjax.train.sweep_table import FoldResult
from rmmjax.train.sweeps import time_left

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
    report(time_left(f"run {n + 1}/{len(todo)} (configuration {i}, fold {f})", n + 1,
                     len(todo), time.perf_counter() - started))
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


def announce(configs: list[Config], tests: list[list[int]], todo: list[tuple[int, int]],
             report) -> None:
  """What the sweep will run (its time is measured as it goes: `run_all` reports it)."""
  done = len(configs) * len(tests) - len(todo)
  report(f"sweep: {len(configs)} configurations x {len(tests)} folds = "
         f"{len(configs) * len(tests)} runs, each a training of its own (its own compiles); "
         f"{len(todo)} to run ({done} done); the time left is reported after each run")


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
      if settings != _settings(_with_fold(c, num_folds, f)):
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
