"""What a training workdir holds for every learner: the record of what it trained on
(record.json) and its newest checkpointed parameters."""

from __future__ import annotations

import json
from pathlib import Path

import jax

from rmmjax import core
from rmmjax.io.checkpoint import Checkpointer
from rmmjax.io.workdir import read_config

RECORD_FILE = "record.json"  # what a training workdir's reranker was trained on


def read_record(workdir: Path) -> dict:
  path = Path(workdir) / RECORD_FILE
  if not path.exists():
    if (Path(workdir) / "query_encoder" / "config.json").exists():
      raise FileNotFoundError(f"{workdir} is a learner=both run that stopped in its first stage "
                              f"(its query encoder, in {Path(workdir) / 'query_encoder'}): run "
                              "the same train command again to finish it")
    if not (Path(workdir) / "config.json").exists():
      raise FileNotFoundError(f"{workdir} holds no trained model (no {RECORD_FILE}, no "
                              "config.json): expected a training workdir or an export")
    raise FileNotFoundError(f"{path} does not exist: {workdir} was trained by an older rmmjax "
                            "that did not record what it trained on; train it again")
  try:
    record = json.loads(path.read_text())
  except ValueError as err:
    raise ValueError(f"{path} is not valid JSON ({err}); the workdir is damaged: train it "
                     "again") from None
  if not isinstance(record, dict):
    raise ValueError(f"{path} holds a {type(record).__name__}, not a record of what the run "
                     "trained on; the workdir is damaged: train it again")
  return record


def load_trained_params(workdir: Path, spec: core.CoreSpec | None = None,
                        template: dict | None = None) -> tuple[dict, "object", int]:
  """The newest checkpointed parameters of a training workdir, with its config and step.
  `spec` and `template` (parameters in the checkpoint's structure) are the run's learner's:
  by default an embedding reranker's, whose identity initialisation has the structure."""
  cfg = read_config(workdir)
  if cfg.learner == "query_encoder":
    raise ValueError(f"{workdir} tuned a query encoder (learner=query_encoder), not a reranker")
  checkpoints = Path(workdir) / "checkpoints"
  checkpointer = Checkpointer(checkpoints, read_only=True)  # creates nothing
  try:
    state = core.init_state(spec or cfg.core_spec(), cfg.hparams(), template)
    step, state, _ = checkpointer.restore_latest(state)  # the newest that reads back
  finally:
    checkpointer.close()
  if state is None:
    raise FileNotFoundError(f"{checkpoints} holds no readable checkpoint: {workdir} holds no "
                            "trained reranker")
  return jax.device_get(state.params), cfg, step
