"""The training loop: segments of steps ending on multiples of `checkpoint_every`, each logged
and checkpointed; the task (rmmjax.learners.task) says what the steps learn from. Resuming is
described in docs/command-line.md, **train**."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from rmmjax.config import Config, apply_precision
from rmmjax.io import metrics_log, plots, tensorboard
from rmmjax.io.checkpoint import Checkpointer, saved_steps
from rmmjax.io.manifest import RECORD_FILE
from rmmjax.io.workdir import (atomic_write_json, atomic_write_text, check_resumable, held,
                               write_run_record)
from rmmjax import distributed
from rmmjax.learners.registry import training_task

STAGE_DIR = "query_encoder"  # the first stage's workdir, inside the run's
FIRST_LAST_FRACTION = 0.1  # reward_first/last average the first/last tenth of the steps


def first_last(rows: list[dict], metric: str) -> tuple[float, float]:
  """Means of a metric over the first and last tenth of the logged rows."""
  n = max(1, math.ceil(len(rows) * FIRST_LAST_FRACTION))
  values = np.array([r[metric] for r in rows])
  return float(values[:n].mean()), float(values[-n:].mean())


def _check_record(workdir: Path, record: dict | None) -> None:
  """Refuses to resume a run whose data changed since it started (other file contents, other
  conversations, units, retriever or encoder); the same file moved or copied is the same."""
  path = workdir / RECORD_FILE
  if record is None or not path.exists():
    return
  old = json.loads(path.read_text())
  moved = old.get("data_sha256") == record.get("data_sha256")
  diff = [k for k in sorted(set(old) | set(record))
          if old.get(k) != record.get(k) and not (moved and k == "data")]
  if diff:
    raise ValueError(f"{workdir} was trained on other data than {record.get('data')} holds now "
                     f"({', '.join(diff)} differ); restore that file or use a fresh workdir")


def check_run(cfg: Config, encoder, workdir: Path) -> None:
  """The task's own checks of a run (and of a two-stage run's query encoder stage), which
  its config cannot make alone; before anything is written."""
  if (first := cfg.first_stage) is not None:
    training_task(first).check_run(first, encoder, Path(workdir) / STAGE_DIR)
  training_task(cfg).check_run(cfg, encoder, workdir)


def train(cfg: Config, workdir: Path, progress: bool = True, encoder=None,
          measure_heldout: bool = True) -> dict:
  """Trains (or resumes) the config's run into workdir, held until it returns; the summary.
  measure_heldout=False leaves the held-out conversations to a caller that scores them itself
  (a sweep of runs, by `eval`): for the cross reranker that is minutes."""
  locks = {}  # workdir -> this process's lock on it (the writer's only)
  with contextlib.ExitStack() as holding:
    # Every check of every stage runs before anything is written, on every process, and a
    # refusal on one reaches all of them (rather than leaving the others in a collective).
    with distributed.preflight("configs"):
      cfg = cfg.validate().resolved()  # paths absolute: a resume elsewhere reads the same file
      apply_precision(cfg.precision)
      workdir = Path(workdir)
      if distributed.is_writer():  # one process at a time: the second is refused, naming it
        locks[workdir] = holding.enter_context(held(workdir, "train"))
      check_resumable(workdir, cfg)
      stage, first = workdir.resolve() / STAGE_DIR, cfg.first_stage
      if first is not None:
        if distributed.is_writer():  # the stage is a workdir of its own: held with this one
          locks[stage] = holding.enter_context(held(stage, "train"))
        check_resumable(stage, first, stage=True)
      # The tasks' own checks, before a two-stage run tunes its encoder.
      check_run(cfg, encoder, workdir)
    try:
      if first is not None:
        # First stage: the query encoder, a run of its own in a sub-workdir (resumed like any
        # run); then the reranker trains on the candidates the tuned encoder retrieves.
        _train(first, stage, progress, encoder, measure_heldout=measure_heldout,
               lock=locks.get(stage))
      task_cfg = cfg if first is None else dataclasses.replace(cfg, query_encoder=str(stage))
      return _train(cfg, workdir, progress, encoder, task_cfg, measure_heldout,
                    locks.get(workdir))
    except OSError:
      for lock in locks.values():  # a workdir removed mid-write: said so, not as the errno met
        lock.check()
      raise


def _train(cfg: Config, workdir: Path, progress: bool, encoder, task_cfg: Config | None = None,
           measure_heldout: bool = True, lock=None) -> dict:
  """One stage: the task of `task_cfg` (default cfg) trained into workdir, which cfg records.
  `lock` is checked before each write: a folder removed under the run stops it rather than
  letting it write into the one another process made there."""
  check = lock.check if lock is not None else (lambda: None)
  task_cfg = task_cfg or cfg
  log_path = workdir / "metrics.jsonl"
  config_json = cfg.to_json()
  run_record = {"kind": "train", "learner": cfg.learner, "stages": list(cfg.section_names())}
  with distributed.preflight("configs, data or workdirs") as found:
    saved = saved_steps(workdir / "checkpoints")
    found.step = saved[-1] if saved else 0
    if found.step > cfg.steps:  # (more steps extend it: steps is a multiple of log_every)
      raise ValueError(f"{workdir} has already trained {found.step} steps and steps={cfg.steps} "
                       f"asks for fewer; a run cannot be shortened: use a fresh workdir, or "
                       f"steps >= {found.step} to resume or extend it")
    logged = metrics_log.read_rows(log_path)  # a damaged log is refused here
    task = training_task(task_cfg)(task_cfg, encoder, progress, workdir)  # data embedded here
    _check_record(workdir, task.record)
    # Over several processes every one computes; process 0 writes the files (checkpoints go
    # through Orbax, which every process takes part in). They must agree on the run and on
    # where it resumes, before any of them restores (a collective).
    record_json = json.dumps(task.record, sort_keys=True, default=str)
    found.digest = distributed.digest(config_json, record_json, str(workdir.resolve()))
  with contextlib.closing(Checkpointer(workdir / "checkpoints", read_only=True)) as reader:
    step, state, unreadable = reader.restore_latest(task.template)
  rows = metrics_log.kept_rows(log_path, logged, step, cfg.log_every)
  writes = distributed.is_writer()
  progress = progress and writes

  # Nothing was written up to here; what follows makes the workdir this run's.
  if state is not None and progress:
    print(f"resuming {workdir} from step {step} of {cfg.steps}", file=sys.stderr)
  if writes:
    check()
    write_run_record(workdir, run_record)
    atomic_write_text(workdir / "config.json", config_json + "\n")
    atomic_write_json(workdir / RECORD_FILE, task.record)  # what it trains on, for eval
  eval_first = task.evaluate_first() if measure_heldout else {}
  pretrained = state is None
  if pretrained:
    state = task.initial_state()  # pretraining, for the replay tasks that have it
    if writes and task.pretrain_loss is not None:
      atomic_write_json(workdir / "pretrain.json", {"loss": task.pretrain_loss.tolist()}
                        | task.pretrain_notes)
  if writes:
    metrics_log.rewind(log_path, step, rows)
    # TensorBoard is rebuilt from the kept rows, so it never holds a point twice or misses one.
    tensorboard.rewrite(workdir / "tb", {"": rows}, "train", config_json)
  with contextlib.ExitStack() as closing:  # (the writer closed first, then the checkpointer)
    checkpointer = closing.enter_context(contextlib.closing(Checkpointer(workdir / "checkpoints")))
    for bad in unreadable:
      checkpointer.delete(bad)  # redone below; a save of the same step would be refused
    if pretrained and (task.checkpoint_pretrained or cfg.steps == 0):
      # a resume starts from here rather than pretraining again; with steps=0 it is the model
      checkpointer.save(0, state)
    if writes:
      writer = closing.enter_context(contextlib.closing(tensorboard.appender(workdir / "tb")))
    with tqdm(total=cfg.steps, initial=step, desc="train", unit="step",
              disable=not progress or cfg.steps == 0) as bar:  # steps=0: pretraining alone
      while step < cfg.steps:
        # Segments end on multiples of checkpoint_every, as in an uninterrupted run, so a run
        # extended from any step saves the same checkpoints.
        n = min(cfg.checkpoint_every - step % cfg.checkpoint_every, cfg.steps - step)
        # A task whose steps run from the host moves the bar at each one.
        state, metrics_T = task.advance(state, n, **(
            {"on_step": bar.update} if task.steps_from_host else {}))
        metrics_T = distributed.gather(metrics_T)
        metrics_log.check_finite(metrics_T, step)
        new_rows = metrics_log.window_means(metrics_T, step, cfg.log_every)
        if writes:  # rows first: a checkpoint implies its rows
          check()
          metrics_log.append_rows(log_path, new_rows)
          writer.write_rows(new_rows)
        rows += new_rows
        step += n
        checkpointer.save(step, state)
        if not task.steps_from_host:
          bar.update(n)
        bar.set_postfix(reward=f"{new_rows[-1]['reward']:.3f}",
                        recall=f"{new_rows[-1]['recall_at_m']:.3f}")

  task.finish(state)
  eval_final = task.evaluate(state) if measure_heldout else {}
  summary = {"config": cfg.config, "steps": cfg.steps, "eval_queries": task.eval_queries,
             "k": cfg.k, "m": cfg.m}
  if eval_final:  # a replay run with holdout=0 has nothing held out to evaluate
    summary |= {"recall_at_m_base": eval_first["recall_at_m_base"],
                "recall_at_m_first": eval_first["recall_at_m"],
                "recall_at_m_final": eval_final["recall_at_m"],
                "recall_at_k": eval_final["recall_at_k"]}
  if cfg.config != "latent":
    summary["trained_conversations"] = [c.conversation_id for c in task.train_convs]
    # learner=iris with holdout=0 evaluates on a validation split: held out of the fit only.
    evaluated = [c.conversation_id for c in task.test_convs]
    validating = bool(eval_final.get("iris_validation"))
    summary["heldout_conversations"] = [] if validating else evaluated
    if validating:
      summary["validation_conversations"] = evaluated
    for key in eval_final:  # what only some tasks report
      if key in ("recall_at_m_prequential", "recall_at_m_alone") or key.startswith("iris_"):
        summary[key] = eval_final[key]
  summary |= task.input_notes
  pretrain_path = workdir / "pretrain.json"
  notes = json.loads(pretrain_path.read_text()) if pretrain_path.exists() else {}
  loss = [{"pretrain_loss": x} for x in notes.pop("loss", [])]
  summary |= notes
  for metric, kept in (("pretrain_loss", loss), ("reward", rows), ("citation_rate", rows)):
    if kept:  # (no loss from a fit of 0 epochs, no rows with steps=0)
      summary[f"{metric}_first"], summary[f"{metric}_last"] = first_last(kept, metric)
  if not writes:
    return summary
  check()
  atomic_write_json(workdir / "summary.json", summary)
  steps_T = np.array([r["step"] for r in rows])
  curves = {cfg.config: {m: np.array([[r[m] for r in rows]]) for m in plots.CURVE_METRICS}}
  plots.plot_curves(workdir / "curves.png", steps_T, curves,
                    title=f"{cfg.config}: tau={cfg.learning.tau} b={cfg.baseline} "
                          f"({cfg.baseline_kind}) lr={cfg.learning.lr} seed={cfg.seed}")
  return summary
