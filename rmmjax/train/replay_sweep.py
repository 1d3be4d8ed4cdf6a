"""Sweeps over replayed conversations: a grid of the embedding reranker's rates x seeds,
cross-validated by conversation.

Each fold holds out a contiguous block of the file's conversations (`replay.candidates.folds`,
the split `train --set folds=N --set fold=I` makes, so any row can be trained again alone);
every configuration of the grid trains on the other conversations exactly as `train` does
(pretraining, then `steps` online REINFORCE steps) and is scored on the held-out ones, all
configurations of a fold in one compiled program (vmapped, in chunks of `sweep_chunk`, the
chunk sharded over the devices). A fold's results are written as it finishes, so a sweep
killed and started again reruns only the folds it had not finished.

Outputs in the workdir: folds/fold_<i>.npz (per configuration, every held-out question's
scores), sweep.json (every configuration x fold x seed), sweep.md (the table, with intervals
over conversations; learning online against frozen along the held-out conversations, also in
online.png), curves.png and tb/ (online training curves per configuration, mean over
folds and seeds), and best/ (the best configuration trained on every conversation).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import zipfile
from pathlib import Path

import jax
import numpy as np

from rmmjax import core, distributed
from rmmjax.config import Config, with_values
from rmmjax.io import plots, tensorboard
from rmmjax.learners.query_encoder.files import query_encoder_record
from rmmjax.io.record import file_sha256, trained_on
from rmmjax.io.workdir import (atomic_write_json, atomic_write_text, check_sweepable, held,
                               read_run_record, sweep_record, write_run_record)
from rmmjax.replay.candidates import (conversation_fingerprint, folds, to_questions,
                                     to_sequence, to_streams)
from rmmjax.replay.protocols import Protocol, heldout_replay, split_fold, stream_ids, \
    train_reranker
from rmmjax.train import sequential_sweep, sweep_table
from rmmjax.train.loop import check_run, train
from rmmjax.train.sweep_table import FOLD_FILE, ONLINE_CURVES
from rmmjax.learners.embedding.task import build_replays
from rmmjax.train.sweeps import (REPLAY_SWEEPABLE, SWEEPABLE, check_grid_read, chunk_size,
                                 minutes, placement, run_chunks, sweep_configs, time_left)



def check_learner(cfg: Config) -> None:
  """What a replay sweep runs: every learner but IRIS's (whose runs hold out the last
  conversations, not folds)."""
  if cfg.learner == "iris" or cfg.units == "lace":
    raise ValueError(f"sweep --config {cfg.config} holds out folds of the conversations; "
                     f"IRIS's runs (learner={cfg.learner}, units={cfg.units}) hold out the last "
                     "`holdout` ones: train them one by one")
  if cfg.folds or cfg.fold:
    raise ValueError(f"folds={cfg.folds}, fold={cfg.fold}: a sweep's folds are --folds N")
  if cfg.holdout != type(cfg).holdout:
    raise ValueError(f"holdout={cfg.holdout}: a sweep holds out each of its --folds in turn; "
                     "leave holdout unset")
  if jax.process_count() > 1:
    raise ValueError("a sweep over replayed conversations runs in one process (over all of its "
                     "devices); start it without --num-processes")


def _program(spec: core.CoreSpec, protocol: Protocol, steps: int):
  """One fold's run of a chunk of configurations: train as `train` does, replay the held out."""

  def program(hparams, pretrain_hparams, world):
    train_qs, train_seq, test_streams, test_ids = world
    state, logs = train_reranker(spec, hparams, pretrain_hparams, train_qs, train_seq,
                                 protocol, steps)
    frozen = heldout_replay(state, test_streams, test_ids, False)
    adapting = heldout_replay(state, test_streams, test_ids, True)
    out = {"recall": frozen["recall_SxB"], "scores": frozen["scores_SxBxK"],
           "prequential": adapting["recall_SxB"]}
    if "online" in logs:
      out["online"] = {k: logs["online"][k] for k in ONLINE_CURVES}
    if "pretrain_loss" in logs:
      out["pretrain_loss"] = logs["pretrain_loss"]
    return out

  run = jax.jit(jax.vmap(lambda hp, world: program(hp[0], hp[1], world), in_axes=(0, None)))
  return run


@dataclasses.dataclass
class Plan:
  """What the sweep will run: configurations x folds, and the folds' conversations."""

  configs: list[Config]
  fold_tests: list[list[int]]  # held-out conversation indices of each fold
  chunk: int

  @property
  def runs(self) -> int:
    return len(self.configs) * len(self.fold_tests)

  @property
  def chunks_per_fold(self) -> int:
    return -(-len(self.configs) // self.chunk)


def replay_sweep(cfg: Config, grid: dict[str, list], seeds: int, num_folds: int,
                 workdir: Path, progress: bool = True, dry_run: bool = False,
                 report=print, best: bool = True, made_by: dict | None = None) -> dict:
  """Runs the sweep (with dry_run, says what it would run and, for a vmapped sweep, compiles and
  times its first chunk); returns sweep.json's content (None if dry).
  `best`: then train the best configuration on every conversation into best/; `made_by`: the
  command and commit sweep.json records."""
  with contextlib.ExitStack() as holding:
    with distributed.preflight("configs, grids or workdirs") as found:
      check_learner(cfg)
      configs = sweep_configs(cfg, grid, seeds)
      check_grid_read(grid, configs, online_held_out=vmappable(cfg, grid))
      workdir = Path(workdir)
      for name in ("folds", "runs", "best", "tb"):
        if (workdir / name).exists() and not (workdir / name).is_dir():
          raise ValueError(f"{workdir / name} is a file: a sweep writes a folder there; use "
                           "another workdir")
      if distributed.is_writer() and not dry_run:
        holding.enter_context(held(workdir, "sweep"))
      data_sha256 = file_sha256(Path(cfg.data))
      check_sweepable(workdir, cfg, grid, seeds, num_folds, data_sha256)
      # The invocation that started the sweep (kept in its manifest) and this one, which
      # writes it.
      started = (read_run_record(workdir) or {}).get("started_by") or made_by
      made_by = {"started_by": started, "written_by": made_by} if made_by else None
      found.digest = distributed.digest(cfg.to_json(), json.dumps(grid, sort_keys=True,
                                        default=str), str(seeds), str(num_folds),
                                        str(workdir.resolve()))
    if not vmappable(cfg, grid):
      return _sequential(cfg, grid, seeds, num_folds, configs, workdir, progress, dry_run,
                         report, data_sha256, best, made_by)
    with distributed.preflight("data files or folds") as found:
      data, _, encoder, tuned, replays = build_replays(cfg, progress=progress)
      if not 2 <= num_folds <= len(replays):
        raise ValueError(f"--folds {num_folds}: expected 2 to the {len(replays)} conversations "
                         f"with questions in {cfg.data}")
      fold_tests = folds(len(replays), num_folds)
      check_not_trained(cfg, [(c.conversation_id, c.fingerprint) for c in replays])
      found.digest = distributed.digest(str(data), str(num_folds))
    devices = list(distributed.data_mesh(cfg.devices).devices.flat)
    plan = Plan(configs, fold_tests, chunk_size(cfg.sweep_chunk, len(configs)))
    return _run(cfg, grid, seeds, plan, replays, workdir, devices, progress, dry_run, report,
                encoder, data_sha256, best, made_by)


def vmappable(cfg: Config, grid: dict) -> bool:
  """Whether every configuration runs in one program per fold: an embedding reranker's, with
  a grid over its rates (see SWEEPABLE, REPLAY_SWEEPABLE)."""
  return (cfg.learner == "reranker" and cfg.variant in ("linear", "mlp") and cfg.units != "lace"
          and all(k.rpartition(".")[2] in SWEEPABLE + REPLAY_SWEEPABLE for k in grid))


def check_not_trained(cfg: Config, conversations: list[tuple[str, str]]) -> None:
  """Refuses candidates from a tuned query encoder that trained on one of the conversations
  (every conversation is held out by one fold: its numbers would be in-sample)."""
  if not cfg.query_encoder:
    return
  record = query_encoder_record(cfg.query_encoder)
  leaked = [c for c, fingerprint in conversations if trained_on(record, c, fingerprint)]
  if leaked:
    raise ValueError(f"query_encoder={cfg.query_encoder} trained on {', '.join(leaked)}: every "
                     "conversation is held out by one fold, so those folds' numbers would be "
                     "in-sample; sweep over candidates of an encoder that did not train on them")


def _sequential(cfg, grid, seeds, num_folds, configs, workdir, progress, dry_run, report,
                data_sha256, best, made_by):
  with distributed.preflight("data files or folds"):
    conversations, tests = sequential_sweep.fold_tests(cfg, num_folds)
    check_not_trained(cfg, [(c.conversation_id, conversation_fingerprint(c))
                            for c in conversations])
    sequential_sweep.check_units(cfg, conversations, {c.k for c in configs})
    for i, c in enumerate(configs):  # every run's own checks, before anything is written
      for f in range(len(tests)):
        one = with_values(c, {"folds": len(tests), "fold": f}).validate()
        # (the encoder, the fold's training questions, a step's memory, measured once per
        # shape; a run already started is checked when it resumes)
        if not (sequential_sweep.run_dir(workdir, i, f) / "config.json").exists():
          check_run(one.resolved(), None, sequential_sweep.run_dir(workdir, i, f))
  todo = sequential_sweep.unfinished(configs, len(tests), workdir)  # (refuses a mixed sweep)
  sequential_sweep.announce(configs, tests, todo, report)
  if dry_run:
    return None
  if distributed.is_writer():
    workdir.mkdir(parents=True, exist_ok=True)
    write_run_record(workdir, sweep_record(grid, seeds, len(tests), data_sha256)
                     | {"started_by": (made_by or {}).get("started_by")})
    atomic_write_text(workdir / "config.json", cfg.resolved().to_json() + "\n")
  results = sequential_sweep.run_all(cfg, configs, conversations, tests, workdir, progress,
                                     report, todo)
  result = sweep_table.summarise(cfg, grid, seeds, configs, results, data_sha256, made_by)
  if distributed.is_writer():
    atomic_write_json(workdir / "sweep.json", result)
    atomic_write_text(workdir / "sweep.md", "\n".join(result["table"]) + "\n")
  if best:
    train(best_config(cfg, result), workdir / "best", progress=progress)
  return result


def _fold_inputs(cfg: Config, replays, test_idx):
  train, test = split_fold(replays, test_idx)
  world = (to_questions(train), to_sequence(train, cfg.batch), to_streams(test, cfg.batch),
           stream_ids(test))
  return train, test, world


def _stacked(configs: list[Config]):
  hp = core.stack_hparams([c.hparams() for c in configs])
  pre = core.stack_hparams([c.hparams().replace(lr=c.learning.pretrain_lr,
                                                tau=c.learning.pretrain_tau) for c in configs])
  return hp, pre


def _run(cfg, grid, seeds, plan, replays, workdir, devices, progress, dry_run, report,
         encoder, data_sha256, best, made_by) -> dict | None:
  protocol = Protocol(mode=cfg.mode, pretrain_epochs=cfg.learning.pretrain_epochs)
  program = _program(cfg.core_spec(), protocol, cfg.steps)
  hparams = _stacked(plan.configs)
  done = _finished_folds(workdir, plan, replays)
  todo = [f for f in range(len(plan.fold_tests)) if f not in done]
  report(f"sweep: {len(plan.configs)} configurations x {len(plan.fold_tests)} folds = "
         f"{plan.runs} runs; {len(todo)} folds to run ({len(done)} done), each one compiled "
         f"program over {plan.chunks_per_fold} chunk{'s' if plan.chunks_per_fold > 1 else ''} of "
         f"{plan.chunk} on {len(devices)} "
         f"device(s)" + (", then best/" if best else ""))
  first = None
  if todo:  # (measured, not predicted: the rest is reported as folds finish)
    first = _first_chunk(cfg, plan, replays, program, hparams, todo[0], devices)
    report(f"fold {todo[0]}'s program compiled in {minutes(first['compile_s'])}; its first "
           f"chunk of {plan.chunk} ran in {minutes(first['run_s'])}")
  if dry_run:
    return None
  if distributed.is_writer():
    workdir.mkdir(parents=True, exist_ok=True)
    write_run_record(workdir, sweep_record(grid, seeds, len(plan.fold_tests), data_sha256)
                     | {"started_by": (made_by or {}).get("started_by")})
    atomic_write_text(workdir / "config.json", cfg.resolved().to_json() + "\n")
  started = time.perf_counter()
  for n, f in enumerate(todo):
    _, test, world = _fold_inputs(cfg, replays, plan.fold_tests[f])
    run_chunk, out0 = program, None
    if first is not None and f == todo[0]:
      run_chunk, out0 = first["compiled"], first["out"]  # (not compiled nor run twice)
    out = run_chunks(run_chunk, hparams, world, plan.chunk, devices=devices, first=out0,
                     progress=progress and distributed.is_writer(), desc=f"fold {f} chunks")
    if distributed.is_writer():
      _save_fold(workdir / FOLD_FILE.format(f), out, test, plan.configs)
    report(time_left(f"fold {f}", n + 1, len(todo), time.perf_counter() - started))
  result = sweep_table.summarise(cfg, grid, seeds, plan.configs, [
      sweep_table.replay_fold([replays[i] for i in test_idx], sweep_table.fold_file(workdir, f),
                              cfg.m) for f, test_idx in enumerate(plan.fold_tests)],
      data_sha256, made_by)
  if distributed.is_writer():
    _write(workdir, cfg, grid, seeds, plan, result)
  # The best configuration trained on every conversation, for eval, export and serving (a
  # training workdir of its own: killed, the same sweep command resumes it).
  if best:
    train(best_config(cfg, result), workdir / "best", progress=progress, encoder=encoder)
  return result


def _finished_folds(workdir, plan, replays) -> set[int]:
  """Folds whose file is written, each checked to hold the conversations the plan holds out."""
  done = set()
  for f, test_idx in enumerate(plan.fold_tests):
    if not (workdir / FOLD_FILE.format(f)).is_file():
      continue
    try:
      data = sweep_table.fold_file(workdir, f)
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as err:
      raise ValueError(f"{workdir / FOLD_FILE.format(f)} cannot be read as a fold's file "
                       f"({err}); delete it to rerun that fold") from None
    if "configurations" not in data or "conversations" not in data:
      raise ValueError(f"{workdir / FOLD_FILE.format(f)} is not a fold of a sweep (it does not "
                       "name its configurations and conversations); use a fresh workdir")
    if [str(c) for c in data["configurations"]] != list(_labels(plan.configs)):
      raise ValueError(f"{workdir / FOLD_FILE.format(f)} holds other configurations than this "
                       "sweep's (or in another order); use a fresh workdir")
    held_out = [str(c) for c in data["conversations"]]
    expected = [replays[i].conversation_id for i in test_idx]
    if held_out != expected:
      raise ValueError(f"{workdir / FOLD_FILE.format(f)} holds out {', '.join(held_out)}, not "
                       f"{', '.join(expected)} as this sweep's fold {f} does; use a fresh workdir")
    done.add(f)
  return done


def _first_chunk(cfg, plan, replays, program, hparams, fold, devices) -> dict:
  """The first chunk of `fold` compiled and run, timed, placed as run_chunks places it: its
  compiled program and output are the fold's own (nothing is computed twice)."""
  _, _, world = _fold_inputs(cfg, replays, plan.fold_tests[fold])
  mesh, chunk, world = placement(devices, plan.chunk, len(plan.configs), world)
  index = np.minimum(np.arange(chunk), len(plan.configs) - 1)
  first = jax.tree.map(lambda x: np.asarray(x)[index], hparams)
  if mesh is not None:
    first = distributed.shard_leading(first, mesh)
  start = time.perf_counter()
  compiled = program.lower(first, world).compile()
  compile_s = time.perf_counter() - start
  start = time.perf_counter()
  out = jax.block_until_ready(compiled(first, world))
  return {"compile_s": compile_s, "run_s": time.perf_counter() - start, "compiled": compiled,
          "out": out, "fold": fold, "chunks": -(-len(plan.configs) // chunk)}


def _labels(configs) -> np.ndarray:
  """Each configuration as a fold file records it (a resumed sweep checks them)."""
  return np.array([json.dumps({k: v for k, v in c.values().items() if k != "data"},
                              sort_keys=True, default=str) for c in configs])


def _save_fold(path: Path, out: dict, test, configs) -> None:
  """Per configuration: held-out recall (frozen and prequential) and scores of every real
  question, and the training curves."""
  arrays = {"conversations": np.array([c.conversation_id for c in test]),
            "configurations": _labels(configs),
            "recall": _per_question(out["recall"], test),
            "prequential": _per_question(out["prequential"], test),
            "scores": _per_question(out["scores"], test)}
  for name, values in out.get("online", {}).items():
    arrays[f"online_{name}"] = values
  if "pretrain_loss" in out:
    arrays["pretrain_loss"] = out["pretrain_loss"]
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp.npz")
  np.savez(tmp, **arrays)
  tmp.replace(path)  # whole or absent: a killed sweep never leaves half a fold


def _per_question(values_CxNxSxB, test) -> np.ndarray:
  """(configs, conversations, S, B, ...) -> (configs, questions, ...), held-out order."""
  values = np.asarray(values_CxNxSxB)
  tail = values.shape[4:]
  return np.stack([np.concatenate([v.reshape((-1,) + tail)[:len(c.questions)]
                                   for v, c in zip(per_config, test)]) for per_config in values])


def _write(workdir, cfg, grid, seeds, plan, result) -> None:
  atomic_write_json(workdir / "sweep.json", result)
  atomic_write_text(workdir / "sweep.md", "\n".join(result["table"]) + "\n")
  rows = [r for r in result["rows"] if "online_vs_frozen_by_part" in r]
  if rows:
    plots.plot_parts(workdir / "online.png", {r["label"]: r["online_vs_frozen_by_part"]
                                              for r in rows},
                     ylabel=f"Recall@{cfg.m}: learning online - frozen",
                     title="learning from citations alone on held-out conversations")
  curves, steps_T = sweep_table.curves(workdir, plan, list(grid), cfg.log_every)
  if curves:
    tensorboard.rewrite(workdir / "tb", {label.replace("/", "_"): [
        {"step": int(s), **{m: float(v[:, t].mean()) for m, v in by_metric.items()}}
        for t, s in enumerate(steps_T)] for label, by_metric in curves.items()},
        prefix=f"mean_of_{len(plan.fold_tests)}_folds_x_{seeds}_seeds")
    plots.plot_curves(workdir / "curves.png", steps_T, curves,
                      title=f"sweep: {len(curves)} configurations, {len(plan.fold_tests)} folds "
                            f"x {seeds} seeds, {cfg.steps} online steps")


def best_config(cfg: Config, result: dict) -> Config:
  """The sweep's best configuration (its seed the sweep's first), trained on every
  conversation."""
  return with_values(cfg, result["best"]["settings"] | {"holdout": 0}).validate()

