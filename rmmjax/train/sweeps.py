"""Hyperparameter sweeps: a grid of configurations x seeds, run as one compiled vmapped program.

Configurations go through `core.make_sweep` (jit(vmap(run))) in chunks of `sweep_chunk`; the
last chunk is padded with copies so every chunk has one shape and nothing recompiles. With several
devices, of one process or of several (`rmmjax.distributed`), the sweep axis of each chunk
is sharded across all of them (results equal the one-device run); process 0 writes the outputs.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh
from tqdm import tqdm

from rmmjax import core
from rmmjax.config import SWEEPABLE, Config, get_value, parse_value, qualified, with_values
from rmmjax.io import plots, tensorboard
from rmmjax.io.workdir import (atomic_write_json, atomic_write_text, check_sweepable, held,
                               sweep_record, write_run_record)
from rmmjax import distributed
from rmmjax.train.loop import first_last, window_means


# A replay sweep's configurations also vary their pretraining's rates in the one program.
REPLAY_SWEEPABLE = ("pretrain_lr", "pretrain_tau")
# Keys a replay sweep holds fixed: what learns, on which data, how it is held out and measured.
# (and the latent simulator's keys, which a replay does not read, and the encoder's width).
FIXED_IN_A_SWEEP = ("config", "data", "dataset", "learner", "variant", "units", "retriever",
                    "holdout", "folds", "fold", "query_encoder", "m", "devices", "precision",
                    "checkpoint_every", "log_every", "sweep_chunk", "dim", "encoder",
                    "num_users", "bank_size", "min_bank", "max_relevant", "signal",
                    "distortion", "noise", "world_seed", "eval_sessions")


# Keys that only pretraining reads, and keys that only online steps read (those of the held-out
# conversations too, where a sweep measures learning online on them).
PRETRAINING_KEYS = ("pretrain_lr", "pretrain_tau", "pretrain_epochs", "pretrain_batch",
                    "pretrain_candidates", "negatives_from_rank", "pretrain_loss")
ONLINE_KEYS = ("tau", "lr", "baseline", "baseline_kind", "p_rel", "p_irr", "credit",
               "log_prob", "sampling", "running_decay")


def check_grid_read(grid: dict, configs: list[Config], online_held_out: bool) -> None:
  """Refuses a grid key that no configuration of a replay sweep reads: its rows would be the
  same run, hours of it for the cross reranker."""
  for key in grid:
    section, _, name = qualified(configs[0], key).rpartition(".")
    reasons = [_unread(c, section, name, online_held_out) for c in configs]
    if all(reasons):
      raise ValueError(f"--grid {key}: no run of this sweep reads it ({reasons[0]}), so every "
                       "row would be the same run")


def _unread(cfg: Config, section: str, name: str, online_held_out: bool) -> str:
  """Why cfg's runs do not read the key (empty when they do)."""
  learnings = [getattr(cfg, n) for n in ([section] if section else cfg.section_names())]
  where = f"{section}." if section else ""
  if name in PRETRAINING_KEYS:
    if "pretrain" not in cfg.mode:
      return f"mode={cfg.mode} does not pretrain"
    # (pretrain_epochs=0 itself is read: it turns the pretraining off)
    if name != "pretrain_epochs" and all(getattr(one, "pretrain_epochs", 1) == 0
                                         for one in learnings):
      return f"{where}pretrain_epochs=0"
  if name in ONLINE_KEYS and not online_held_out and all(
      getattr(one, "steps", 1) == 0 for one in learnings):
    return f"{where}steps=0: no online step"
  if name == "hidden" and cfg.variant != "mlp":
    return f"variant={cfg.variant} has no hidden layer"
  return ""


def parse_grid(items: list[str], cfg: Config) -> dict[str, list]:
  """["tau=0.1,0.5", "baseline=0,0.5"] -> {"tau": [0.1, 0.5], "baseline": [0.0, 0.5]}."""
  grid = {}
  for item in items:
    if "=" not in item:
      raise ValueError(f"--grid {item!r}: expected key=v1,v2,...")
    key, text = (s.strip() for s in item.split("=", 1))
    if any(not v.strip() for v in text.split(",")):
      raise ValueError(f"--grid {item!r}: an empty value; expected key=v1,v2,...")
    values = [parse_value(key, v.strip(), cfg) for v in text.split(",")]
    if key == "seed":
      raise ValueError("--grid seed=...: use --seeds N for seeds")
    name = key.rpartition(".")[2]
    if cfg.config != "latent":  # configurations of other shapes run in sequence
      if name in FIXED_IN_A_SWEEP:
        raise ValueError(f"--grid {key}: {name} is the same for every run of a sweep (what "
                         "is swept, on which data, and how it is held out)")
    elif name not in SWEEPABLE:
      sweepable = [k for k in SWEEPABLE if k != "seed"]
      raise ValueError(f"--grid {key}: {key} changes the compiled program and cannot be swept in "
                       f"one run; sweepable keys: {', '.join(sweepable)}")
    same = [k for k in grid if qualified(cfg, k) == qualified(cfg, key)]
    if same:
      raise ValueError(f"--grid {key} is given twice: give each key once, with all its values "
                       f"(--grid {key}=V1,V2,...)" if same[0] == key else
                       f"--grid {key} and --grid {same[0]} name the same key "
                       f"({qualified(cfg, key)}): give it once, with all its values")
    repeated = [v for i, v in enumerate(values) if v in values[:i]]
    if repeated:
      raise ValueError(f"--grid {item!r}: {key}={repeated[0]!r} is given more than once; each "
                       "value is one configuration (use --seeds N to repeat runs)")
    grid[key] = values
  return grid


def sweep_configs(cfg: Config, grid: dict[str, list], seeds: int) -> list[Config]:
  """Every grid point x seeds 0..seeds-1 (offset by cfg.seed), each validated."""
  if not 1 <= seeds <= 1000:
    raise ValueError(f"--seeds {seeds}: expected 1 to 1,000")
  keys = list(grid)
  configs = []
  for values in itertools.product(*(grid[k] for k in keys)):
    for s in range(seeds):
      point = with_values(cfg, dict(zip(keys, values)) | {"seed": cfg.seed + s})
      try:
        configs.append(point.validate())
      except ValueError as error:
        if not _names_a_grid_key(cfg, keys, error):
          raise
        # The base values are checked only as each point sets them: a grid may lift a base
        # value's refusal (a grid over k with the base's pretraining candidates above some k).
        raise ValueError(f"--grid point {_label(point, keys)}: {error}") from None
  return configs


def _names_a_grid_key(cfg: Config, keys: list[str], error: ValueError) -> bool:
  """Whether the refusal names one of the grid's keys as KEY=, however spelled (then it is the
  grid point's, and is said with it; else the base's, said without)."""
  ours = {qualified(cfg, key) for key in keys}
  for name in re.findall(r"(?<![\w.])([a-z_]+(?:\.[a-z_]+)?)=", str(error)):
    try:
      if qualified(cfg, name) in ours:
        return True
    except ValueError:  # (a word before "=" that is no key of this config)
      continue
  return False


# On a CPU a vmapped step streams the Adam state of every configuration in the chunk; two
# configurations keep it in cache and measured fastest (`rmmjax bench core`). An accelerator
# wants the widest program it can get.
CPU_CHUNK = 2


def chunk_size(setting: int, num_configs: int) -> int:
  """The configured chunk size, or the automatic choice for this platform when it is 0."""
  if setting:
    return setting
  return CPU_CHUNK if jax.default_backend() == "cpu" else num_configs


def placement(devices: list, chunk_size: int, num_configs: int, world):
  """(the mesh or None, the chunk's size, the world replicated) of C configurations run in
  chunks over `devices`: every device gets the same share of a chunk."""
  chunk = min(chunk_size, num_configs)
  if len(devices) == 1:
    return None, chunk, world
  mesh = Mesh(np.array(devices), (distributed.DATA_AXIS,))
  return mesh, -(-chunk // len(devices)) * len(devices), distributed.replicate(world, mesh)


def run_chunks(run_chunk, hparams_C, world, chunk_size: int, devices: list | None = None,
               progress: bool = False, desc: str = "sweep chunks", first=None) -> dict:
  """Runs C configurations (hparams_C: arrays with a leading axis C) through a jit(vmap(run))
  in equal chunks, `world` the same for all; numpy results (C, ...). `first`: the first
  chunk's output, already computed."""
  devices = jax.devices() if devices is None else devices
  c = int(jax.tree.leaves(hparams_C)[0].shape[0])
  mesh, chunk, world = placement(devices, chunk_size, c, world)
  padded = -(-c // chunk) * chunk
  index = np.minimum(np.arange(padded), c - 1)

  def dispatch(start: int):
    hp = jax.tree.map(lambda x, i=index[start:start + chunk]: np.asarray(x)[i], hparams_C)
    if mesh is not None:  # each process places the configurations its devices run
      hp = distributed.shard_leading(hp, mesh)
    return run_chunk(hp, world)

  starts = list(range(0, padded, chunk))
  host = []
  with tqdm(total=len(starts), desc=desc, unit="chunk", disable=not progress) as bar:
    pending = dispatch(starts[0]) if first is None else first
    for i in range(len(starts)):
      # The next chunk is dispatched before this one is fetched: the device always has work
      # queued, and the bar moves as each chunk finishes (also where dispatch runs the chunk).
      following = dispatch(starts[i + 1]) if i + 1 < len(starts) else None
      host.append(distributed.gather(pending))
      bar.update(1)
      pending = following
  return jax.tree.map(lambda *xs: np.concatenate(xs)[:c], *host)


def minutes(seconds: float) -> str:
  return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def time_left(what: str, done: int, total: int, spent_s: float) -> str:
  """A line after the `done`-th of `total` parts of a sweep: the time spent, and the time left
  at the mean of the parts measured so far."""
  return (f"{what} done after {minutes(spent_s)}; about "
          f"{minutes(spent_s / done * (total - done))} left")


def _label(cfg: Config, keys: list[str]) -> str:
  return ",".join(f"{k}={get_value(cfg, k)}" for k in keys) or "default"


# True while a latent sweep computes what it writes only at its end: a stop then loses
# nothing by leaving without waiting for the compiled chunk in flight (minutes, for long
# chunks). Read by the command line when Ctrl-C or SIGTERM stops it.
nothing_kept_in_flight = False


@contextlib.contextmanager
def _nothing_kept(alone: bool):
  """Marks the block as computing nothing that a stop would keep; not with several processes,
  each of which must leave the distributed runtime in step."""
  global nothing_kept_in_flight
  nothing_kept_in_flight = alone
  try:
    yield
  except KeyboardInterrupt:
    raise  # (the mark stays up for the stop it lets through)
  except BaseException:
    nothing_kept_in_flight = False
    raise
  nothing_kept_in_flight = False


def sweep(cfg: Config, grid: dict[str, list], seeds: int, workdir: Path,
          progress: bool = True, made_by: dict | None = None) -> dict:
  """Runs the sweep; writes sweep.json (with `made_by`, the command and commit that ran it),
  curves.png and tb/<configuration>/ under workdir, which this process holds until it returns
  (a second sweep or run into it is refused)."""
  with contextlib.ExitStack() as holding:
    return _sweep(cfg, grid, seeds, workdir, progress, holding, made_by)


def _sweep(cfg, grid, seeds, workdir, progress, holding, made_by) -> dict:
  with distributed.preflight("configs, grids or workdirs") as found:
    if cfg.config != "latent":
      raise ValueError(f"this sweep runs the latent simulator, not config {cfg.config} (a "
                       "sweep over replayed conversations: rmmjax.train.replay_sweep)")
    configs = sweep_configs(cfg, grid, seeds)
    spec, sim = cfg.core_spec(), cfg.sim_spec()
    workdir = Path(workdir)
    if distributed.is_writer():  # one process at a time: the second is refused, naming it
      holding.enter_context(held(workdir, "sweep"))
    check_sweepable(workdir, cfg, grid, seeds)  # before anything is compiled or written
    devices = list(distributed.data_mesh(cfg.devices).devices.flat)  # devices=N: the first N
    found.digest = distributed.digest(cfg.to_json(), json.dumps(grid, sort_keys=True, default=str),
                                      str(seeds), str(workdir.resolve()))

  world = core.make_world(sim, spec.dim)
  hparams_C = core.stack_hparams([c.hparams() for c in configs])
  run_chunk = core.make_sweep(spec, sim, cfg.steps, cfg.eval_sessions)
  with _nothing_kept(jax.process_count() == 1):
    out = run_chunks(run_chunk, hparams_C, world, chunk_size(cfg.sweep_chunk, len(configs)),
                     devices=devices, progress=progress and distributed.is_writer())
  result = {"config": cfg.config, "steps": cfg.steps, "grid": grid, "seeds": seeds,
            "made_by": made_by or {}, "base_config": cfg.values(),
            "runs": _runs(configs, list(grid), out, cfg.log_every)[0]}
  if not distributed.is_writer():  # process 0 writes; every process returns the result
    return result
  _write(workdir, cfg, grid, seeds, configs, out, result)
  return result


def _runs(configs, keys, out, log_every) -> tuple[list[dict], dict]:
  """Each configuration's summary, and its logged rows grouped by grid point."""
  runs, by_label = [], {}
  for i, c in enumerate(configs):
    rows = window_means({k: v[i] for k, v in out["metrics"].items()}, 0, log_every)
    run = {k: get_value(c, k) for k in keys}
    run.update(seed=c.seed, recall_at_m_base=float(out["eval_first"]["recall_at_m_base"][i]),
               recall_at_m_final=float(out["eval_final"]["recall_at_m"][i]),
               recall_at_k=float(out["eval_final"]["recall_at_k"][i]))
    run["reward_first"], run["reward_last"] = first_last(rows, "reward")
    runs.append(run)
    by_label.setdefault(_label(c, keys), []).append(rows)
  return runs, by_label


def _write(workdir, cfg, grid, seeds, configs, out, result) -> None:
  workdir.mkdir(parents=True, exist_ok=True)
  write_run_record(workdir, sweep_record(grid, seeds))
  atomic_write_text(workdir / "config.json", cfg.to_json() + "\n")

  _, by_label = _runs(configs, list(grid), out, cfg.log_every)
  steps_T = np.array([r["step"] for r in next(iter(by_label.values()))[0]])
  curves, tb_runs = {}, {}
  for label, seed_rows in by_label.items():
    curves[label] = {m: np.array([[r[m] for r in rows] for rows in seed_rows])
                     for m in seed_rows[0][0] if m != "step"}
    tb_runs[label.replace("/", "_")] = [
        {"step": int(s), **{m: float(v[:, t].mean()) for m, v in curves[label].items()}}
        for t, s in enumerate(steps_T)]
  # A fresh tb/ each time: the same sweep run again leaves no second copy of its points.
  tensorboard.rewrite(workdir / "tb", tb_runs, prefix=f"seed_mean_of_{seeds}")
  plots.plot_curves(workdir / "curves.png", steps_T, curves,
                    title=f"sweep: {len(by_label)} configurations x {seeds} seeds, "
                          f"{cfg.steps} steps")
  atomic_write_json(workdir / "sweep.json", result)
