"""A cross reranker from its export (a CrossEncoder directory with its manifest), every file
checked against what the export wrote before it is served."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file

from rmmjax import core
from rmmjax.config import from_json
from rmmjax.encode.bert import load_params, param_at, weight_names
from rmmjax.io.manifest import RUN_FILE, read_run_record
from rmmjax.learners.cross.export import hf_name, served_files
from rmmjax.learners.cross.model import cross_params_template
from rmmjax.learners.cross.spec import cross_record, cross_spec
from rmmjax.learners.loaded import LoadedReranker


def cross_export_header(path: Path) -> dict:
  """An exported cross reranker's manifest, checked for what serving it needs."""
  where = Path(path) / RUN_FILE
  header = read_run_record(path) or {}
  config, record = header.get("config"), header.get("record")
  if not isinstance(config, dict) or not isinstance(record, dict) or not isinstance(
      header.get("rank_bias"), list) or not isinstance(header.get("served_files"), dict):
    raise ValueError(f"{where} is not an rmmjax cross export with the run's config, record, "
                     "rank_bias and served files: export the training workdir again, or give it "
                     "as --reranker")
  cross = cross_record(record, where, "export the training workdir again", "manifest's record")
  bias = header["rank_bias"]
  if not all(isinstance(b, (int, float)) and math.isfinite(b) for b in bias):
    raise ValueError(f"{where}: rank_bias holds a value that is not a finite number")
  # The manifest must agree with itself: the pair length and units the reranker trained with.
  section = config.get("cross") if isinstance(config.get("cross"), dict) else {}
  for what, value, want in (("max_length", header.get("max_length"), cross["max_length"]),
                            ("config.cross.max_length", section.get("max_length"),
                             cross["max_length"]),
                            ("config.units", config.get("units"), record.get("units")),
                            ("config.k", config.get("k"), len(bias))):
    if value != want:
      raise ValueError(f"{where}: {what} is {value!r}, but the record says {want!r}: the file "
                       "was edited or damaged; export the training workdir again")
  return header


def _check_tensors(path: Path, weights: dict, bert: core.BertConfig) -> None:
  """Refuses a missing, misshapen or non-finite tensor of the encoder, pooler or head."""
  shapes = jax.eval_shape(lambda: cross_params_template(bert, 1))["encoder"]
  where = path / "model.safetensors"
  for at, name, transposed in weight_names(bert, head=True):
    name, shape = hf_name(name), tuple(param_at(shapes, at).shape[::-1 if transposed else 1])
    value = weights.get(name)
    if value is None:
      raise ValueError(f"{where}: no {name} (not a cross reranker's export of this encoder); "
                       "export the training workdir again")
    if value.shape != shape:
      raise ValueError(f"{where}: {name} has shape {value.shape}, the header's encoder needs "
                       f"{shape}; export the training workdir again")
    if not np.all(np.isfinite(value)):
      raise ValueError(f"{where}: {name} holds values that are not finite; export the training "
                       "workdir again")


def load_cross_export(path: Path) -> LoadedReranker:
  """A cross reranker from its export (weights from model.safetensors, the rest its manifest)."""
  path = Path(path)
  header = cross_export_header(path)
  try:
    cfg = from_json(json.dumps(header["config"]))
  except (TypeError, ValueError) as err:
    raise ValueError(f"{path / RUN_FILE}: its config is not an rmmjax config ({err})") from None
  bert = core.BertConfig.from_dict(header["record"]["cross"]["bert"])
  recorded, now = header["served_files"], served_files(path)
  changed = sorted(name for name in set(recorded) | set(now) if recorded.get(name) != now.get(name))
  if changed:
    raise ValueError(f"{path}: {', '.join(changed)} changed since the export wrote "
                     f"{'them' if len(changed) > 1 else 'it'} (sentence-transformers builds the "
                     "served model from these files, rmmjax from its manifest: they would serve "
                     "different scores); export the training workdir again")
  try:
    weights = load_file(str(path / "model.safetensors"))
  except SafetensorError as err:
    raise ValueError(f"{path / 'model.safetensors'} cannot be read ({err}): the export is "
                     "damaged; export the training workdir again") from None
  _check_tensors(path, weights, bert)
  encoder = load_params(path, bert, head=True)
  rank_bias = jnp.asarray(header["rank_bias"], jnp.float32)  # (its length is k: checked above)
  return LoadedReranker(str(path), {"encoder": encoder, "rank_bias": rank_bias},
                        cross_spec(cfg, bert), cfg.hparams(), header["record"],
                        header["record"].get("step"), cfg.steps)
