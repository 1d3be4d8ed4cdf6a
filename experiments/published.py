"""What a results file records of the runs behind it, so that a default moving under a published
row is noticed.

Beside each results table `results/NAME.md` lies `results/NAME.config.json`: the script command
that made the table and the fully resolved configuration of every run it made (every key, the
defaults included): `base`, the first run's, and each run's keys where they differ from it. Each
script that trains has `configs(argv) -> {run label: Config}`, the configurations its command
line trains, resolved without training; tests/test_published.py resolves every recorded command
again at the checkout's code and fails, naming the run and the key, where it would now run
another configuration. A changed default then fails until the rows are rerun or their commands
pin the old value.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from replay_common import DATA_DIR, RESULTS

SUFFIX = ".config.json"
DATA = "$RMMJAX_DATA"  # how a record names the data folder (../shared/data by default)


def record_path(table: Path) -> Path:
  return Path(table).with_suffix(SUFFIX)


def _spelled(values: dict) -> dict:
  """A run's values with its data file named relative to the data folder, wherever the script
  ran (a different file is still a different value)."""
  data = values.get("data")
  if data:
    path = Path(data).resolve()
    if path.is_relative_to(DATA_DIR.resolve()):
      values = values | {"data": f"{DATA}/{path.relative_to(DATA_DIR.resolve())}"}
  return values


def resolved(configs: dict) -> dict:
  """{"base": every key of the first run, "runs": {label: its keys that differ from base}}."""
  runs = {label: _spelled(cfg.values()) for label, cfg in configs.items()}
  base = next(iter(runs.values()), {})
  return {"base": base,
          "runs": {label: {k: v for k, v in values.items() if k not in base or base[k] != v}
                   | {k: None for k in base.keys() - values.keys()}  # (a section it lacks)
                   for label, values in runs.items()}}


def write_record(table: Path, script: str, argv: list[str], configs: dict) -> None:
  """Writes `table`'s record: the command `python experiments/SCRIPT ARGV` and its runs."""
  record = {"script": script, "argv": list(argv),
            "command": shlex.join(["python", f"experiments/{script}.py", *argv])} | resolved(
                configs)
  # One line per run: a record of 96 runs stays readable.
  runs = ",\n".join(f"    {json.dumps(label)}: {json.dumps(diff, sort_keys=True)}"
                    for label, diff in record.pop("runs").items())
  text = json.dumps(record, indent=2, sort_keys=True)[:-2]
  record_path(table).write_text(f"{text},\n  \"runs\": {{\n{runs}\n  }}\n}}\n")


def read_record(table: Path) -> dict:
  return json.loads(record_path(table).read_text())


def run_values(record: dict) -> dict[str, dict]:
  """Every run's full configuration from a record."""
  return {label: {k: v for k, v in (record["base"] | diff).items() if v is not None}
          for label, diff in record["runs"].items()}


def differences(recorded: dict, now: dict) -> list[str]:
  """What a record's runs and the runs its command resolves to now disagree on, a line each."""
  old, new = run_values(recorded), run_values(now)
  lines = [f"run {label!r}: recorded, no longer run" for label in old if label not in new]
  lines += [f"run {label!r}: run now, not recorded" for label in new if label not in old]
  for label in set(old) & set(new):
    for key in sorted(set(old[label]) | set(new[label])):
      a, b = old[label].get(key, "(absent)"), new[label].get(key, "(absent)")
      if a != b:
        lines.append(f"run {label!r}: {key} recorded {a!r}, now {b!r}")
  return sorted(lines)


def sweep_command_runs(command: list[str]) -> dict:
  """The runs of an `rmmjax sweep` command line (without `rmmjax`), resolved by the command
  line's own parser and the sweep's own resolution."""
  from rmmjax.cli.main import build_parser  # noqa: PLC0415
  from rmmjax.cli.training import sweep_runs  # noqa: PLC0415
  return sweep_runs(build_parser().parse_args(command))


# Commands whose figures the README and docs print without a results table of their own: their
# resolved runs are recorded in results/COMMANDS_RECORD and checked as a table's are.
COMMANDS_RECORD = "published_commands.config.json"
COMMANDS = {
    "README: make demo": "rmmjax train --config latent --workdir checkpoints/latent",
    "docs/command-line.md: the linear reranker on the dev file (0.566)":
        "rmmjax train --config locomo --set data=DATA --set learner=linear "
        "--set retriever=bm25 --workdir W",
    "README: the locomo_cross config (the k50-observations-prior0 arm's 0.711)":
        "rmmjax train --config locomo_cross --set data=DATA --workdir W",
}


def command_runs(command: str) -> dict:
  """The configuration an `rmmjax train` or `rmmjax sweep` command line runs (DATA: the dev
  file), resolved by the command line's own parser without running it."""
  from rmmjax.cli.main import build_parser  # noqa: PLC0415
  from rmmjax.config import apply_overrides, get_config  # noqa: PLC0415
  argv = shlex.split(command.replace("data=DATA", f"data={relative_data()}"))[1:]
  if argv[0] == "sweep":
    return sweep_command_runs(argv)
  args = build_parser().parse_args(argv)
  return {"train": apply_overrides(get_config(args.config), args.set or []).validate()}


def commands_record() -> dict:
  """Every published command's runs, {command label: resolved(runs)}."""
  return {label: resolved(command_runs(command)) for label, command in COMMANDS.items()}


def relative_data() -> str:
  """The dev file's path relative to where the script runs (a command names no machine path)."""
  return os.path.relpath(DATA_DIR / "locomo" / "locomo_dev8.json")


__all__ = ["RESULTS", "SUFFIX", "differences", "read_record", "record_path", "relative_data",
           "resolved", "run_values", "sweep_command_runs", "write_record", "COMMANDS",
           "commands_record", "command_runs"]
