"""A sweep's grid: `--grid` parsed and checked, its configurations (grid point x seed), and
their names (a row's label, a run's recorded settings)."""

from __future__ import annotations

import itertools
import json
import re

from rmmjax.config import SWEEPABLE, Config, get_value, parse_value, qualified, with_values
from rmmjax.learners.embedding.config import Reranker

# A replay sweep's configurations also vary their pretraining's rates in the one program.
REPLAY_SWEEPABLE = ("pretrain_lr", "pretrain_tau")
# Keys a replay sweep holds fixed: what learns, on which data, how it is held out and measured.
# (and the latent simulator's keys, which a replay does not read, and the encoder's width).
FIXED_IN_A_SWEEP = ("config", "data", "dataset", "learner", "units", "retriever",
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
  # (a key its learner reads only in some runs: the MLP's hidden width)
  return next(filter(None, (one.unread(name, cfg) for one in learnings)), "")


def parse_grid(items: list[str], cfg: Config) -> dict[str, list]:
  """["tau=0.1,0.5", "baseline=0,0.5"] -> {"tau": [0.1, 0.5], "baseline": [0.0, 0.5]}."""
  grid = {}
  for item in items:
    key, equals, text = (s.strip() for s in item.partition("="))
    if not equals or any(not v.strip() for v in text.split(",")):
      raise ValueError(f"--grid {item!r}: expected key=v1,v2,... (no value empty)")
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
        raise ValueError(f"--grid point {label(settings(point, keys))}: {error}") from None
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


def shares_a_program(cfg: Config, grid: dict) -> bool:
  """Whether every configuration of a replay sweep runs in one compiled program per fold: the
  embedding reranker's alone (no stage before it), with a grid over its rates."""
  return (cfg.section_names() == (Reranker.NAME,)
          and all(k.rpartition(".")[2] in SWEEPABLE + REPLAY_SWEEPABLE for k in grid))


def settings(cfg: Config, keys) -> dict:
  """The grid's keys' values of one configuration."""
  return {k: get_value(cfg, k) for k in keys}


def label(settings: dict) -> str:
  """A grid point as a row of the table names it."""
  return ",".join(f"{k}={v}" for k, v in settings.items()) or "default"


def run_settings(cfg: Config) -> dict:
  """Every key of a run as its files record it (as JSON reads it back; without the data file,
  whose content is what counts: moved elsewhere, it is the same run)."""
  return json.loads(json.dumps({k: v for k, v in cfg.values().items() if k != "data"},
                               default=str))
