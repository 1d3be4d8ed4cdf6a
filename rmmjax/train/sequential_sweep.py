"""Sweeps over replayed conversations whose configurations cannot share one compiled program:
the query encoder, the cross reranker (learner=both or over a tuned encoder), or a grid over
keys that change shapes (k, epochs, candidates). Every configuration x fold is a training run
of its own (`train --set folds=N --set fold=I`, in `runs/<configuration>/fold_<I>`) and is
measured by `eval` on the conversations its fold holds out, one after another. A run killed
midway resumes from its checkpoints; a finished run's held-out metrics (`heldout.json`) are
not computed again.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from rmmjax.config import Config, with_values
from rmmjax.data.locomo import load_locomo
from rmmjax.eval.retrieval import evaluate_retrieval
from rmmjax.io.workdir import atomic_write_json
from rmmjax.replay.candidates import folds
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


def run_dir(workdir: Path, index: int, fold: int) -> Path:
  return Path(workdir) / "runs" / f"{index:03d}" / f"fold_{fold}"


def _evaluate(cfg: Config, model: Path, encoder) -> dict:
  """eval of a trained workdir on the conversations it did not train on, per question."""
  model_args = ({"query_encoder": model} if cfg.learner == "query_encoder" else
                {"reranker": model})
  return evaluate_retrieval(cfg.dataset, Path(cfg.data), cfg.units, cfg.retriever,
                            (cfg.m, 10), encoder=encoder, per_question=True, **model_args)


def run_all(cfg: Config, configs: list[Config], tests: list[list[int]], workdir: Path,
            progress: bool, report, encoder=None) -> list[FoldResult]:
  """Trains and measures every configuration x fold not finished yet; every fold's results."""
  todo = [(i, f) for f in range(len(tests)) for i in range(len(configs))
          if not (run_dir(workdir, i, f) / HELDOUT_FILE).is_file()]
  report(f"sweep: {len(configs)} configurations x {len(tests)} folds = "
         f"{len(configs) * len(tests)} runs, each a training of its own; {len(todo)} to run")
  started = time.perf_counter()
  for n, (i, f) in enumerate(todo):
    one = with_values(configs[i], {"folds": len(tests), "fold": f}).validate()
    where = run_dir(workdir, i, f)
    train(one, where, progress=progress, encoder=encoder)
    atomic_write_json(where / HELDOUT_FILE, _evaluate(one, where, encoder)["per_question"])
    spent = time.perf_counter() - started
    report(f"run {n + 1}/{len(todo)} done (configuration {i}, fold {f}); about "
           f"{spent / (n + 1) * (len(todo) - n - 1) / 60:.1f} min left")
  base = _evaluate_base(cfg, encoder)
  results = []
  for f in range(len(tests)):
    per_run = [json.loads((run_dir(workdir, i, f) / HELDOUT_FILE).read_text())
               for i in range(len(configs))]
    convs = [q["conversation"] for q in per_run[0]]
    names = [name.format(m=cfg.m) for name in METRICS]
    base_rows = [q for q in base if q["conversation"] in set(convs)]
    results.append(FoldResult(convs, [q["category"] for q in per_run[0]],
                              np.array([q[f"recall_all@{cfg.m}"] for q in base_rows]), None,
                              {name: np.array([[q[name] for q in rows] for rows in per_run])
                               for name in names}))
  return results


def _evaluate_base(cfg: Config, encoder) -> list[dict]:
  """The base retriever's metrics of every question (no model: nothing is left out)."""
  return evaluate_retrieval(cfg.dataset, Path(cfg.data), cfg.units, cfg.retriever,
                            (cfg.m, 10), encoder=encoder, per_question=True)["per_question"]
