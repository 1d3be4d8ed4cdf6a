"""A replay sweep whose configurations cannot share one compiled program: every configuration x
fold a `train --set folds=N --set fold=I` run of its own in `runs/<configuration>/fold_<I>`,
scored by `eval` on its held-out fold (docs/command-line.md, `sweep`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from rmmjax.config import Config, with_values
from rmmjax.encode.encoder import model_identity
from rmmjax.eval.retrieval import evaluate_retrieval
from rmmjax.io.manifest import RECORD_FILE
from rmmjax.io.workdir import LOCK_FILE, atomic_write_json, replace_dir
from rmmjax.memory.topic_units import conversation_units
from rmmjax.replay.candidates import unit_pools
from rmmjax.replay.inputs import base_encoder
from rmmjax.train.loop import check_run, train
from rmmjax.train.sweep.chunks import each_timed
from rmmjax.train.sweep.grid import run_settings
from rmmjax.train.sweep.table import FoldResult, metric_names

HELDOUT_FILE = "heldout.json"


def run_dir(workdir: Path, index: int, fold: int) -> Path:
  return Path(workdir) / "runs" / f"{index:03d}" / f"fold_{fold}"


def _with_fold(cfg: Config, num_folds: int, fold: int) -> Config:
  return with_values(cfg, {"folds": num_folds, "fold": fold}).validate()


def prepare(cfg: Config, configs: list[Config], conversations: list, tests: list[list[int]],
            workdir: Path, progress: bool, report, heading: str, on=None):
  """Checks every run before anything is written, says what is left to run; returns the run of
  it, which gives every fold's results. `on`: a backend running them, else here in turn."""
  # k against every conversation's units, built as each run builds them (topics from the
  # replay's base encoder, whose disk cache then serves the runs).
  encoder = base_encoder() if cfg.units == "topic" else None
  units = {c.conversation_id: conversation_units(c, cfg.units, encoder) for c in conversations}
  for k in sorted({c.k for c in configs}):
    unit_pools(conversations, cfg.units, k, unit_builder=lambda c, _: units[c.conversation_id])
  for i, c in enumerate(configs):
    for f in range(len(tests)):
      one = _with_fold(c, len(tests), f)
      # (the encoder, the fold's training questions, a step's memory, measured once per
      # shape; a run already started is checked when it resumes)
      if not (run_dir(workdir, i, f) / "config.json").exists():
        check_run(one.resolved(), None, run_dir(workdir, i, f))
  todo = _unfinished(configs, len(tests), workdir)
  report(f"{heading}, each a training of its own (its own compiles); {len(todo)} to run "
         f"({len(configs) * len(tests) - len(todo)} done); the time left is reported after each "
         "run")
  return lambda: (_run_all(cfg, configs, tests, workdir, progress, report, todo, on), [], None)


def _unfinished(configs: list[Config], num_folds: int, workdir: Path) -> list[tuple[int, int]]:
  """(configuration, fold) of every run without its held-out measurement, fold by fold; a
  finished run of other settings or encoder is refused (its row would mix two sweeps)."""
  ours = model_identity()
  todo = []
  for f in range(num_folds):
    for i, c in enumerate(configs):
      where = run_dir(workdir, i, f)
      path = where / HELDOUT_FILE
      if not path.is_file():
        todo.append((i, f))
        continue
      try:
        recorded = json.loads(path.read_text())["settings"]
        theirs = json.loads((where / RECORD_FILE).read_text())["encoder"]
      except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path} or the {RECORD_FILE} beside it cannot be read ({e}); delete "
                         f"{path} to measure that run again") from None
      if recorded != run_settings(_with_fold(c, num_folds, f)):
        raise ValueError(f"{path} holds a run of other settings than this sweep's configuration "
                         f"{i}; use a fresh workdir")
      if theirs != ours:
        raise ValueError(f"{where} was trained with the encoder {theirs}, and this sweep's is "
                         f"{ours} (RMMJAX_ENCODER): its row would mix two encoders; use that "
                         "encoder again or a fresh workdir")
  return todo


def _run_all(cfg: Config, configs: list[Config], tests: list[list[int]], workdir: Path,
             progress: bool, report, todo: list[tuple[int, int]], on=None) -> list[FoldResult]:
  """Trains and measures the runs `todo` (here, or each a task of `on`); every fold's
  results."""
  def job(i: int, f: int) -> tuple:
    return (_with_fold(configs[i], len(tests), f), run_dir(workdir, i, f),
            [run_dir(workdir, j, f) for j in range(len(configs)) if j != i])

  if on is None:
    named = lambda n, run: (f"run {n + 1}/{len(todo)} (configuration {run[0]}, "  # noqa: E731
                            f"fold {run[1]})")
    for i, f in each_timed(todo, report, named):
      run_one(*job(i, f), progress=progress)
  else:
    on.run([(f"run_{i:03d}_fold_{f}", f"configuration {i}, fold {f}", run_one, job(i, f))
            for i, f in todo], report)
  base = _evaluate(cfg, None)
  names = metric_names(cfg.m)
  results = []
  for f in range(len(tests)):
    per_run = [json.loads((run_dir(workdir, i, f) / HELDOUT_FILE).read_text())["per_question"]
               for i in range(len(configs))]
    held = [q for q in base if q["conversation"] in {q["conversation"] for q in per_run[0]}]
    shared = _shared(per_run, "ceiling")
    best = _shared(per_run, "best_order")
    results.append(FoldResult([q["conversation"] for q in per_run[0]],
                              [q["category"] for q in per_run[0]],
                              {name: np.array([q[name] for q in held]) for name in names},
                              None if shared is None else np.array(shared),
                              {name: np.array([[q[name] for q in rows] for rows in per_run])
                               for name in names},
                              best=None if best is None else {
                                  name: np.array([q[name] for q in best]) for name in names}))
  return results


def _shared(per_run: list[list[dict]], key: str) -> list | None:
  """Each question's `key` (its recall of all K candidates, or its best order's metrics),
  where every run of the fold reranked the same candidates (a grid over k or the query
  encoder's keys gives each run its own: None)."""
  values = [[q.get(key) for q in rows] for rows in per_run]
  return values[0] if all(v == values[0] for v in values) and None not in values[0] else None


def run_one(one: Config, where: Path, others: list[Path], progress: bool = False) -> None:
  """Trains run `one` into `where` (resuming it from its checkpoints) and writes its held-out
  measurement; `others`: the other configurations' runs of its fold (a stage they share)."""
  _share_stage(one, where, others)
  # Measured once, by eval below: the run's own held-out scores would be the same numbers.
  train(one, where, progress=progress, measure_heldout=False)
  atomic_write_json(where / HELDOUT_FILE, {"settings": run_settings(one),
                                           "per_question": _evaluate(one, where)})


def _evaluate(cfg: Config, model: Path | None) -> list[dict]:
  """eval's metrics of every question: of a trained workdir on the conversations it did not
  train on, or without one, of the base retriever on all."""
  models = {} if model is None else {
      "query_encoder" if cfg.learning is cfg.encoder_tuning else "reranker": model}
  return evaluate_retrieval(cfg.dataset, Path(cfg.data), cfg.units, cfg.retriever,
                            tuple(dict.fromkeys((cfg.m, 10))), per_question=True,
                            **models)["per_question"]


def _share_stage(cfg: Config, where: Path, others: list[Path]) -> None:
  """A run's query encoder stage, copied from another configuration's finished run of the same
  fold whose stage is the same run (a grid over the cross reranker's keys then trains one stage
  per fold); training is deterministic, so the copy is what it would have trained to."""
  stage = where / "query_encoder"
  if stage.exists() or cfg.first_stage is None:
    return
  ours = json.loads(cfg.first_stage.resolved().to_json())
  for other in others:
    source = other / "query_encoder"
    try:
      same = ((source / "summary.json").is_file()
              and json.loads((source / "config.json").read_text()) == ours)
    except (OSError, ValueError):  # (a stage being written, or unreadable: trained here)
      same = False
    if same:
      with replace_dir(stage) as partial:  # (a copy killed midway is made again)
        shutil.copytree(source, partial, ignore=shutil.ignore_patterns(LOCK_FILE),
                        dirs_exist_ok=True)
      return
