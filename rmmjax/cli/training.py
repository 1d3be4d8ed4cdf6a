"""`rmmjax train`, `sweep` and `export`: a config from flags, the training loop or the sweep,
and the files a trained model leaves."""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from pathlib import Path

from rmmjax import distributed
from rmmjax.cli.process import add_flags as add_process_flags
from rmmjax.config import (CONFIGS, Config, apply_overrides, apply_precision, get_config,
                           get_value, qualified, with_values)
from rmmjax.io.kinds import EXPORTS, KINDS, model_kind
from rmmjax.io.outputs import check_export_dir, check_output_dir
from rmmjax.io.record import code_commit
from rmmjax.io.checkpoint import saved_steps
from rmmjax.io.trained import export_manifest
from rmmjax.io.workdir import (in_recorded_order, read_config, refuse_if_training,
                               write_run_record)
from rmmjax.learners.registry import learner as learner_of, training_task
from rmmjax.train.loop import STAGE_DIR, train
from rmmjax.train.sweep.chunks import minutes
from rmmjax.train.sweep.grid import label, parse_grid, sweep_configs
from rmmjax.train.sweep.latent import sweep
from rmmjax.train.sweep.replay import replay_sweep

TRAIN_HELP = """Named configs: latent (the latent simulator; no data needed), locomo (replay of a
LoCoMo file: --set data=PATH) and locomo_cross (the query encoder, then the cross reranker over
K = 50). The learner key names what learns: query_encoder (locomo's default), a reranker family
(linear, mlp, cross), iris, or query_encoder,FAMILY (a reranker over the candidates of a query
encoder tuned first). Running the same command again resumes the workdir; docs/command-line.md
describes the keys and the outputs."""

SWEEP_HELP = """A grid of sweepable keys x seeds. On the latent simulator: one vmapped program.
On a replayed dataset (--config locomo): cross-validated over --folds contiguous folds of the
conversations, then the best configuration trained on every conversation into best/. A grid over
the rates of learner=linear or mlp runs each fold as one compiled program; anything else trains
one `train --set folds=N --set fold=I` run per configuration x fold, in runs/. A killed sweep run
again reruns only what it had not finished (docs/command-line.md)."""


def _config(args) -> Config:
  """The config --config and --set name, checked."""
  cfg = apply_overrides(get_config(args.config), args.set or []).validate()
  training_task(cfg)  # a learner the registry does not hold is refused here
  check_output_dir(args.workdir, "--workdir")
  apply_precision(cfg.precision)
  return cfg


def cmd_train(args) -> None:
  with distributed.preflight("configs"):  # a refusal on one process reaches them all
    cfg = _config(args)
  started = time.monotonic()
  summary = train(cfg, Path(args.workdir), progress=not args.quiet)
  took = time.monotonic() - started
  if not distributed.is_writer():
    print(f"process {args.process_id}: trained its share; process 0 wrote {args.workdir}")
    return
  rows = []
  if "recall_at_m_final" in summary:
    where = ("eval queries" if cfg.config == "latent" else
             f"validation: {', '.join(summary['validation_conversations'])}"
             if "validation_conversations" in summary else
             f"held-out: {', '.join(summary['heldout_conversations'])}")
    rows.append((f"recall@M of selected memories ({where})", summary["recall_at_m_base"],
                 summary["recall_at_m_final"]))
  # (units lace: "after" fuses the reranker's and IRIS's order, and "alone" is the reranker's)
  rows += [(name, summary["recall_at_m_base"], summary[key]) for key, name in (
      ("recall_at_m_prequential", "  learning online on the held-out conversations"),
      ("recall_at_m_alone", "  the reranker's order alone (not fused with IRIS's)"))
           if key in summary]
  if "reward_first" in summary:  # (a cross reranker's steps=0 run pretrains only)
    rows += [("reward (first/last tenth of training)", summary["reward_first"],
              summary["reward_last"]),
             ("citation rate (first/last tenth)", summary["citation_rate_first"],
              summary["citation_rate_last"])]
  else:
    print(f"\npretrained only (steps=0): {args.workdir} holds the reranker as its checkpoint of "
          "step 0; the same command with more steps continues from it")
  if "cross_pairs_truncated" in summary:
    print(f"(question, memory) pairs: {summary['cross_pairs']}, cut to "
          f"cross.max_length={cfg.cross.max_length}: {summary['cross_pairs_truncated']}; the "
          f"encoder computed in {summary['cross_compute_dtype']} (cross.compute_dtype="
          f"{cfg.cross.compute_dtype})")
  if "cross_observations" in summary:  # (a run that looks for them: say what it found)
    print(f"LoCoMo observations trained on beside the questions: "
          f"{summary['cross_observations']} (cross.observations={cfg.cross.observations}"
          + (")" if summary["cross_observations"] else "; the training conversations hold "
             "none, or the file gives a conversation id twice)"))
  if rows:
    print(f"\n{'':58s}{'before':>10s}{'after':>10s}")
  for name, before, after in rows:
    print(f"{name:58s}{before:10.3f}{after:10.3f}")
  if "iris_recall_at_10" in summary:  # learner=iris: held-out Recall@10 over turns
    where = "validation" if summary.get("iris_validation") else "held-out"
    for name, key in (("single pass, base encoder", "_single_pass_base"),
                      ("single pass, tuned anchor", "_single_pass_tuned"),
                      ("IRIS with the learned models", "")):
      print(f"{f'Recall@10 ({where}), {name}':58s}{summary['iris_recall_at_10' + key]:10.3f}")
    if "iris_warning" in summary:
      print(f"WARNING: {summary['iris_warning']}")
  elif "recall_at_k" in summary:
    print(f"{'ceiling: recall of all K candidates':58s}{summary['recall_at_k']:10.3f}")
  if cfg.config != "latent" and cfg.holdout == 0:
    print("no conversation was held out (holdout=0): evaluate on another file with\n  "
          + eval_hint(cfg, args.workdir))
  workdir = Path(args.workdir)
  print(f"\ntrained in {minutes(took)} (this command, held-out evaluation included; a resumed "
        f"run: the part it ran)\nsummary     {workdir / 'summary.json'}\n"
        f"curves      {workdir / 'curves.png'}\nmetrics     {workdir / 'metrics.jsonl'}\n"
        f"tensorboard {workdir / 'tb'}\ncheckpoints {workdir / 'checkpoints'}")


def eval_hint(cfg, workdir: str) -> str:
  """The `rmmjax eval` command that evaluates what a training run of `cfg` wrote to workdir (a
  two-stage run's reranker names its query encoder in its record, which eval loads)."""
  iris = f" --iris {cfg.iris_evidence.preset}" if cfg.iris_evidence is not None else ""
  return (f"rmmjax eval --data FILE --units {cfg.units}{iris} --retriever {cfg.retriever} "
          f"{learner_of(cfg.family).eval_flag} {workdir}")


def _sweep_config(args) -> tuple[Config, dict[str, list]]:
  """The base config and the grid of `rmmjax sweep` (checked as each grid point sets it)."""
  cfg = apply_overrides(get_config(args.config), args.set or [])
  if args.steps is not None:
    cfg = apply_overrides(cfg, [f"steps={args.steps}"])
  grid = parse_grid(args.grid or [], cfg)
  if args.steps is not None and any(qualified(cfg, k) == qualified(cfg, "steps") for k in grid):
    raise ValueError(f"--steps {args.steps} and --grid over the same steps: give one")
  if cfg.config == "latent" and (args.folds is not None or args.dry_run or args.no_best):
    raise ValueError("--folds, --dry-run and --no-best are for a sweep over replayed "
                     "conversations (--config locomo); the latent simulator has none")
  if cfg.config == "latent" and args.on:
    raise ValueError(f"--on {args.on} is for a sweep over replayed conversations (--config "
                     "locomo); the latent simulator's sweep is one compiled program")
  if not args.on and (args.address or args.run_resources):
    raise ValueError("--address and --run-resources say where --on ray runs; add --on ray")
  return cfg, grid


def sweep_runs(args) -> dict[str, Config]:
  """The config of every run `rmmjax sweep` with these flags trains, by name, resolved as the sweep
  resolves it but without reading its data or touching its workdir (what a results file records)."""
  cfg, grid = _sweep_config(args)
  runs = {}
  for c in sweep_configs(cfg, grid, args.seeds):
    name = ", ".join([f"{k}={get_value(c, k)}" for k in grid] + [f"seed {c.seed}"])
    if cfg.config == "latent":
      runs[name] = c
    else:
      folds = 4 if args.folds is None else args.folds
      runs |= {f"{name}, fold {f}": with_values(c, {"folds": folds, "fold": f})
               for f in range(folds)}
  return runs


def cmd_sweep(args) -> None:
  with distributed.preflight("configs"):  # a refusal on one process reaches them all
    cfg, grid = _sweep_config(args)
    check_output_dir(args.workdir, "--workdir")
    grid = in_recorded_order(Path(args.workdir), cfg, grid)
    apply_precision(cfg.precision)
  workdir = Path(args.workdir)
  made_by = {"command": shlex.join(["rmmjax", *args.argv]), "cwd": os.getcwd(),
             "commit": code_commit()}
  if cfg.config == "latent":
    result = sweep(cfg, grid, args.seeds, workdir, progress=not args.quiet, made_by=made_by)
  else:
    with contextlib.ExitStack() as stack:
      on = None
      if args.on == "ray":  # (imported only here: Ray is an optional extra)
        from rmmjax.train.sweep.ray_backend import RayBackend, parse_resources  # noqa: PLC0415
        on = stack.enter_context(RayBackend(args.address, parse_resources(args.run_resources),
                                            progress=not args.quiet))
      result = replay_sweep(cfg, grid, args.seeds, 4 if args.folds is None else args.folds,
                            workdir, progress=not args.quiet, dry_run=args.dry_run,
                            best=not args.no_best, made_by=made_by, on=on)
  if result is None:  # (a dry run)
    return
  if not distributed.is_writer():
    print(f"process {args.process_id}: swept its share; process 0 wrote {args.workdir}")
    return
  if cfg.config == "latent":
    metrics = ("recall_at_m_base", "recall_at_m_final", "reward_first", "reward_last")
    print(f"\n{'configuration':36s}{'seeds':>6s}{'recall base':>12s}{'recall final':>13s}"
          f"{'reward first':>13s}{'reward last':>12s}")
    groups: dict[str, list] = {}
    for run in result["runs"]:
      groups.setdefault(label({k: run[k] for k in grid}), []).append(run)
    for name, runs in groups.items():
      mean = [sum(r[key] for r in runs) / len(runs) for key in metrics]
      print(f"{name:36s}{len(runs):6d}{mean[0]:12.3f}{mean[1]:13.3f}{mean[2]:13.3f}"
            f"{mean[3]:12.3f}")
    print(f"\nsweep.json {workdir / 'sweep.json'}\ncurves     {workdir / 'curves.png'}\n"
          f"tensorboard {workdir / 'tb'}")
    return
  print("\n" + "\n".join(result["table"]))
  if args.no_best:
    print(f"\nbest: {result['best']['settings'] or 'default'} (not trained: --no-best)")
  else:
    print(f"\nbest: {result['best']['settings'] or 'default'}, trained on every conversation "
          f"in {workdir / 'best'}; evaluate another file with\n  "
          f"{eval_hint(cfg, workdir / 'best')}")
  outputs = {"sweep.json": "sweep.json", "table": "sweep.md", "curves": "curves.png",
             "tensorboard": "tb", "runs": "runs"}  # (a sweep of runs alone: runs/, no curves)
  print("\n" + "\n".join(f"{name:11s} {workdir / path}" for name, path in outputs.items()
                          if (workdir / path).exists()))


def cmd_export(args) -> None:
  refuse_if_training(("--workdir", args.workdir))
  kind = model_kind(Path(args.workdir))
  if kind in EXPORTS:
    what, use = KINDS[kind]
    raise ValueError(f"--workdir {args.workdir} is {what}: it is exported already (use it as "
                     f"{use.replace('DIR', str(args.workdir))}); export takes a training workdir")
  cfg = read_config(Path(args.workdir))
  workdir, out = Path(args.workdir), Path(args.out)
  done = saved_steps(workdir / "checkpoints")
  if done and done[-1] < cfg.steps:
    print(f"NOTE: {workdir} has trained {done[-1]} of its {cfg.steps} steps (interrupted): the "
          f"export holds step {done[-1]}; the train command run again finishes it")
  if (first := cfg.first_stage) is None:
    print(learner_of(cfg.family).export(workdir, out))
    return
  # A run of stages: its first stage's export, then its learner's beside it, then the manifest.
  check_export_dir(out, f"{workdir} holds a run of two stages (learner={cfg.learner}), which "
                   "exports as a directory")
  print(learner_of(first.family).export(workdir / STAGE_DIR, out / STAGE_DIR))
  family = learner_of(cfg.family)
  reranker = out / family.export_name
  print(family.export(workdir, reranker).split("\n")[0]
        + f" (evaluate with --reranker {reranker} --encoder {out / STAGE_DIR})")
  write_run_record(out, export_manifest(workdir))  # last: a folder without it is no export


def add_parsers(sub) -> None:
  def with_config(p):
    p.add_argument("--config", default="latent", choices=sorted(CONFIGS),
                   help="named config (default: latent)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config value (repeatable; the last wins): a shared key "
                        "(rmmjax/config/__init__.py), or a learner's as SECTION.KEY or by its "
                        "name alone (rmmjax/learners/NAME/config.py; the run's learner first)")
    p.add_argument("--workdir", required=True, help="where outputs and checkpoints go")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_process_flags(p)

  p = sub.add_parser("train", help="train a reranker, a query encoder or IRIS's models "
                                   "(resumes from the workdir)", description=TRAIN_HELP)
  with_config(p)
  p.set_defaults(func=cmd_train)

  p = sub.add_parser("sweep", help="run a grid x seeds, cross-validated over folds of the "
                                    "conversations with --config locomo",
                     description=SWEEP_HELP)
  with_config(p)
  p.add_argument("--grid", action="append", metavar="KEY=V1,V2,...",
                 help="a sweepable key and its values (repeatable)")
  p.add_argument("--seeds", type=int, default=1, help="seeds per grid point")
  p.add_argument("--folds", type=int, default=None,
                 help="--config locomo: folds of the conversations (default 4), each held out "
                      "in turn")
  p.add_argument("--dry-run", action="store_true",
                 help="--config locomo: check everything and print the runs (and, where a "
                      "fold is one compiled program, compile it and time its first chunk), "
                      "then stop; writes nothing")
  p.add_argument("--no-best", action="store_true",
                 help="--config locomo: do not train the best configuration on every "
                      "conversation into best/ afterwards")
  p.add_argument("--steps", type=int, default=None, help="steps per run (overrides config)")
  p.add_argument("--on", choices=("ray",), default=None,
                 help="--config locomo: run each run (and fold program) as a Ray task, on a "
                      "Ray cluster started here for the sweep, or the one at --address; same "
                      "records and table (docs/ray.md)")
  p.add_argument("--address", default=None,
                 help="--on ray: an existing Ray cluster's address (e.g. auto, or HOST:6379)")
  p.add_argument("--run-resources", default=None, metavar="cpu=N,gpu=N",
                 help="--on ray: what each task reserves (default: 1 GPU where the cluster "
                      "has GPUs, else 1 CPU)")
  p.set_defaults(func=cmd_sweep)

  p = sub.add_parser("export", help="write a trained reranker (safetensors), query encoder "
                                    "or IRIS's models (Hugging Face-format directories)")
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", required=True,
                 help="reranker: FILE.safetensors (FILE.json goes beside it); a cross "
                      "reranker, query encoder, IRIS's models or two stages: DIR")
  p.set_defaults(func=cmd_export)
