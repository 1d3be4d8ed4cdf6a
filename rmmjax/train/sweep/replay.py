"""Sweeps over replayed conversations, cross-validated over contiguous folds (the split of
`train --set folds=N --set fold=I`): an embedding reranker's rates in one compiled program per
fold, its scores written to folds/fold_<i>.npz as the fold finishes; any other sweep run by run
(sweep.runs). What is recorded: docs/command-line.md, `sweep`."""

from __future__ import annotations

import contextlib
import json
import zipfile
from pathlib import Path

import jax
import numpy as np

from rmmjax import core, distributed
from rmmjax.config import Config, apply_precision, with_values
from rmmjax.data.locomo import load_locomo
from rmmjax.learners.query_encoder.files import query_encoder_record
from rmmjax.io.record import file_sha256, trained_on
from rmmjax.io.workdir import atomic_path, check_sweepable, held, read_run_record, sweep_record
from rmmjax.replay.candidates import conversation_fingerprint, folds
from rmmjax.replay.protocols import Protocol, fold_program, fold_world, per_question
from rmmjax.io.metrics_log import window_means
from rmmjax.train.loop import train
from rmmjax.learners.embedding.task import build_replays
from rmmjax.learners.registry import with_model
from rmmjax.train.sweep import runs
from rmmjax.train.sweep.chunks import chunk_size, each_timed, minutes, run_chunks, \
    time_first_chunk
from rmmjax.train.sweep.grid import (check_grid_read, label, run_settings, settings,
                                     shares_a_program, sweep_configs)
from rmmjax.train.sweep.table import replay_fold, start, summarise, write

FOLD_FILE = "folds/fold_{}.npz"
ONLINE_CURVES = ("reward", "citation_rate", "recall_at_m", "entropy")


def check_learner(cfg: Config) -> None:
  """What a replay sweep runs: every learner but IRIS's (whose runs hold out the last
  conversations, not folds), in one process."""
  if cfg.iris_models is not None or cfg.iris_evidence is not None:
    raise ValueError(f"sweep --config {cfg.config} holds out folds of the conversations; "
                     f"IRIS's runs (learner={cfg.learner}, units={cfg.units}) hold out the last "
                     "`holdout` ones: train them one by one")
  if cfg.folds or cfg.fold:
    raise ValueError(f"folds={cfg.folds}, fold={cfg.fold}: a sweep's folds are --folds N")
  if cfg.holdout != type(cfg).holdout:
    raise ValueError(f"holdout={cfg.holdout}: a sweep holds out each of its --folds in turn; "
                     "leave holdout unset")
  # (each process refuses it alike: nothing below runs on several)
  if jax.process_count() > 1:
    raise ValueError("a sweep over replayed conversations runs in one process (over all of its "
                     "devices); start it without --num-processes")


def check_not_trained(cfg: Config, conversations: list) -> None:
  """Refuses candidates from a tuned query encoder that trained on one of the conversations
  (every conversation is held out by one fold: its numbers would be in-sample)."""
  if not cfg.query_encoder:
    return
  record = query_encoder_record(cfg.query_encoder)
  leaked = [c.conversation_id for c in conversations
            if trained_on(record, c.conversation_id, conversation_fingerprint(c))]
  if leaked:
    raise ValueError(f"query_encoder={cfg.query_encoder} trained on {', '.join(leaked)}: every "
                     "conversation is held out by one fold, so those folds' numbers would be "
                     "in-sample; sweep over candidates of an encoder that did not train on them")


def replay_sweep(cfg: Config, grid: dict[str, list], seeds: int, num_folds: int,
                 workdir: Path, progress: bool = True, dry_run: bool = False,
                 report=print, best: bool = True, made_by: dict | None = None,
                 on=None) -> dict | None:
  """Runs the sweep; returns sweep.json's content (None for a dry run, which a vmapped sweep ends
  after timing its first chunk). `on`: a backend (ray_backend.RayBackend) running each task."""
  check_learner(cfg)
  if on is not None:  # (a task runs in another working folder, maybe on another node)
    cfg, workdir = cfg.resolved(), Path(workdir).resolve()
  configs = sweep_configs(cfg, grid, seeds)
  one_program = shares_a_program(cfg, grid)
  check_grid_read(grid, configs, online_held_out=one_program)
  workdir = Path(workdir)
  for name in ("folds", "runs", "best", "tb"):
    if (workdir / name).exists() and not (workdir / name).is_dir():
      raise ValueError(f"{workdir / name} is a file: a sweep writes a folder there; use "
                       "another workdir")
  with contextlib.ExitStack() as holding:
    if not dry_run:
      holding.enter_context(held(workdir, "sweep"))
    data_sha256 = file_sha256(Path(cfg.data))
    check_sweepable(workdir, cfg, grid, seeds, num_folds, data_sha256)
    # The invocation that started the sweep (kept in its manifest) and this one, which writes it.
    started = (read_run_record(workdir) or {}).get("started_by") or made_by
    made_by = {"started_by": started, "written_by": made_by} if made_by else None
    conversations = [c for c in load_locomo(Path(cfg.data))[0] if c.questions]
    if not 2 <= num_folds <= len(conversations):
      raise ValueError(f"--folds {num_folds}: expected 2 to the {len(conversations)} "
                       f"conversations with questions in {cfg.data}")
    check_not_trained(cfg, conversations)
    tests = folds(len(conversations), num_folds)
    heading = (f"sweep: {len(configs)} configurations x {num_folds} folds = "
               f"{len(configs) * num_folds} runs")
    if on is not None:
      on.prepare(workdir, Path(cfg.data), data_sha256)  # (each task checks it reads the same file)
    go = (_prepare(cfg, configs, tests, workdir, progress, report, heading, best, on) if one_program
          else runs.prepare(cfg, configs, conversations, tests, workdir, progress, report, heading,
                            on))
    if dry_run:
      return None
    start(workdir, cfg, sweep_record(grid, seeds, num_folds, data_sha256) | {
        "started_by": (made_by or {}).get("started_by")})
    fold_results, logged, encoder = go()
    result = summarise(cfg, grid, seeds, configs, fold_results, data_sha256, made_by)
    write(workdir, result, [(label(settings(configs[i], grid)), rows) for i, rows in logged],
          f"mean_of_{num_folds}_folds_x_{seeds}_seeds", f"sweep: {{}} configurations, "
          f"{num_folds} folds x {seeds} seeds, {cfg.steps} online steps")
    # The best configuration (its seed the sweep's first) trained on every conversation, for
    # eval, export and serving (a workdir of its own: killed, the same command resumes it).
    if best:
      every = with_values(cfg, result["best"]["settings"] | {"holdout": 0}).validate()
      if on is None:
        train(every, workdir / "best", progress=progress, encoder=encoder)
      else:
        on.run([("best", "best/", train, (every, workdir / "best", False))], report)
    return result


def _fold_program(cfg: Config, configs: list[Config]):
  """(the compiled program of a fold, every configuration's hparams, its devices)."""
  program = fold_program(with_model(cfg.core_spec()), Protocol(
      mode=cfg.mode, pretrain_epochs=cfg.learning.pretrain_epochs), cfg.steps, ONLINE_CURVES)
  hparams = (core.stack_hparams([c.hparams() for c in configs]),
             core.stack_hparams([c.hparams().replace(lr=c.learning.pretrain_lr,
                                                     tau=c.learning.pretrain_tau)
                                 for c in configs]))
  return program, hparams, list(distributed.data_mesh(cfg.devices).devices.flat)


def fold_task(cfg: Config, configs: list[Config], tests: list[list[int]], f: int,
              workdir: Path) -> None:
  """Fold f's program run and its file written, everything built again where the task runs."""
  apply_precision(cfg.precision)
  replays = build_replays(cfg)[4]
  program, hparams, devices = _fold_program(cfg, configs)
  out = run_chunks(program, hparams, fold_world(replays, tests[f], cfg.batch),
                   chunk_size(cfg.sweep_chunk, len(configs)), devices=devices)
  _save_fold(Path(workdir) / FOLD_FILE.format(f), out, [replays[i] for i in tests[f]], configs)


def _prepare(cfg: Config, configs: list[Config], tests: list[list[int]], workdir: Path,
             progress: bool, report, heading: str, best: bool, on=None):
  """Builds the replays, says what is left to run and (here, not on `on`) compiles and times
  its first chunk; returns the run of it, which gives every fold's results."""
  _, _, encoder, _, replays = build_replays(cfg, progress=progress)
  chunk = chunk_size(cfg.sweep_chunk, len(configs))
  program, hparams, devices = _fold_program(cfg, configs)
  held_out = [[replays[i] for i in test] for test in tests]
  todo = [f for f in range(len(tests)) if not _finished(workdir, f, configs, held_out[f])]
  chunks = -(-len(configs) // chunk)
  report(f"{heading}; {len(todo)} folds to run ({len(tests) - len(todo)} done), each one "
         f"compiled program over {chunks} chunk{'s' if chunks > 1 else ''} of {chunk} on "
         f"{len(devices)} device(s)" + (", then best/" if best else ""))
  first = None
  if todo and on is None:  # (measured, not predicted: the rest is reported as folds finish)
    first = time_first_chunk(program, hparams, fold_world(replays, tests[todo[0]], cfg.batch),
                             chunk, devices)
    report(f"fold {todo[0]}'s program compiled in {minutes(first['compile_s'])}; its first "
           f"chunk of {chunk} ran in {minutes(first['run_s'])}")

  def go():
    if on is not None:
      on.run([(f"fold_{f}", f"fold {f}", fold_task, (cfg, configs, tests, f, workdir))
              for f in todo], report)
    for f in each_timed([] if on is not None else todo, report, lambda n, f: f"fold {f}"):
      reused = first is not None and f == todo[0]  # (not compiled nor run twice)
      out = run_chunks(first["compiled"] if reused else program, hparams,
                       fold_world(replays, tests[f], cfg.batch), chunk, devices=devices,
                       first=first["out"] if reused else None, progress=progress,
                       desc=f"fold {f} chunks")
      _save_fold(workdir / FOLD_FILE.format(f), out, held_out[f], configs)
    files = [fold_file(workdir, f) for f in range(len(tests))]
    logged = [(i, window_means({k: data[f"online_{k}"][i] for k in ONLINE_CURVES}, 0,
                               cfg.log_every))
              for data in files if "online_reward" in data for i in range(len(configs))]
    return ([replay_fold(test, data, cfg.m) for test, data in zip(held_out, files)], logged,
            encoder)

  return go


def fold_file(workdir, f: int) -> dict:
  """A finished fold's arrays."""
  with np.load(Path(workdir) / FOLD_FILE.format(f)) as data:
    return {k: data[k] for k in data.files}


def _finished(workdir: Path, f: int, configs: list[Config], test) -> bool:
  """Whether fold f's file is written, checked to hold this sweep's configurations and the
  conversations its fold holds out."""
  path = workdir / FOLD_FILE.format(f)
  if not path.is_file():
    return False
  try:
    data = fold_file(workdir, f)
  except (OSError, EOFError, ValueError, zipfile.BadZipFile) as err:
    raise ValueError(f"{path} cannot be read as a fold's file ({err}); delete it to rerun that "
                     "fold") from None
  if "configurations" not in data or "conversations" not in data:
    raise ValueError(f"{path} is not a fold of a sweep (it does not name its configurations and "
                     "conversations); use a fresh workdir")
  if ([str(c) for c in data["configurations"]] != list(_labels(configs))
      or [str(c) for c in data["conversations"]] != [c.conversation_id for c in test]):
    raise ValueError(f"{path} holds other configurations (or in another order) or conversations "
                     f"than this sweep's fold {f}; use a fresh workdir")
  return True


def _labels(configs) -> np.ndarray:
  """Each configuration as a fold file records it (a resumed sweep checks them)."""
  return np.array([json.dumps(run_settings(c), sort_keys=True) for c in configs])


def _save_fold(path: Path, out: dict, test, configs) -> None:
  """Per configuration: held-out recall (frozen and prequential) and scores of every real
  question, and the training curves."""
  arrays = {"conversations": np.array([c.conversation_id for c in test]),
            "configurations": _labels(configs),
            **{k: np.stack([per_question(v, test) for v in out[k]])
               for k in ("recall", "prequential", "scores")},
            **{f"online_{k}": v for k, v in out.get("online", {}).items()},
            **{k: out[k] for k in ("pretrain_loss",) if k in out}}
  with atomic_path(path) as tmp, open(tmp, "wb") as file:  # a killed sweep leaves no half fold
    np.savez(file, **arrays)
