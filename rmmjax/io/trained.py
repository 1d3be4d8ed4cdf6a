"""What a training workdir holds for every learner: the record of what it trained on
(record.json), its newest checkpointed parameters, and what an export of it says of itself."""

from __future__ import annotations

import json
from pathlib import Path

import jax

from rmmjax import core
from rmmjax.io.checkpoint import Checkpointer
from rmmjax.io.manifest import RECORD_FILE, read_json, read_run_record
from rmmjax.io.workdir import read_config


def read_record(workdir: Path) -> dict:
  path = Path(workdir) / RECORD_FILE
  if not path.exists():  # (a run writes it beside its manifest and config.json)
    raise FileNotFoundError(f"{workdir} holds no {RECORD_FILE} (what its model trained on): "
                            "expected a training workdir or an export")
  record = read_json(path, "the workdir is damaged: train it again")
  if not isinstance(record, dict):
    raise ValueError(f"{path} holds a {type(record).__name__}, not a record of what the run "
                     "trained on; the workdir is damaged: train it again")
  return record


def export_manifest(workdir: Path) -> dict:
  """The manifest of an export of a training workdir (less its format, which writing adds)."""
  run = read_run_record(workdir)
  return {"kind": "export", "learner": run["learner"], "stages": run["stages"],
          "record": read_record(workdir), "config": json.loads(read_config(workdir).to_json())}


def newest_state(workdir: Path, template, what: str) -> tuple[int, "object"]:
  """(step, state) of a workdir's newest checkpoint that reads back into `template`'s
  structure, refused when none does (`what`: what the workdir should hold)."""
  checkpoints = Path(workdir) / "checkpoints"
  checkpointer = Checkpointer(checkpoints, read_only=True)  # creates nothing
  try:
    step, state, _ = checkpointer.restore_latest(template)
  finally:
    checkpointer.close()
  if state is None:
    raise FileNotFoundError(f"{checkpoints} holds no readable checkpoint: {workdir} holds no "
                            f"{what}")
  return step, state


def load_trained_params(workdir: Path, spec: core.CoreSpec,
                        template: dict | None = None) -> tuple[dict, "object", int]:
  """The newest checkpointed parameters of a training workdir, with its config and step;
  `template`: parameters in the checkpoint's structure (None: the spec's model's initial ones)."""
  cfg = read_config(workdir)  # (a reranker's: its learner's export or loader reached here)
  step, state = newest_state(workdir, core.init_state(spec, cfg.hparams(), template),
                             "trained reranker")
  return jax.device_get(state.params), cfg, step
