"""Export a trained reranker for serving: safetensors weights whose header holds the description
(variant, shapes, hyperparameters, batch, and the record of what it was trained on), plus a
readable JSON copy of that description beside it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import jax
import numpy as np
from safetensors.numpy import save_file

from rmmjax import core
from rmmjax.config import SWEEPABLE, get_value
from rmmjax.io.checkpoint import Checkpointer
from rmmjax.io.reranker_format import (FORMAT_VERSION, HEADER_KEY, RANK_PRIOR_FORMULA,
                                       SCORE_FORMULAS, check_weights)
from rmmjax.io.workdir import atomic_write_json, read_config

RECORD_FILE = "record.json"  # what a training workdir's reranker was trained on


def flatten_params(params: dict, prefix: str = "") -> dict[str, np.ndarray]:
  """{"q_mlp": {"w1": x}} -> {"q_mlp/w1": x} (names as a serving system sees them)."""
  flat = {}
  for name, value in params.items():
    if isinstance(value, dict):
      flat.update(flatten_params(value, f"{prefix}{name}/"))
    else:
      flat[f"{prefix}{name}"] = np.ascontiguousarray(np.asarray(value, np.float32))
  return flat


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


def describe(cfg, record: dict, step: int) -> dict:
  """The description an export carries: enough to score, evaluate and keep training."""
  return _description(cfg.core_spec(), {name: get_value(cfg, name) for name in SWEEPABLE},
                      record, step)


def _description(spec: core.CoreSpec, hparams: dict, record: dict, step: int) -> dict:
  return {"format_version": FORMAT_VERSION, "variant": spec.variant, "dim": spec.dim,
          "hidden": spec.hidden if spec.variant == "mlp" else None, "k": spec.k, "m": spec.m,
          "batch": spec.batch, "rank_prior": spec.rank_prior, "step": step,
          "hparams": hparams,
          "score": SCORE_FORMULAS[spec.variant] + (RANK_PRIOR_FORMULA if spec.rank_prior else ""),
          "selection": "serve the top m by score; sample with Gumbel noise on score / tau",
          "record": record}


def _check_out(out: Path) -> Path:
  out = Path(out)
  if out.suffix != ".safetensors":
    raise ValueError(f"--out {out}: expected a file name ending in .safetensors")
  if out.is_dir():
    raise ValueError(f"--out {out} is a directory; expected a file name ending in .safetensors")
  return out


def export_reranker(workdir: Path, out: Path) -> dict:
  """Writes OUT (.safetensors, description in its header) and OUT with .json (a readable copy);
  returns the description."""
  out = _check_out(out)
  params, cfg, step = load_trained_params(workdir)
  meta = describe(cfg, read_record(workdir), step)
  _write(params, meta, out, f"{workdir} (step {step})")
  return meta


def export_state(state: core.TrainState, out: str | Path, record: dict | None = None) -> dict:
  """Writes a TrainState held in memory (a run driven from Python) as an exported reranker,
  the same file `rmmjax export` writes: load it with NumpyReranker or --reranker. `record` says
  what it was trained on (eval and the agent check it: pass the units, retriever, encoder and
  trained conversations of real data); by default it records nothing real was seen."""
  out = _check_out(out)
  hparams = jax.device_get(state.hparams)
  values = {"tau": float(hparams.tau), "baseline": float(hparams.baseline),
            "baseline_kind": core.BASELINE_KINDS[int(hparams.baseline_kind)],
            "lr": float(hparams.lr), "seed": int(hparams.seed), "p_rel": float(hparams.p_rel),
            "p_irr": float(hparams.p_irr)}
  record = record if record is not None else {
      "kind": "in memory", "dataset": None, "units": None, "retriever": None,
      "encoder": None, "k": state.spec.k, "m": state.spec.m, "dim": state.spec.dim,
      "trained_conversations": [], "heldout_conversations": []}
  step = int(state.step)
  meta = _description(state.spec, values, record, step)
  _write(jax.device_get(state.params), meta, out, f"the state of step {step}")
  return meta


def _write(params: dict, meta: dict, out: Path, where: str) -> None:
  flat = flatten_params(params)
  check_weights(flat, meta, where)
  out.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
  os.close(fd)
  try:
    save_file(flat, tmp, metadata={HEADER_KEY: json.dumps(meta, sort_keys=True)})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, out)
  except BaseException:
    Path(tmp).unlink(missing_ok=True)
    raise
  atomic_write_json(out.with_suffix(".json"), meta)
