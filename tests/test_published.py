"""Every published results table still describes what its command runs: each recorded command
(experiments/results/NAME.config.json, see experiments/published.py) is resolved again at this
checkout's code, without training, and must give every run the configuration it recorded, key
by key; a command printed in a table must resolve to the same runs. A default that moves under a
published row fails here, naming the row's file, the run and the key."""

import importlib
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"
TABLES = sorted(RESULTS.glob("*.md"))


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch, locomo_path):
  # The commands read the dev file (a run's checks need it), named relative to the
  # repository's root, where the scripts run.
  monkeypatch.chdir(ROOT)
  monkeypatch.syspath_prepend(str(ROOT / "experiments"))


def _published():
  return importlib.import_module("published")


def test_every_results_table_records_the_runs_behind_it():
  missing = [t.name for t in TABLES if not t.with_suffix(".config.json").exists()]
  assert not missing, f"tables without a record of their runs: {missing}"


@pytest.mark.parametrize("table", TABLES, ids=[t.stem for t in TABLES])
def test_a_published_command_runs_the_configuration_it_recorded(table):
  published = _published()
  recorded = published.read_record(table)
  script = importlib.import_module(recorded["script"])
  now = published.resolved(script.configs(recorded["argv"]))
  problems = published.differences(recorded, now)
  assert not problems, (f"{table.name}: `{recorded['command']}` would now run another "
                        "configuration than its table's (rerun it, or pin the old value):\n  "
                        + "\n  ".join(problems[:20]))


SWEEP_COMMANDS = [(t, c) for t in TABLES for c in re.findall(r"^`(rmmjax sweep [^`]*)`",
                                                              t.read_text(), re.M)]


@pytest.mark.parametrize("table, command", SWEEP_COMMANDS,
                         ids=[t.stem for t, _ in SWEEP_COMMANDS])
def test_the_sweep_command_a_table_prints_runs_what_it_recorded(table, command):
  published = _published()
  # (the printed commands name the dev file where it lies beside the repository)
  command = command.replace("data=../shared/data/locomo/locomo_dev8.json", "data=DATA")
  now = published.resolved(published.command_runs(command))
  recorded = published.read_record(table)
  prefix = f"{recorded['argv'][1]}: " if recorded["script"] == "sweep_rerankers" else ""
  runs = {label.removeprefix(prefix): diff for label, diff in recorded["runs"].items()
          if label.startswith(prefix)}
  mine = published.differences({"base": recorded["base"], "runs": runs}, now)
  assert not mine, f"{table.name} prints a command that runs otherwise:\n  " + "\n  ".join(mine[:20])


def test_the_commands_whose_figures_the_docs_print_run_what_they_recorded():
  """The README's and docs' commands beside no results table (make demo, the locomo linear
  reranker, the locomo_cross config): resolved now, against results/published_commands."""
  published = _published()
  recorded = json.loads((RESULTS / published.COMMANDS_RECORD).read_text())
  now = published.commands_record()
  assert set(recorded) == set(now), "the published commands and their record differ"
  problems = [f"{label}: {line}" for label in now
              for line in published.differences(recorded[label], now[label])]
  assert not problems, "\n  ".join(["a published command now runs otherwise:", *problems])


def test_a_moved_default_is_named_with_the_run_and_the_key(monkeypatch):
  """The check itself, on a real table's record and the real resolution: the locomo config's
  running-baseline decay, which the cross sweep's command does not name, moved."""
  import dataclasses  # noqa: PLC0415

  from rmmjax import config  # noqa: PLC0415
  published = _published()
  recorded = published.read_record(RESULTS / "sweep_cross.md")
  monkeypatch.setitem(config.CONFIGS, "locomo",
                      dataclasses.replace(config.CONFIGS["locomo"], running_decay=0.9))
  moved = published.resolved(importlib.import_module("sweep_cross").configs(recorded["argv"]))
  assert published.differences(recorded, moved) == [
      f"run {label!r}: running_decay recorded 0.99, now 0.9" for label in sorted(recorded["runs"])]
