"""The embedding rerankers' export for serving: safetensors weights whose header holds the
description (`_description`), and a readable JSON copy of it beside them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
from flax import traverse_util
from safetensors.numpy import save_file

from rmmjax import core
from rmmjax.config import SWEEPABLE, get_value
from rmmjax.io.outputs import check_output_file
from rmmjax.io.trained import load_trained_params, read_record
from rmmjax.io.workdir import atomic_path, atomic_write_json, read_config
from rmmjax.learners.embedding.format import (FORMAT_VERSION, HEADER_KEY, RANK_PRIOR_FORMULA,
                                              SCORE_FORMULAS, check_weights)
from rmmjax.learners.embedding.model import EMBEDDING

EXPORT_NAME = "reranker.safetensors"  # its name in a two-stage export


def export_run(workdir: Path, out: Path) -> str:
  """The workdir's reranker as the safetensors file `out`; says what was written."""
  check_output_file(out, "--out")
  meta = export_reranker(Path(workdir), out)
  return (f"wrote {out} (description in its header) and {out.with_suffix('.json')} (a readable "
          "copy)\n" + json.dumps({k: v for k, v in meta.items() if k != "record"}, indent=2))


def _description(spec: core.CoreSpec, hparams: dict, record: dict, step: int) -> dict:
  """The description an export carries: enough to score, evaluate and keep training."""
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
  return out


def export_reranker(workdir: Path, out: Path) -> dict:
  """Writes OUT (.safetensors) and its .json copy of the header; returns the description."""
  out = _check_out(out)
  spec = dataclasses.replace(read_config(workdir).core_spec(), model=EMBEDDING)
  params, cfg, step = load_trained_params(workdir, spec)
  meta = _description(cfg.core_spec(), {name: get_value(cfg, name) for name in SWEEPABLE},
                      read_record(workdir), step)
  _write(params, meta, out, f"{workdir} (step {step})")
  return meta


def export_state(state: core.TrainState, out: str | Path, record: dict | None = None) -> dict:
  """Writes a TrainState held in memory as the file `rmmjax export` writes. `record` says what
  it was trained on (eval and the agent check it: pass the units, retriever, encoder and
  trained conversations of real data); by default it records nothing real was seen."""
  out = _check_out(out)
  hparams = jax.device_get(state.hparams)
  values = {f.name: getattr(hparams, f.name).item() for f in dataclasses.fields(hparams)}
  values["baseline_kind"] = core.BASELINE_KINDS[values["baseline_kind"]]
  record = record if record is not None else {
      "kind": "in memory", "dataset": None, "units": None, "retriever": None,
      "encoder": None, "k": state.spec.k, "m": state.spec.m, "dim": state.spec.dim,
      "trained_conversations": [], "heldout_conversations": []}
  step = int(state.step)
  meta = _description(state.spec, values, record, step)
  _write(jax.device_get(state.params), meta, out, f"the state of step {step}")
  return meta


def _write(params: dict, meta: dict, out: Path, where: str) -> None:
  # {"q_mlp": {"w1": x}} -> {"q_mlp/w1": x}: names as a serving system sees them.
  flat = {name: np.ascontiguousarray(np.asarray(value, np.float32))
          for name, value in traverse_util.flatten_dict(params, sep="/").items()}
  check_weights(flat, meta, where)
  with atomic_path(out) as tmp:
    save_file(flat, str(tmp), metadata={HEADER_KEY: json.dumps(meta, sort_keys=True)})
  atomic_write_json(out.with_suffix(".json"), meta)
